"""The job's optimizer: `[optimizer] name` (TorchTitan's Adam and AdamW, or LORO, the
low-rank Riemannian optimizer of `boost_titan.optim`), LORO's `[boost]` settings, and the
jobs LORO cannot keep exact, refused in one line (`check` and the worker call
`check_optimizer`). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from boost_titan.config.errors import ConfigError

OptimizerName = Literal["Adam", "AdamW", "LORO"]
"""TorchTitan's builders' names, and LORO (`runtime.optimizers`)."""
OPTIMIZERS: tuple[str, ...] = get_args(OptimizerName)
LORO = "LORO"
LORO_MODELS = ("boost_llama", "hf")
"""The families whose TrainSpec builds LORO (their `build_optimizers_fn`)."""


@dataclass(frozen=True)
class LoroSettings:
    """LORO's `[boost]` settings, as the optimizer takes them."""

    exact_every: int
    rewarm_steps: int
    approx_scale: float | None
    """None: r / hidden size per pair (`[boost] loro_approx_scale = 0`)."""

    @classmethod
    def of(cls, boost) -> LoroSettings:
        return cls(boost.loro_exact_every, boost.loro_rewarm_steps, boost.loro_approx_scale or None)


def _refusals(job) -> dict[str, bool]:
    """Why LORO cannot be exact on `job`, by the setting that asks (each a reason)."""
    arch = job.boost.arch
    return {
        f"model.name {job.model.name!r} (LORO is built by {', '.join(LORO_MODELS)})": (
            job.model.name not in LORO_MODELS
        ),
        "[boost] arch fullrank (no low-rank pairs to retract)": arch == "fullrank",
        f"[boost] arch {arch} (the exact step re-balances B M, M^-1 A, which changes a model "
        "with an activation or crossing between the factors)": arch in ("cola", "lax"),
        "optimizer.early_step_in_backward (the exact step needs every pair's two "
        "directions at once)": job.optimizer.early_step_in_backward,
        f"training.dtype {job.training.dtype} (LORO updates fp32 master factors)": (
            job.training.dtype != "float32"
        ),
        "training.enable_cpu_offload (the exact step gathers factors on the compute "
        "device)": job.training.enable_cpu_offload,
        f"model.converters {job.model.converters} (float8 and other converters are "
        "untested with the exact step)": bool(job.model.converters),
    }


def check_optimizer(job) -> None:
    """ConfigError (one line) for an unknown `[optimizer] name`, or LORO on a job it cannot
    keep exact (`_refusals`)."""
    name = job.optimizer.name
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer.name {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    if name != LORO:
        return
    refused = [why for why, on in _refusals(job).items() if on]
    if refused:
        raise ConfigError(
            f"optimizer.name LORO cannot run with {refused[0]}; change that setting or use "
            "--optimizer.name AdamW (LORO trains arch svd in fp32 master weights)"
        )


__all__ = ["LORO", "OPTIMIZERS", "LoroSettings", "check_optimizer"]
