"""The architecture registry: one `Architecture` object per projection family, the one
place the model, its plans, its export format, the benchmarks and the performance model
ask what an `arch` means (loads without torch).

The built-in families are the values of `boost_titan.config.Arch` (the `[boost] arch`
choices), each the `ARCH` of the module of its name here; adding one is a module and
its name in that `Literal`. `register` adds a family from outside the package (a test,
a user's script building `BoostTransformer` itself).
"""

from __future__ import annotations

import importlib
from typing import get_args

from boost_titan.config import Arch
from boost_titan.config.errors import ConfigError

from .base import Architecture

ARCHITECTURES: dict[str, Architecture] = {}


def register(arch: Architecture) -> Architecture:
    """Add `arch` under its name; ValueError for a name another family holds."""
    held = ARCHITECTURES.setdefault(arch.name, arch)
    if held is not arch:
        raise ValueError(f"arch {arch.name!r} is registered already ({held.summary})")
    return arch


def architecture(name: str) -> Architecture:
    """The family registered as `name`; ConfigError (one line) for an unknown name."""
    if name not in ARCHITECTURES:
        raise ConfigError(
            f"unknown [boost] arch {name!r}; choose one of {', '.join(ARCHITECTURES)}"
        )
    return ARCHITECTURES[name]


for _name in get_args(Arch):
    register(importlib.import_module(f"{__name__}.{_name}").ARCH)

__all__ = ["ARCHITECTURES", "Architecture", "architecture", "register"]
