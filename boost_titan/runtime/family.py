"""`ModelFamily`: what a model family of the recipe gives the checks before launch, besides
its TrainSpec. A family's package defines one (`<package>/family.py`, `FAMILY`), and
`boost_titan.job.families` lists them: the one place the job room reaches a family, so a
second family gets the same checks as `boost_llama` (or says, in its hooks, what it does
not check). A TrainSpec without a family (TorchTitan's own models, a user's
`custom_import`) gets TorchTitan's construction checks only (`job.construction`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _nothing(*_: Any) -> None:
    """A hook with nothing to check."""


@dataclass(frozen=True)
class ModelFamily:
    """A model family's hooks (each takes the parsed job; imports stay inside them, so the
    list of families loads without torch)."""

    name: str
    """`model.name` of its TrainSpec."""
    register: Callable[[], None]
    """Register its TrainSpec with TorchTitan (once per process)."""
    validate_job: Callable[[Any, int], None]
    """ConfigError for a model, parallelism or validation setting it cannot train on
    `world` processes, before any process group exists."""
    vocab_size: Callable[[Any], int]
    """The job's embedding rows (prepared data is checked against them)."""
    describe: Callable[[Any], str]
    """The job's model in one phrase, e.g. `debug, arch cola, rank 16, vocab 4096`."""
    layout: Callable[[Any], str]
    """What `check`'s summary adds after the model's name, e.g. ` (cola, tp_strategy auto
    -> btp)`."""
    saved_with: str
    """What a checkpoint of another model must be trained with instead."""
    check_export_folder: Callable[[str], None] = _nothing
    """`checkpoint.initial_load_in_hf`'s folder holds a readable export."""
    check_initial_export: Callable[[Any], None] = _nothing
    """That export holds exactly the job's model."""


def spec_hooks(spec_module: str) -> dict[str, Callable]:
    """The hooks a family's spec module gives alike (`register_spec()`, `validate_job(job,
    world)`, `job_args(job).vocab_size`), that module imported at the first call (it loads
    torch): `ModelFamily(name=..., **spec_hooks("pkg.spec"), ...)`."""

    def spec() -> Any:
        return importlib.import_module(spec_module)

    return {
        "register": lambda: spec().register_spec(),
        "validate_job": lambda job, world: spec().validate_job(job, world),
        "vocab_size": lambda job: spec().job_args(job).vocab_size,
    }


__all__ = ["ModelFamily", "spec_hooks"]
