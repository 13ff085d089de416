"""Float8 GEMMs in the model: which per-rank GEMMs of a block the product runs in float8,
and the casts that feed them.

Selection is the runtime's own (`boost_titan.parallelize.float8`): `gemm_skip_reason` for a
GEMM of one module, `group_skip_reason` for a group's one GEMM, judged on the per-rank
weight [N, K] and the module FQNs (`module_fqns`). The recipe's torchao config says how
many of a projection's three GEMMs run in float8 (rowwise_with_gw_hp keeps the weight
grad in high precision) and whether scales are rounded to powers of two. Both modules
import torch, so they load only when a plan has float8 on.

Every float8 GEMM casts both of its operands (`kernels/float8.py`): forward x and W,
input grad dY and W, weight grad dY and x. `layout.FLOAT8_CASTS` names how a cast is priced:
eager (the kernels torchao dispatches, `streams.FLOAT8_CAST`) or fused (torch.compile's
amax + cast, `streams.FLOAT8_CAST_FUSED`).

`float8_selection` applies the selection to each GEMM of a block (`block.layer_gemms`);
`float8_cast_streams` lists the casts of a block's selected GEMMs.
"""

from __future__ import annotations

import functools

from boost_titan.boost_llama.shapes import ModelShape
from boost_titan.config.errors import ConfigError
from boost_titan.perf.block import GROUP_MEMBERS, layer_gemms
from boost_titan.perf.layout import TrainingLayout
from boost_titan.perf.streams import FLOAT8_CAST, FLOAT8_CAST_FUSED, FLOAT8_POW2_KERNELS
from boost_titan.perf.work import Gemm, Stream

CONVERTER = "quantize.linear.float8"
"""TorchTitan's `model.converters` entry that turns float8 on."""
PROJECTION_MODULES = {
    "q": "attention.wq",
    "k": "attention.wk",
    "v": "attention.wv",
    "o": "attention.wo",
    "gate": "feed_forward.w1",
    "up": "feed_forward.w3",
    "down": "feed_forward.w2",
}
"""Module path of each projection inside a block (`boost_llama/model.py`)."""
LOW_RANK_FACTORS = {"A": "down", "B": "up"}
"""Child module of a low-rank projection holding each factor (`LowRankLinear`)."""


def module_fqns(layer: int, members: tuple[str, ...], factor: str) -> list[str]:
    """FQNs of the modules one GEMM of block `layer` computes: `members` projections, their
    low-rank `factor` (A / B; '' for a full-rank projection)."""
    child = f".{LOW_RANK_FACTORS[factor]}" if factor else ""
    return [f"layers.{layer}.{PROJECTION_MODULES[p]}{child}" for p in members]


@functools.cache
def skip_reason(
    n: int, k: int, fqns: tuple[str, ...], recipe: str, filter_fqns: tuple[str, ...]
) -> str | None:
    """None when the runtime runs the per-rank GEMM with weight [n, k] of modules `fqns`
    in float8, else why not; ConfigError (one line) for a recipe or filter it refuses."""
    from boost_titan.parallelize.float8 import gemm_skip_reason, group_skip_reason

    try:
        if len(fqns) > 1:
            return group_skip_reason(n, k, list(fqns), recipe, list(filter_fqns))
        return gemm_skip_reason(n, k, fqns[0], recipe, list(filter_fqns))
    except ValueError as e:
        raise ConfigError(str(e)) from None


@functools.cache
def recipe_shape(recipe: str) -> tuple[int, bool]:
    """(float8 GEMMs per projection, scales rounded to powers of two) of `recipe`."""
    from boost_titan.kernels.float8 import float8_recipe

    try:
        f8 = float8_recipe(recipe)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return f8.float8_gemms, bool(f8.config.round_scales_to_power_of_2)


def cast_streams(g: Gemm, recipe: str, casts: str, b: int) -> tuple[list[Stream], list[Stream]]:
    """The casts of float8 GEMM `g` ([m, k] x [k, n], operands of `b` bytes) per
    micro-batch: (forward, backward) kernels with their total bytes."""
    gemms, pow2 = recipe_shape(recipe)
    cost = FLOAT8_CAST if casts == "eager" else FLOAT8_CAST_FUSED
    launches = cost.launches(b) + (FLOAT8_POW2_KERNELS if pow2 and casts == "eager" else 0)
    x, w, dy = g.m * g.k, g.n * g.k, g.m * g.n

    def cast(operands: tuple[int, ...], suffix: str) -> Stream:
        nbytes = sum(operands) * cost.bytes(b)
        return Stream(f"float8_casts{suffix}", nbytes, len(operands) * launches)

    backward = (dy, w) + ((dy, x) if gemms == 3 else ())
    return [cast((x, w), "")], [cast(backward, ".bwd")]


def float8_selection(args: ModelShape, plan: TrainingLayout, layer: int) -> dict[str, str | None]:
    """Each forward GEMM of block `layer` (`layer_gemms`' names) -> None when the runtime
    runs it in float8, else why not; {} with float8 off."""
    if not plan.float8:
        return {}
    reasons = {}
    for g in layer_gemms(args, plan):
        base, _, factor = g.name.partition(".")
        fqns = module_fqns(layer, GROUP_MEMBERS.get(base, (base,)), factor)
        reasons[g.name] = skip_reason(g.n, g.k, tuple(fqns), plan.float8, plan.float8_filter)
    return reasons


def _selected(args: ModelShape, plan: TrainingLayout, layer: int) -> frozenset[str]:
    reasons = float8_selection(args, plan, layer)
    return frozenset(name for name, why in reasons.items() if why is None)


def selection_counts(
    args: ModelShape, plan: TrainingLayout, blocks: range
) -> dict[frozenset[str], int]:
    """How many of `blocks` run each set of float8 GEMMs (one empty set without float8)."""
    counts: dict[frozenset[str], int] = {}
    for layer in blocks:
        selected = _selected(args, plan, layer)
        counts[selected] = counts.get(selected, 0) + 1
    return counts


def float8_cast_streams(
    args: ModelShape, plan: TrainingLayout, selected: frozenset[str]
) -> dict[str, tuple[list[Stream], list[Stream]]]:
    """The float8 casts of one block per micro-batch, (forward, backward) kernels for each
    forward GEMM named in `selected`."""
    return {
        g.name: cast_streams(g, plan.float8, plan.float8_casts, plan.dtype_bytes)
        for g in layer_gemms(args, plan)
        if g.name in selected
    }
