"""float8 inside the TP plans (TorchTitan's `quantize.linear.float8`, torchao's casts).

One gloo launch on 2 ranks runs a block of each plan (btp, vanilla, megatron) at TP1
(torchao's `Float8Linear`) and TP2 (our styles' float8 GEMMs), for each recipe, against
the bf16 block of the same random weights: the number of float8 GEMMs
(`aten._scaled_mm`) per forward-backward equals the selected GEMM weights x 3 (x 2 for
rowwise_with_gw_hp, whose weight grads stay bf16), and the output and every gradient
(block input and parameters) keep an SQNR above a bound, at TP2 as at TP1.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from boost_titan.kernels.float8 import RECIPES, float8_recipe
from boost_titan.parallelize.float8 import apply_float8
from tests.helpers.distributed import run_on_ranks
from tests.helpers.float8_model import BATCH, DIM, SEQ, build_model

PLANS = {"btp": "cola", "vanilla": "cola", "megatron": "fullrank"}
OUTPUT_DB = 20.0
"""The block output (residual included) in float8 vs bf16."""
GRAD_DB = {"tensorwise": 14.0, "rowwise": 16.0, "rowwise_with_gw_hp": 16.0}
"""Every gradient of the block vs bf16. A float8 rounding of one operand costs about
29 dB (e4m3) or 23 dB (e5m2); a low-rank weight grad passes through four to five such
GEMMs (attention's q/k grads more), so torchao's own Float8Linear at TP1 gives 16.5 dB
(tensorwise) / 18.4 dB (rowwise) at worst here: 20 dB for every gradient is out of reach
of float8 itself. The bound sits below TP1's worst and TP2 must meet it too; a scale
off by 2x or a mantissa lost drops far below."""


GRAD_SCALE = 2.0**-14
"""The block's output grad is this small (as a mean loss over many tokens makes it): below
e5m2's and e4m3's smallest normals unless the float8 casts scale by amax."""


class ScaledMMCount(TorchDispatchMode):
    """Counts `aten._scaled_mm` calls, including those torchao's Float8TrainingTensor
    issues from its own dispatch (the mode steps aside for it and sees what it calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torchao.float8 import Float8TrainingTensor

        if Float8TrainingTensor in types:
            return NotImplemented
        self.count += func is torch.ops.aten._scaled_mm.default
        return func(*args, **(kwargs or {}))


def sqnr(got: torch.Tensor, want: torch.Tensor) -> float:
    return (20 * torch.log10(want.norm() / (got - want).norm().clamp_min(1e-30))).item()


def run_block(
    model, tp: int, rank: int, plan: str, count: bool = True
) -> tuple[dict[str, torch.Tensor], int]:
    """Block 1's output and gradients (input and parameters, full tensors) for a random
    input and output grad, and the float8 GEMMs it ran (`count`: counted at dispatch).
    Under BTP the block takes and returns the hidden state sharded along d; otherwise
    replicated."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, SEQ, DIM, generator=generator).bfloat16()
    grad = (torch.randn(BATCH, SEQ, DIM, generator=generator) * GRAD_SCALE).bfloat16()
    sharded = tp > 1 and plan == "btp"
    if sharded:
        x, grad = (t.chunk(tp, -1)[rank].contiguous() for t in (x, grad))
    x.requires_grad_()
    block = model.layers["1"]
    counter = ScaledMMCount()
    with counter if count else contextlib.nullcontext():
        out, _ = block(x, model.rope, ())
        out.backward(grad)

    def whole(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, DTensor):
            return t.full_tensor()
        if sharded:
            parts = [torch.empty_like(t) for _ in range(tp)]
            dist.all_gather(parts, t.contiguous())
            return torch.cat(parts, -1)
        return t

    results = {"output": whole(out.detach()), "input": whole(x.grad)}
    results |= {n: whole(p.grad) for n, p in block.named_parameters()}
    return {k: v.float() for k, v in results.items()}, counter.count


def _worker(rank: int, world_size: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    from boost_titan.boost_llama.strategies import build_plan
    from boost_titan.parallelize import apply_plan

    mesh = init_device_mesh("cpu", (world_size,))
    out = {}
    for plan, arch in PLANS.items():
        for recipe in (None, *RECIPES):
            for tp in (1, world_size) if recipe else (1,):
                model = build_model(arch)
                if tp > 1:
                    apply_plan(model, mesh, build_plan(plan, model.args))
                selection = apply_float8(model, float8_recipe(recipe), []) if recipe else None
                results, count = run_block(model, tp, rank, plan)
                per_block = None
                if selection:  # GEMM weights in one block (all blocks are alike), x 2 or 3
                    gemms = [g for g in selection.chosen if g.fqns[0].startswith("layers.1.")]
                    per_block = len(gemms) * selection.f8.float8_gemms
                out[(plan, recipe, tp)] = (results, count, per_block)
    for plan in ("vanilla", "btp"):  # r = 16: vanilla's per-rank r / 2 = 8 is off the grid
        model = build_model("cola", rank=16)
        apply_plan(model, mesh, build_plan(plan, model.args))
        out[f"{plan} r16"] = apply_float8(model, float8_recipe("tensorwise"), []).summary()
    return out


@pytest.fixture(scope="module")
def block_results() -> dict:
    return run_on_ranks(_worker, 2)[0]


CELLS = [(plan, recipe, tp) for plan in PLANS for recipe in RECIPES for tp in (1, 2)]


@pytest.mark.parametrize("plan, recipe, tp", CELLS)
def test_float8_gemm_count(block_results, plan, recipe, tp):
    _, count, per_block = block_results[(plan, recipe, tp)]
    assert per_block > 0
    assert count == per_block, f"{count} float8 GEMMs, {per_block} selected x GEMMs each"


@pytest.mark.parametrize("plan, recipe, tp", CELLS)
def test_float8_tracks_bf16(block_results, plan, recipe, tp):
    want, _, _ = block_results[(plan, None, 1)]
    got, _, _ = block_results[(plan, recipe, tp)]
    assert got.keys() == want.keys()
    db = {name: sqnr(got[name], want[name]) for name in want}
    worst = min((n for n in db if n != "output"), key=db.get)
    print(f"{plan} {recipe} tp{tp}: output {db['output']:.1f} dB, worst {worst} {db[worst]:.1f} dB")
    assert db["output"] >= OUTPUT_DB, f"output SQNR {db['output']:.1f} dB"
    assert db[worst] >= GRAD_DB[recipe], f"{worst}: SQNR {db[worst]:.1f} dB"


def test_selection_is_judged_per_rank(block_results):
    """Every full weight of the r = 16 model is on the 16 grid; vanilla TP2's shards are
    not (grouping counts: gate/up downs stacked are 2 x 8), BTP TP2's are."""
    vanilla = block_results["vanilla r16"]
    assert vanilla.startswith("float8 (tensorwise): 5 of 29 projections, as 3 GEMM"), vanilla
    for reason in (
        "N 24 is not a multiple of 16: layers.*.attention.wq.down, "
        "layers.*.attention.wk.down, layers.*.attention.wv.down",
        "N 8 is not a multiple of 16: layers.*.attention.wo.down, layers.*.feed_forward.w2.down",
        "K 8 is not a multiple of 16: layers.*.attention.wq.up",
    ):
        assert reason in vanilla, vanilla
    btp = block_results["btp r16"]
    assert btp.startswith("float8 (tensorwise): 29 of 29"), btp
