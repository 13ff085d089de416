"""Which projections of a sharded model run their GEMMs in float8.

`apply_float8` turns float8 on for a model after `apply_plan` (each style's GEMMs then
take the recipe) or for an unsharded model (its nn.Linear modules become torchao's
`Float8Linear`). Judged on the GEMM each rank really multiplies (its local weight shard; a group's
concatenated weight when its members run as one GEMM), with TorchTitan's filters:
both dims multiples of 16 always, `filter_fqns` by substring of the FQN, and torchao's
small-GEMM filter when `filter_fqns` holds `auto_filter_small_kn`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import nn

from boost_titan.kernels.float8 import (
    ALIGNMENT,
    AUTO_FILTER_RECIPES,
    RECIPES,
    Float8,
    below_auto_threshold,
    float8_linear,
)

from .styles import Gemm, applied_style

AUTO_FILTER_FLAG = "auto_filter_small_kn"
"""TorchTitan's `filter_fqns` entry that turns on torchao's small-GEMM filter."""

__all__ = [
    "AUTO_FILTER_FLAG",
    "RECIPES",
    "Float8Selection",
    "apply_float8",
    "gemm_skip_reason",
    "group_skip_reason",
]


def gemm_skip_reason(
    out_features: int, in_features: int, fqn: str, recipe: str, filter_fqns: Sequence[str]
) -> str | None:
    """None when a per-rank GEMM weight of shape [out_features, in_features] (N, K) of
    module `fqn` runs in float8 under `recipe`; else a short reason. Raises ValueError for
    a recipe outside RECIPES, or `auto_filter_small_kn` with a recipe torchao has no
    thresholds for."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown float8 recipe {recipe!r}; choose one of {', '.join(RECIPES)}")
    auto = AUTO_FILTER_FLAG in filter_fqns
    if auto and recipe not in AUTO_FILTER_RECIPES:
        raise ValueError(
            f"{AUTO_FILTER_FLAG} has no thresholds for recipe {recipe} in torchao; "
            f"use {' or '.join(AUTO_FILTER_RECIPES)}, or drop {AUTO_FILTER_FLAG}"
        )
    if _named_by_filter(fqn, filter_fqns):
        return "in filter_fqns"
    for name, size in (("N", out_features), ("K", in_features)):
        if size % ALIGNMENT:
            return f"{name} {size} is not a multiple of {ALIGNMENT}"
    if auto and below_auto_threshold(recipe, out_features, in_features):
        return f"below torchao's {recipe} size threshold"
    return None


def _named_by_filter(fqn: str, filter_fqns: Sequence[str]) -> bool:
    """`filter_fqns` names module `fqn` (by substring, as TorchTitan matches it)."""
    return any(f in fqn for f in filter_fqns if f != AUTO_FILTER_FLAG)


def group_skip_reason(
    out_features: int,
    in_features: int,
    fqns: Sequence[str],
    recipe: str,
    filter_fqns: Sequence[str],
) -> str | None:
    """`gemm_skip_reason` for one GEMM that computes several modules at once (a group's
    concatenated weight, [sum of out_features, in_features] per rank). It is one GEMM, so
    one precision: if `filter_fqns` names any member, the whole GEMM stays in high
    precision (the filter asks for high precision and splitting the GEMM would undo the
    grouping)."""
    if len(fqns) > 1 and any(_named_by_filter(f, filter_fqns) for f in fqns):
        return "grouped with a module in filter_fqns"
    return gemm_skip_reason(out_features, in_features, fqns[0], recipe, filter_fqns)


@dataclass
class Float8Selection:
    """What `apply_float8` chose: the GEMMs in float8 and the others by reason."""

    f8: Float8
    chosen: list[Gemm] = field(default_factory=list)
    skipped: dict[str, list[Gemm]] = field(default_factory=dict)

    @property
    def projections(self) -> tuple[int, int]:
        """(modules whose GEMM runs in float8, all weight modules)."""
        chosen = sum(len(g.fqns) for g in self.chosen)
        return chosen, chosen + sum(len(g.fqns) for gs in self.skipped.values() for g in gs)

    @property
    def float8_gemms(self) -> int:
        """float8 GEMMs per forward and backward (3 per chosen GEMM weight; 2 when the
        recipe keeps weight grads in high precision)."""
        return len(self.chosen) * self.f8.float8_gemms

    def reasons(self) -> str:
        """Why the high-precision GEMMs are, with the number of modules each: "K 344 is
        not a multiple of 16 (4), in filter_fqns (1)"."""
        return ", ".join(
            f"{reason} ({sum(len(g.fqns) for g in gemms)})"
            for reason, gemms in self.skipped.items()
        )

    def summary(self) -> str:
        """One line: `float8: N of M projections ...` and why the others are not."""
        n, m = self.projections
        line = (
            f"float8 ({self.f8.recipe}): {n} of {m} projections, as {len(self.chosen)} "
            f"GEMM weights ({self.float8_gemms} float8 GEMMs per forward-backward)"
        )
        if self.skipped:
            parts = [f"{reason}: {_pattern(gemms)}" for reason, gemms in self.skipped.items()]
            line += "; high precision: " + "; ".join(parts)
        return line


def _pattern(gemms: Sequence[Gemm]) -> str:
    """The FQNs of `gemms` with block indices folded into `*`, in first-seen order."""
    names = {re.sub(r"\.\d+(?=\.|$)", ".*", f): None for g in gemms for f in g.fqns}
    return ", ".join(names)


def apply_float8(model: nn.Module, f8: Float8, filter_fqns: Sequence[str]) -> Float8Selection:
    """Run the selected weight GEMMs of `model` in float8 with recipe `f8`.

    After `apply_plan`, each style's GEMMs (`TPStyle.gemms`: local weight shards, a
    group's stacked weights as one) are judged with `group_skip_reason` and the chosen
    ones take `f8`. nn.Linear modules no style runs (an unsharded model) are judged on
    their weights and replaced by torchao's `Float8Linear`. Raises ValueError as
    `gemm_skip_reason` does.
    """
    selection = Float8Selection(f8)

    def judge(gemm: Gemm) -> bool:
        reason = group_skip_reason(
            gemm.out_features, gemm.in_features, gemm.fqns, f8.recipe, filter_fqns
        )
        if reason is None:
            selection.chosen.append(gemm)
        else:
            selection.skipped.setdefault(reason, []).append(gemm)
        return reason is None

    swaps: list[tuple[str, nn.Linear]] = []
    for fqn, module in model.named_modules():
        style = applied_style(module)
        if style is not None:
            chosen = [judge(g) for g in style.gemms(module)]
            style.f8s = tuple(f8 if c else None for c in chosen) if any(chosen) else ()
        elif type(module) is nn.Linear and judge(Gemm((fqn,), *module.weight.shape)):
            swaps.append((fqn, module))
    for fqn, module in swaps:
        parent, _, name = fqn.rpartition(".")
        setattr(model.get_submodule(parent), name, float8_linear(module, f8))
    return selection
