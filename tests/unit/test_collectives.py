"""Exact collectives of one block (and the model's ends) under the real TP plans.

One process, a fake process group of world size tp: collectives return garbage of the
right shape, which is all these tests look at. Counts come from CommDebugMode, shapes and
dtypes from `CollectiveRecorder`; any collective beyond the expected ones fails.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from boost_titan.bench.measure.fake_group import (
    default_dtype,
    fake_tp_mesh,
    layer_input_dim,
    parallel_model,
)
from boost_titan.bench.measure.trace import trace_model, without
from boost_titan.boost_llama import flavor_args
from boost_titan.parallelize import comm
from boost_titan.parallelize.debug import (
    CollectiveCall,
    collective_kind,
    record_collectives,
)
from boost_titan.perf import block
from boost_titan.perf.layout import TrainingLayout

BATCH, SEQ = 2, 8
TOKENS = BATCH * SEQ
D, FFN, R = 64, 128, 16


def small_args(arch: str, n_layers: int = 2):
    return flavor_args(
        "debug",
        vocab_size=64,
        arch=arch,
        dim=D,
        n_heads=4,
        ffn_dim=FFN,
        n_layers=n_layers,
        rank=R,
    )


@pytest.fixture(scope="module", params=[2, 4], ids=lambda tp: f"tp{tp}")
def mesh(request):
    with fake_tp_mesh(request.param) as mesh:
        yield mesh


def run_block(mesh, arch: str, strategy: str, rmsnorm: str = "online", group_linears: bool = True):
    """(forward log, backward log) of block 1 (LaX: the one that crosses) on this rank's
    input."""
    torch.manual_seed(0)
    args = small_args(arch)
    model = parallel_model(args, strategy, mesh, rmsnorm, group_linears)
    h = torch.randn(BATCH, SEQ, layer_input_dim(args, strategy, mesh.size()), requires_grad=True)
    prevs = [torch.randn(BATCH, SEQ, R, requires_grad=True) for _ in range(7)] * (arch == "lax")
    with record_collectives() as fwd:
        out, _ = model.layers["1"](h, model.rope, prevs)
    with record_collectives() as bwd:
        out.backward(torch.randn_like(out))
    return fwd, bwd


def per_token(calls: list[CollectiveCall]) -> list[tuple[str, int]]:
    return sorted((c.kind, c.elements_per_token(TOKENS)) for c in calls)


def all_reduces(*sizes: int) -> list[tuple[str, int]]:
    return sorted(("all_reduce", n) for n in sizes)


# name -> (arch, strategy, rmsnorm, group_linears, forward sizes, backward sizes), all-reduces
# per token; d_kv = d here (no GQA)
CASES = {
    "btp": ("cola", "btp", "online", True, (3 * R + 1, R, 2 * R + 1, R), (3 * R, R, 2 * R, R)),
    "btp-svd": ("svd", "btp", "online", True, (3 * R + 1, R, 2 * R + 1, R), (3 * R, R, 2 * R, R)),
    # LaX hands every latent to the next block's crossing: each up reduces its own grad
    "btp-lax": ("lax", "btp", "online", True, (3 * R + 1, R, 2 * R + 1, R), (R,) * 7),
    "btp-sync": (
        "cola",
        "btp",
        "sync",
        True,
        (1, 3 * R, R, 1, 2 * R, R),
        (1, 3 * R, R, 1, 2 * R, R),
    ),
    # ungrouped, each down-projection all-reduces on its own; the online statistic rides
    # in the first after each norm (q, gate), sync all-reduces it once per norm
    "btp-ungrouped": ("cola", "btp", "online", False, (R + 1, R, R, R, R + 1, R, R), (R,) * 7),
    "btp-sync-ungrouped": (
        "cola",
        "btp",
        "sync",
        False,
        (1, R, R, R, R, 1, R, R, R),
        (R,) * 7 + (1, 1),
    ),
    "vanilla": ("cola", "vanilla", "online", True, (D, D, D, D, FFN, FFN, D), (D, D, D, FFN)),
    "vanilla-ungrouped": (
        "cola",
        "vanilla",
        "online",
        False,
        (D, D, D, D, FFN, FFN, D),
        (D, D, D, FFN),
    ),
    "megatron": ("fullrank", "megatron", "online", True, (D, D), (D, D)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_block_collectives_exact(mesh, case):
    arch, strategy, rmsnorm, grouped, fwd_sizes, bwd_sizes = CASES[case]
    fwd, bwd = run_block(mesh, arch, strategy, rmsnorm, grouped)
    assert fwd.debug_counts == Counter(all_reduce=len(fwd_sizes))
    assert bwd.debug_counts == Counter(all_reduce=len(bwd_sizes))
    assert not fwd.backward and not bwd.forward
    assert per_token(fwd.calls) == all_reduces(*fwd_sizes)
    assert per_token(bwd.calls) == all_reduces(*bwd_sizes)
    assert sum(c.nbytes for c in fwd.calls) == TOKENS * 4 * sum(fwd_sizes)  # fp32
    assert sum(c.nbytes for c in bwd.calls) == TOKENS * 4 * sum(bwd_sizes)


def test_btp_forward_order(mesh):
    fwd, _ = run_block(mesh, "cola", "btp")
    assert [c.elements_per_token(TOKENS) for c in fwd.calls] == [3 * R + 1, R, 2 * R + 1, R]


@pytest.mark.parametrize("case", [c for c in CASES if CASES[c][0] != "lax"])
def test_block_collectives_match_the_perf_model(mesh, case):
    arch, strategy, rmsnorm, grouped, _, _ = CASES[case]
    fwd, bwd = run_block(mesh, arch, strategy, rmsnorm, grouped)
    plan = TrainingLayout(
        strategy=strategy,
        tp=mesh.size(),
        seq_len=SEQ,
        micro_batch=BATCH,
        dtype="fp32",
        rmsnorm=rmsnorm,
        group_linears=grouped,
    )
    model_fwd, model_bwd = block.layer_collectives(small_args(arch), plan)
    for recorded, modelled in ((fwd.calls, model_fwd), (bwd.calls, model_bwd)):
        assert per_token(recorded) == sorted((c.kind, c.elements_per_token) for c in modelled)
        assert sorted(c.nbytes for c in recorded) == sorted(c.bytes(TOKENS, 4) for c in modelled)


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "ungrouped"])
def test_online_statistic_in_activation_dtype(mesh, grouped):
    """bf16: the statistic rides in the bf16 all-reduce, priced by perf.block at 2 bytes."""
    with default_dtype(torch.bfloat16):
        fwd, bwd = run_block(mesh, "cola", "btp", group_linears=grouped)
    plan = TrainingLayout(
        strategy="btp",
        tp=mesh.size(),
        seq_len=SEQ,
        micro_batch=BATCH,
        dtype="bf16",
        group_linears=grouped,
    )
    model_fwd, model_bwd = block.layer_collectives(small_args("cola"), plan)
    assert {c.dtype for c in fwd.calls + bwd.calls} == {torch.bfloat16}
    for recorded, modelled in ((fwd.calls, model_fwd), (bwd.calls, model_bwd)):
        assert sorted(c.nbytes for c in recorded) == sorted(c.bytes(TOKENS, 2) for c in modelled)


@pytest.mark.parametrize(
    "arch,strategy", [("cola", "btp"), ("cola", "vanilla"), ("fullrank", "megatron")]
)
def test_model_level_collectives(mesh, arch, strategy):
    """Embedding + block + final norm + lm_head + loss-parallel CE, minus the block."""
    tp = mesh.size()
    fwd, bwd = run_block(mesh, arch, strategy)
    torch.manual_seed(0)
    model = parallel_model(small_args(arch, n_layers=1), strategy, mesh)
    step = trace_model(model, torch.randint(0, 64, (BATCH, SEQ)))
    extra_fwd, extra_bwd = without(step.forward, fwd.calls), without(step.backward, bwd.calls)
    stats = [("all_reduce", 1)] * 3  # loss parallel: max, sum of exp, target logit
    if strategy == "btp":
        # all-reduces: block forward + backward, final norm + loss forward, final norm backward
        assert step.debug_counts == Counter(
            all_reduce=4 + 4 + (1 + 3) + 1, all_gather=1, reduce_scatter=1
        )
        assert per_token(extra_fwd) == sorted([("all_reduce", 1), ("all_gather", D // tp), *stats])
        assert per_token(extra_bwd) == sorted([("reduce_scatter", D), ("all_reduce", 1)])
    else:
        assert per_token(extra_fwd) == stats
        assert per_token(extra_bwd) == [("all_reduce", D)]  # lm_head input grad
    model_fwd, model_bwd = block.step_collectives(
        small_args(arch), TrainingLayout(strategy=strategy, tp=tp, seq_len=SEQ, micro_batch=BATCH)
    )
    assert per_token(extra_fwd) == sorted((c.kind, c.elements_per_token) for c in model_fwd)
    assert per_token(extra_bwd) == sorted((c.kind, c.elements_per_token) for c in model_bwd)


def test_collective_kind_names():
    assert collective_kind("all_reduce") == collective_kind("allreduce_") == "all_reduce"
    assert collective_kind("_allgather_base_") == "all_gather"
    assert collective_kind("all_gather_into_tensor") == "all_gather"
    assert collective_kind("reduce_scatter_tensor") == "reduce_scatter"
    assert collective_kind("wait_tensor") is None
    assert collective_kind("all_to_all_single") == "all_to_all_single"


def test_recorder_sees_c10d_collectives(mesh):
    """Plain torch.distributed calls: payload = each rank's input, as for functional ones."""
    tp = mesh.size()
    x = torch.ones(TOKENS, 3)
    with record_collectives() as log:
        dist.all_reduce(x)
        dist.all_gather_single(torch.empty(TOKENS * tp, 3), x)
        dist.reduce_scatter_single(torch.empty(TOKENS // tp, 3), x)
    assert log.debug_counts == Counter(all_reduce=1, all_gather=1, reduce_scatter=1)
    assert [(c.kind, c.shape) for c in log.calls] == [
        ("all_reduce", (TOKENS, 3)),
        ("all_gather", (TOKENS, 3)),
        ("reduce_scatter", (TOKENS, 3)),
    ]


class _OpLog(TorchDispatchMode):
    """Names of the ops dispatched inside the context, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("split_input", [False, True], ids=["shared-input", "split-input"])
def test_column_linears_overlap_grad_all_reduce(mesh, split_input):
    """Backward issues the input-grad all-reduce before both weight-grad GEMMs and waits
    for it after them; every grad has its input's shape."""
    widths = [3, 5] if split_input else [4, 4]
    x = torch.randn(BATCH, SEQ, sum(widths) if split_input else 4, requires_grad=True)
    weights = [torch.randn(6, w, requires_grad=True) for w in widths]
    ys = comm.column_linears(x, weights, mesh.get_group(), split_input=split_input)
    assert [y.shape for y in ys] == [(BATCH, SEQ, 6)] * 2
    with _OpLog() as log:
        torch.autograd.backward(ys, [torch.ones_like(y) for y in ys])
    launch, wait = log.names.index("all_reduce"), log.names.index("wait_tensor")
    assert log.names[:launch].count("mm") == 2  # the two input-grad GEMMs
    assert log.names[launch:wait].count("mm") == 2  # the weight grads, behind the all-reduce
    assert x.grad.shape == x.shape
    assert [w.grad.shape for w in weights] == [w.shape for w in weights]


def test_overlapped_blocks_launch_before_the_next_gemm(mesh):
    """overlap_chunks = 2: forward, block 1's all-reduce is launched before block 2's GEMM
    and waited for after it; backward (column-parallel), block 1's input-grad all-reduce is
    launched before block 2's input-grad GEMM, and both are waited for after the weight-grad
    GEMM."""
    from boost_titan.parallelize.norms import online_rmsnorm_down

    group = mesh.get_group()
    x = torch.randn(BATCH, SEQ, 4, requires_grad=True)
    w = torch.randn(6, 4, requires_grad=True)
    for forward in (
        lambda: comm.row_linear(x, w, group, 2),
        lambda: online_rmsnorm_down(x, torch.rand(4) + 0.5, [w], 4 * mesh.size(), 1e-6, group, 2)[
            0
        ],
    ):
        with _OpLog() as log:
            forward()
        ops = [n for n in log.names if n in ("mm", "all_reduce", "wait_tensor")]
        assert ops == ["mm", "all_reduce", "mm", "all_reduce", "wait_tensor", "wait_tensor"]
    (y,) = comm.column_linears(x, [w], group, chunks=2)
    with _OpLog() as log:
        y.backward(torch.ones_like(y))
    ops = [n for n in log.names if n in ("mm", "all_reduce", "wait_tensor")]
    assert ops == ["mm", "all_reduce", "mm", "all_reduce", "mm", "wait_tensor", "wait_tensor"]


def test_deferred_group_grad_all_reduce_runs_behind_weight_grads(mesh):
    """Linears that leave their input grads to a group's `reduce_grad` leave their
    weight-grad GEMMs to it too: it launches the all-reduce, runs them, then waits."""
    x = torch.randn(BATCH, SEQ, 4, requires_grad=True)
    weights = [torch.randn(6, 4, requires_grad=True) for _ in range(2)]
    stash = comm.WeightGradStash()
    shared = comm.reduce_grad(x, mesh.get_group(), stash, dict(enumerate(weights)))
    ys = [comm.stashed_linear(shared, w, stash, i) for i, w in enumerate(weights)]
    with _OpLog() as log:
        torch.autograd.backward(ys, [torch.ones_like(y) for y in ys])
    launch, wait = log.names.index("all_reduce"), log.names.index("wait_tensor")
    assert log.names[:launch].count("mm") == 2  # the two input-grad GEMMs
    assert log.names[launch:wait].count("mm") == 2  # the weight grads, behind the all-reduce
    assert [w.grad.shape for w in weights] == [(6, 4)] * 2 and not stash.entries
    want = torch.ones(BATCH * SEQ, 6).t() @ x.detach().flatten(0, 1)
    assert all(torch.equal(w.grad, want) for w in weights)


@pytest.mark.parametrize(
    "strategy,arch", [("btp", "cola"), ("vanilla", "cola"), ("megatron", "fullrank")]
)
def test_group_members_grads_concatenated(mesh, strategy, arch):
    """Consumers take their parts of a norm group's output split in one op, so backward
    concatenates their grads (no zero-padded full-width grad per consumer to sum)."""
    torch.manual_seed(0)
    args = small_args(arch)
    model = parallel_model(args, strategy, mesh)
    h = torch.randn(BATCH, SEQ, layer_input_dim(args, strategy, mesh.size()), requires_grad=True)
    out, _ = model.layers["1"](h, model.rope)
    with _OpLog() as log:
        out.backward(torch.randn_like(out))
    assert "slice_backward" not in log.names
    assert log.names.count("cat") >= 2  # one per group


def test_column_linears_skip_unneeded_grads(mesh):
    """A frozen weight gets no grad and an input without grad issues no all-reduce."""
    x = torch.randn(BATCH, SEQ, 4)
    weights = [torch.randn(6, 4, requires_grad=True), torch.randn(6, 4)]
    ys = comm.column_linears(x, weights, mesh.get_group())
    with record_collectives() as log:
        torch.autograd.backward(ys[0], torch.ones_like(ys[0]))
    assert log.calls == []
    assert weights[0].grad.shape == (6, 4) and weights[1].grad is None


class _OpCount(TorchDispatchMode):
    """How often each op ran (by overload packet name)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func._overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("arch,strategy", [("cola", "btp"), ("lax", "btp"), ("cola", "vanilla")])
def test_block_host_work(mesh, arch, strategy, monkeypatch):
    """Per block forward: one `to_local` per weight; forward and backward: every collective
    launched and waited for directly, without the autograd wrapper that makes an
    AsyncCollectiveTensor of each."""
    torch.manual_seed(0)
    args = small_args(arch)
    model = parallel_model(args, strategy, mesh, "online", True)
    layer = model.layers["1"]
    h = torch.randn(BATCH, SEQ, layer_input_dim(args, strategy, mesh.size()), requires_grad=True)
    prevs = [torch.randn(BATCH, SEQ, R, requires_grad=True) for _ in range(7)] * (arch == "lax")
    conversions = []
    to_local = dist.tensor.DTensor.to_local
    monkeypatch.setattr(
        dist.tensor.DTensor, "to_local", lambda t, *a, **k: conversions.append(t) or to_local(t)
    )
    with _OpCount() as ops:
        out, _ = layer(h, model.rope, prevs)
        out.backward(torch.randn_like(out))
    assert len(conversions) == len(list(layer.parameters()))
    assert ops.counts["all_reduce"] > 0
    assert ops.counts["_wrap_tensor_autograd"] == 0
