"""The model families of the recipe, the one list: each family's package and its hooks
(`runtime.family.ModelFamily`). This module is the one place the job room imports a
family (tests/unit/test_architecture.py holds every other module of `job` to it), so a
family added here gets every check `boost_llama` gets. A new family: a package with its
TrainSpec and a `family.py` defining `FAMILY`, and one line below (docs/architecture.md,
"where to add")."""

from __future__ import annotations

from boost_titan.boost_llama.family import FAMILY as BOOST_LLAMA
from boost_titan.hf_family.family import FAMILY as HF
from boost_titan.runtime.family import ModelFamily

FAMILIES: dict[str, ModelFamily] = {family.name: family for family in (BOOST_LLAMA, HF)}


def register_families() -> None:
    """Register every family's TrainSpec with TorchTitan (once per process each)."""
    for family in FAMILIES.values():
        family.register()


def family_of(job) -> ModelFamily | None:
    """The job's model family; None for a TrainSpec of no family of ours (TorchTitan's
    own models, a user's), which gets TorchTitan's construction checks only."""
    return FAMILIES.get(job.model.name)


__all__ = ["FAMILIES", "family_of", "register_families"]
