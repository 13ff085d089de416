"""What LORO costs in the analytic model (`perf.loro`): its exact step priced per pair and
amortised over K in the step's split, its transient at the optimizer step in the memory
model and `check`'s line, the job's optimizer read from the TOML, the planner's config,
and the archs it refuses in one line."""

from __future__ import annotations

import math

import pytest

from boost_titan.perf import block, costs, layout, layout_search, loro, memory, predict, timing
from boost_titan.perf.gpus import gpu_profile
from boost_titan.perf.layout import TrainingLayout
from tests.helpers import ROOT

SEVEN_B = dict(strategy="btp", tp=4, micro_batch=4, microbatches=1, compiled=True)
"""train_configs/7B.toml's layout (README's 7B row), trained SVD-style."""


def _svd(flavor: str = "7B"):
    return layout.trained_shape(flavor, "svd", "btp")


@pytest.mark.parametrize("k", [200, 500])
def test_exact_step_is_amortised_over_k_in_the_steps_split(k):
    """LORO's step is AdamW's plus one exact step / K, shown as its own part; the parts
    still add up to the step."""
    args, gpu = _svd(), gpu_profile("h100")
    adamw = timing.step_time(args, TrainingLayout(**SEVEN_B), gpu)
    plan = TrainingLayout(**SEVEN_B, loro_exact_every=k)
    step = timing.step_time(args, plan, gpu)
    exact = loro.exact_step(args, plan, gpu, block.params_per_rank(args, plan))
    assert loro.EXACT_STEP not in adamw and timing.time_parts(plan)[-1] == loro.EXACT_STEP
    assert step[loro.EXACT_STEP] == pytest.approx(sum(exact.values()) / k, rel=1e-12)
    assert step["step"] - adamw["step"] == pytest.approx(step[loro.EXACT_STEP], rel=1e-9)
    assert sum(step[p] for p in timing.time_parts(plan)) == pytest.approx(step["step"])
    record = predict.evaluate("7B", args, plan, ["h100"])
    assert record.time_breakdown_s["h100"][loro.EXACT_STEP] == step[loro.EXACT_STEP]
    assert record.loro_exact_every == k


def test_exact_step_prices_gathers_broadcasts_and_the_owned_dense_work():
    """Per pair of the stage: the all-gather of factors and directions (fp32 master, a
    quarter on each of TP 4's ranks) and the broadcast of the new factors; the dense work
    of the pairs one rank owns (round-robin: 224 pairs over 4 ranks, 56 each)."""
    args, gpu = _svd(), gpu_profile("a100")
    plan = TrainingLayout(**SEVEN_B, loro_exact_every=500)
    comm = dense = 0.0
    for d_in, d_out in args.projection_shapes().values():
        elements = (d_out + d_in) * 1024
        comm += costs.collective_time("all_gather", 2 * elements * 4 // 4, 4, gpu)
        comm += costs.collective_time("broadcast", elements * 4, 4, gpu)
        dense += loro.dense_seconds(loro.pair_flops(d_out, d_in, 1024), 19.5e12)
    got = loro.exact_step(args, plan, gpu, params=10**9)
    assert got["comm"] == pytest.approx(32 * comm, rel=1e-12)
    assert got["dense"] == pytest.approx(32 * dense / 4, rel=1e-12)
    assert got["reset"] == pytest.approx(costs.hbm_time(8 * 10**9, gpu))
    one = loro.exact_step(args, TrainingLayout(strategy="btp", loro_exact_every=500), gpu, 0)
    assert one["comm"] == 0 and one["dense"] == pytest.approx(32 * dense, rel=1e-12)


def test_pair_flops_count_the_dense_steps_gemms_and_solvers():
    """`pair_flops` is loro-math's exact step: its GEMMs as torch's FlopCounterMode counts
    them; QRs with Q of B, A^T and the two projected complements (d x r); the 2r x 2r SVD
    and the pseudo-inverses' two r x r ones (21 n^3 each)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from boost_titan.optim.loro_exact import exact_step

    d_out, d_in, r = 96, 40, 8
    g = torch.Generator().manual_seed(0)
    b, d_b = torch.randn(d_out, r, generator=g), torch.randn(d_out, r, generator=g)
    a, d_a = torch.randn(r, d_in, generator=g), torch.randn(r, d_in, generator=g)
    with FlopCounterMode(display=False) as counter:
        exact_step(b, a, d_b, d_a, 0.01)
    flops = loro.pair_flops(d_out, d_in, r)
    assert flops["gemm"] == counter.get_total_flops()

    def qr(m, n):
        return 4 * m * n * n - 4 * n**3 / 3

    assert flops["qr"] == pytest.approx(2 * qr(96, 8) + 2 * qr(40, 8))
    assert flops["svd"] == 21 * 16**3 + 2 * 21 * 8**3


def test_the_owners_workspace_is_what_the_dense_step_allocates():
    """`OWNER_WORKSPACE` against torch's MemTracker on the dense step (CPU): its peak of new
    allocations, in units of (d_out + d_in) x r fp32, lies within 10 % below the model's."""
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    from boost_titan.optim.loro_exact import exact_step

    d_out, d_in, r = 384, 128, 32
    g = torch.Generator().manual_seed(0)
    b, d_b = torch.randn(d_out, r, generator=g), torch.randn(d_out, r, generator=g)
    a, d_a = torch.randn(r, d_in, generator=g), torch.randn(r, d_in, generator=g)
    tracker = MemTracker()
    with tracker:
        exact_step(b, a, d_b, d_a, 0.01)
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    units = peak / ((d_out + d_in) * r * 4)
    assert 0.9 * loro.OWNER_WORKSPACE <= units <= loro.OWNER_WORKSPACE, units


def test_the_exact_step_can_set_the_peak():
    """With almost no activations (seq 8) the optimizer step is the peak: the state, every
    gradient and the exact step's transient (every factor's fp32 direction on the rank, then
    the largest pair gathered and its owner's workspace), no compute copy or activation."""
    from boost_titan.boost_llama.shapes import PROJECTIONS, projection_params

    args = _svd()
    plan = TrainingLayout(strategy="btp", tp=4, seq_len=8, microbatches=1, loro_exact_every=200)
    peak = memory.stage_memory(args, plan)
    adamw = memory.stage_memory(args, TrainingLayout(**{**plan.__dict__, "loro_exact_every": 0}))
    directions = 32 * sum(projection_params(args, p, 0) for p in PROJECTIONS) // 4 * 4
    largest = (11008 + 4096) * 1024  # gate / up: d_out 11008, d_in 4096, r 1024
    transient = directions + largest * (2 + loro.OWNER_WORKSPACE) * 4
    assert peak.parts[loro.EXACT_STEP] == transient and loro.EXACT_STEP not in adamw.parts
    assert peak.parts["compute_copy"] == peak.parts["activations"] == 0
    state = adamw.parts["weights"] + adamw.parts["optimizer"]
    assert peak.total == state + peak.parts["grads"] + transient > adamw.total
    assert peak.parts["grads"] == memory.MASTER_BYTES["bf16"] * memory.stage_params(args, plan, 0)
    fsdp = memory.stage_memory(args, plan, dp_shard=2).parts[loro.EXACT_STEP]
    assert fsdp == transient - directions // 2  # FSDP 2 halves the rank's factors


def _toml(tmp_path, optimizer: str, arch: str = "svd") -> str:
    text = (ROOT / "train_configs" / "7B.toml").read_text()
    text = text.replace('arch = "cola"', f'arch = "{arch}"\nloro_exact_every = 200')
    path = tmp_path / "job.toml"
    path.write_text(text.replace('name = "AdamW"', f'name = "{optimizer}"'))
    return str(path)


def test_a_jobs_optimizer_is_read_from_its_toml(tmp_path):
    """`[optimizer] name = "LORO"` prices `[boost] loro_exact_every`; AdamW ignores it;
    `check`'s memory line says what LORO adds."""
    from boost_titan.perf.fits import fit_line
    from boost_titan.perf.job_plan import job_plan

    lora = job_plan(_toml(tmp_path, "LORO"), 4)
    assert lora.plan.loro_exact_every == 200 and "LORO exact step every 200" in lora.summary
    assert job_plan(_toml(tmp_path, "AdamW"), 4).plan.loro_exact_every == 0
    line = fit_line(lora, "a100", 80, assumed=True)
    mib = loro.transient_bytes(lora.args, lora.plan, 32) / 2**20
    assert f"its exact step {mib:,.0f} MiB more at the optimizer step (below the peak)" in line


def test_the_planner_writes_and_prices_a_loro_config(tmp_path):
    """`plan --auto --loro-exact-every K`: the layouts are priced with the exact step and the
    winner's TOML trains LORO with that K, which `bench model --config` reads back."""
    from boost_titan.perf.job_plan import job_plan

    request = layout_search.Request("1B", "svd", 2, "a100", 80, 4096, 4, loro_exact_every=200)
    result = layout_search.plan_layouts(request)
    best = result.ranked[0]
    assert best.plan.loro_exact_every == 200
    path = tmp_path / "auto.toml"
    path.write_text(layout_search.toml_text(result, best))
    assert 'name = "LORO"' in path.read_text()
    assert job_plan(str(path), 2).plan == best.plan


@pytest.mark.parametrize(
    "argv,message",
    [
        (["plan", "--auto", "--gpus", "4", "--flavor", "7B", "--loro-exact-every", "200"],
         "arch cola has silu between the factors"),
        (["bench", "model", "--flavor", "7B", "--arch", "cola", "--strategy", "btp",
          "--loro-exact-every", "500"],
         "arch cola has silu between the factors"),
        (["bench", "model", "--flavor", "7B", "--arch", "svd", "--strategy", "megatron",
          "--loro-exact-every", "500"], "strategy megatron trains the full-rank twin"),
        (["plan", "--auto", "--gpus", "4", "--flavor", "7B", "--arch", "fullrank",
          "--loro-exact-every", "200"], "arch fullrank has no factor pairs"),
        (["bench", "model", "--flavor", "7B", "--arch", "svd", "--strategy", "btp",
          "--no-master-weights", "--loro-exact-every", "500"], "LORO updates fp32 master"),
    ],
)  # fmt: skip
def test_loro_it_cannot_price_is_one_line(argv, message, capsys):
    """cola (SiLU between the factors), fullrank and megatron's twin (no pairs) and bf16
    weights without fp32 masters: one `error:` line, exit 2."""
    from boost_titan.bench.__main__ import main as bench
    from boost_titan.plan import main as plan

    try:
        code = (plan if argv[0] == "plan" else bench)(argv[1:])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ")
    assert message in err


def test_round_robin_share():
    """A rank owns ceil(P / n) of its stage's P pairs: 7 pairs x 2 blocks over 4 ranks."""
    args = layout.trained_shape("debug", "svd", "btp")
    args.n_layers = 2
    gpu = gpu_profile("a100")
    plan = TrainingLayout(strategy="btp", tp=4, loro_exact_every=1)
    whole = sum(loro.dense_seconds(loro.pair_flops(*p), 19.5e12) for p in loro.pairs(args))
    got = loro.exact_step(args, plan, gpu, 0)["dense"]
    assert got == pytest.approx(2 * whole * math.ceil(14 / 4) / 14, rel=1e-12)


def test_a_broadcast_moves_its_bytes_once_over_the_ring():
    """NCCL's broadcast: the root's buffer pipelined down the ring, bus bytes = bytes (as
    nccl-tests counts it), after the ring's base and per-hop latency."""
    from boost_titan.perf.gpus import NCCL

    gpu, nbytes = gpu_profile("a100"), 2**30
    expected = NCCL.base_s + 3 * NCCL.hop_s + nbytes / gpu.bus_bw(4)
    assert costs.collective_time("broadcast", nbytes, 4, gpu) == pytest.approx(expected)
