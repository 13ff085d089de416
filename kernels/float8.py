"""Float8 GEMMs through torchao's primitives, for hand-written autograd functions.

The three GEMMs of a linear ``y = x W^T`` (W: [out, in]) each take an optional `Float8`
recipe; with None they are the plain torch ops (one None check), with a recipe they cast
both operands to float8 with torchao's dynamic scaling (`hp_tensor_to_float8_dynamic`,
the casts and scale axes of torchao's `matmul_with_hp_or_float8_args`) and multiply the
resulting `Float8TrainingTensor`s with `torch.mm`, which torchao dispatches to
`torch._scaled_mm` (real float8 on CUDA SM89+ and on CPU; `emulate` dequantises instead):

* `forward(x, w, f8)`     = x W^T  (input and weight in the recipe's forward dtypes)
* `input_grad(g, w, f8)`  = g W    (grad_output and weight)
* `weight_grad(g, x, f8)` = g^T x  (grad_output and input; high precision when the recipe
  keeps the weight-grad GEMM there, as rowwise_with_gw_hp does)

`linear(x, w, f8)` is all three as one autograd op (torchao's own
`matmul_with_hp_or_float8_args`), for call sites whose backward autograd derives.

Scales are amax-based over the operands each rank holds, with no collective, and that is
exact bookkeeping, not an approximation of a global scale: `_scaled_mm` applies both
operands' scales to its output, so every rank's GEMM result is already dequantised. A
row-parallel rank's partial sum x_i W_i^T (and a column-parallel rank's partial input
grad g_p W_p) is a float8 GEMM of its own shards, and the all-reduce adds dequantised
partials; a column-parallel output shard x W_p^T needs only the replicated x (the same
scale on every rank) and its own weight shard. A shard's amax is at most the full
tensor's, so local tensorwise scales are at least as fine as global ones.

torchao is imported on first use, so importing this module costs nothing when float8 is
off.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
"""torchao's float8 training recipes (TorchTitan's `[quantize.linear.float8] recipe_name`)."""

AUTO_FILTER_RECIPES = ("tensorwise", "rowwise")
"""Recipes torchao 0.18's `_auto_filter_for_recipe` has size thresholds for."""

ALIGNMENT = 16
"""Both GEMM dims of a float8 weight must be multiples of this (float8 GEMM kernels)."""


def _torchao() -> Any:
    """torchao's float8 package, imported once, with its import-time warnings (one per
    optional CUDA extension it cannot load here, one from torch's pytree) kept out of the
    run log."""
    import logging

    quiet = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in quiet]
    for log in quiet:
        log.setLevel(logging.ERROR)
    try:
        import torchao.float8 as float8
    finally:
        for log, level in zip(quiet, levels, strict=True):
            log.setLevel(level)
    return float8


def below_auto_threshold(recipe: str, out_features: int, in_features: int) -> bool:
    """True when torchao's small-GEMM filter (`_auto_filter_for_recipe`) would leave a
    linear with this weight shape in high precision (judged on a meta nn.Linear)."""
    keep = _torchao()._auto_filter_for_recipe(recipe, filter_fqns=[])
    with torch.device("meta"):
        probe = torch.nn.Linear(in_features, out_features, bias=False)
    return not keep(probe, "")


@dataclass(frozen=True)
class Operand:
    """How one GEMM operand is cast: torchao's dtype, scaling granularity and GEMM role,
    and the axis its scales run along (None: one scale); `dtype` None keeps it as is."""

    dtype: torch.dtype | None
    granularity: Any
    role: Any
    axis: int | None


@dataclass(frozen=True)
class Float8:
    """A float8 recipe as the GEMMs need it, resolved from torchao once (outside any
    compiled region): each GEMM's two operands, torchao's `LinearMMConfig` and its cast
    function. Hashable, so compiled graphs may close over it."""

    recipe: str
    emulate: bool
    input: Operand
    weight: Operand
    grad_output: Operand
    weight_for_grad_input: Operand
    grad_output_for_grad_weight: Operand
    input_for_grad_weight: Operand
    round_scales_to_power_of_2: bool
    mm_config: Any
    config: Any
    """torchao's `Float8LinearConfig` (for `Float8Linear`)."""
    to_float8: Callable[..., torch.Tensor]
    """torchao's `hp_tensor_to_float8_dynamic`."""
    matmul: Any
    """torchao's `matmul_with_hp_or_float8_args` (an autograd Function)."""

    @property
    def float8_gemms(self) -> int:
        """How many of a projection's three GEMMs run in float8 (2 when the recipe keeps
        the weight-grad GEMM in high precision)."""
        return 2 if self.input_for_grad_weight.dtype is None else 3


@functools.cache
def float8_recipe(recipe: str, emulate: bool = False) -> Float8:
    """The `Float8` of a torchao recipe name (one of RECIPES); one object per name."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown float8 recipe {recipe!r}; choose one of {', '.join(RECIPES)}")
    ao = _torchao()
    from torchao.float8._inductor_patch import _patch_inductor_min_max_codegen
    from torchao.float8.float8_linear import matmul_with_hp_or_float8_args
    from torchao.float8.float8_scaling_utils import (
        get_maybe_axiswise_dim,
        hp_tensor_to_float8_dynamic,
    )

    _patch_inductor_min_max_codegen()  # as torchao's float8 entry point does (triton#11111)
    c = dataclasses.replace(ao.Float8LinearConfig.from_recipe_name(recipe), emulate=emulate)
    roles = ao.GemmInputRole

    def operand(cast: Any, role: Any, axis: int) -> Operand:
        kept = cast.scaling_type is ao.ScalingType.DISABLED
        return Operand(
            None if kept else cast.target_dtype,
            cast.scaling_granularity,
            role,
            get_maybe_axiswise_dim(axis, cast.scaling_granularity),
        )

    gemms = (c.gemm_config_output, c.gemm_config_grad_input, c.gemm_config_grad_weight)
    mm = ao.LinearMMConfig(
        *(ao.ScaledMMConfig(emulate, g.use_fast_accum, False, c.pad_inner_dim) for g in gemms)
    )
    # the casts and scale axes of torchao's matmul_with_hp_or_float8_args, for W^T
    return Float8(
        recipe,
        emulate,
        input=operand(c.cast_config_input, roles.INPUT, -1),
        weight=operand(c.cast_config_weight, roles.WEIGHT, 0),
        grad_output=operand(c.cast_config_grad_output, roles.GRAD_OUTPUT, -1),
        weight_for_grad_input=operand(c.cast_config_weight_for_grad_input, roles.WEIGHT, -1),
        grad_output_for_grad_weight=operand(
            c.cast_config_grad_output_for_grad_weight, roles.GRAD_OUTPUT, 0
        ),
        input_for_grad_weight=operand(c.cast_config_input_for_grad_weight, roles.INPUT, 0),
        round_scales_to_power_of_2=c.round_scales_to_power_of_2,
        mm_config=mm,
        config=c,
        to_float8=hp_tensor_to_float8_dynamic,
        matmul=matmul_with_hp_or_float8_args,
    )


def _cast(t: torch.Tensor, f8: Float8, op: Operand) -> torch.Tensor:
    """t in float8 as `op` says (t itself when `op` keeps it in high precision)."""
    if op.dtype is None:
        return t
    return f8.to_float8(
        t,
        op.dtype,
        f8.mm_config,
        gemm_input_role=op.role,
        scaling_granularity=op.granularity,
        axiswise_dim=op.axis,
        round_scales_to_power_of_2=f8.round_scales_to_power_of_2,
    )


def forward(x: torch.Tensor, w: torch.Tensor, f8: Float8 | None) -> torch.Tensor:
    """``F.linear(x, w)`` without bias; with `f8` in float8 and without a backward of its
    own (for the forward of an autograd Function)."""
    if f8 is None:
        return F.linear(x, w)
    rows = x.reshape(-1, x.shape[-1])
    a, b = _cast(rows, f8, f8.input), _cast(w.t(), f8, f8.weight)
    return torch.mm(a, b).view(*x.shape[:-1], w.shape[0])


def input_grad(g: torch.Tensor, w: torch.Tensor, f8: Float8 | None) -> torch.Tensor:
    """``g @ w``: the input grad of ``F.linear(x, w)`` from its output grad g."""
    if f8 is None:
        return g @ w
    rows = g.reshape(-1, g.shape[-1])
    a, b = _cast(rows, f8, f8.grad_output), _cast(w.t(), f8, f8.weight_for_grad_input)
    return torch.mm(a, b.t()).view(*g.shape[:-1], w.shape[1])


def weight_grad(g: torch.Tensor, x: torch.Tensor, f8: Float8 | None) -> torch.Tensor:
    """``g^T x`` over all leading dims: the weight grad of ``F.linear(x, w)``."""
    g, x = g.flatten(0, -2), x.flatten(0, -2)
    if f8 is None:
        return g.t() @ x
    a = _cast(g, f8, f8.grad_output_for_grad_weight)
    b = _cast(x, f8, f8.input_for_grad_weight)
    return torch.mm(a.t(), b)


def linear(x: torch.Tensor, w: torch.Tensor, f8: Float8 | None) -> torch.Tensor:
    """``F.linear(x, w)`` whose forward and both backward GEMMs run in float8 (torchao's
    `matmul_with_hp_or_float8_args`); plain F.linear when f8 is None."""
    if f8 is None:
        return F.linear(x, w)
    return f8.matmul.apply(x, w.t(), f8.mm_config, f8.config)


def float8_linear(module: torch.nn.Linear, f8: Float8) -> torch.nn.Linear:
    """torchao's `Float8Linear` sharing `module`'s parameters: a plain nn.Linear in float8."""
    from torchao.float8.float8_linear import Float8Linear

    return Float8Linear.from_float(module, config=f8.config)
