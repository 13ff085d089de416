"""What LORO's exact step costs (issue 48): its seconds, amortised over the K optimizer
steps it runs once in, and the transient memory it needs at the optimizer step.

LORO keeps AdamW's two moments on every parameter (`memory.MOMENT_BYTES` as they are) and
its approximate step moves as many bytes as AdamW's update; the exact step, every
`TrainingLayout.loro_exact_every` = K steps, is the extra. Per pair (B = up.weight
[d_out x r], A = down.weight [r x d_in]) on the pair's mesh of n ranks (TP x FSDP, CP
included), as the product runs it (docs/training.md#loro):

- communication: an all-gather of B, A and their directions D_B, D_A ((d_out + d_in) x r
  x 2 fp32 elements: LORO updates fp32 master factors), first over the FSDP ranks
  (network when they span nodes), then over TP; one broadcast of the new B and A
  ((d_out + d_in) x r) from the pair's owner back over the same ranks.
- dense work on the owner (pairs go in rounds of one per rank of the mesh, so each rank
  owns ceil(P / n) of the P pairs of its stage and the owners work side by side), in fp32:
  four Householder QRs with Q (d x r), the 2r x 2r SVD and two r x r ones (the
  pseudo-inverses of the R factors), and the GEMMs between them (`pair_flops`).
- resetting every Adam moment afterwards: one write of both moments.

Memory (`transient_bytes`): the directions of every factor on the rank, then one pair's
gathered tensors and the owner's workspace.

Rates. GEMMs in plain FP32 (TF32 off, torch's default) at `FP32_GEMM_EFFICIENCY` of the
profile's FP32 peak. A blocked Householder QR does most of its flops in GEMM-like
trailing updates but factors each panel with memory-bound BLAS-2 work, which takes about
as long again for a tall-skinny matrix: `QR_EFFICIENCY`. The dense SVD is far from peak on
a GPU: its bidiagonalisation is half BLAS-2, and cuSOLVER's gesvd / MAGMA's gesdd run the
bidiagonal stage on the host; `SVD_EFFICIENCY` is an assumption from the one published
timing we have (below), not a measurement of ours. Each pair also costs `PAIR_HOST_S`
whatever its size (LORO's own log).
"""

from __future__ import annotations

import math

from boost_titan.boost_llama.shapes import ModelShape
from boost_titan.perf import costs
from boost_titan.perf.block import stage_sizes
from boost_titan.perf.gpus import GpuProfile
from boost_titan.perf.layout import TrainingLayout

FP32 = 4
EXACT_STEP = "exact_step"
"""The part of a step's time (`timing.time_parts`) and of a peak's memory
(`memory.stage_memory`) that is LORO's exact step; present only under LORO."""
FP32_GEMM_EFFICIENCY = 0.8
"""Plain FP32 GEMMs (CUDA cores) of these sizes run near peak; 0.8 as cuBLAS's SGEMM on
large shapes."""
QR_EFFICIENCY = 0.3
"""Householder QR with explicit Q of a tall d x r matrix (cuSOLVER geqrf + orgqr): the
trailing updates near the GEMM rate, each panel's BLAS-2 factorisation at the HBM rate
(about as long again at r = 1024), so about a third of FP32 peak."""
SVD_EFFICIENCY = 0.02
"""Fraction of FP32 peak the 2r x 2r SVD reaches. From MAGMA's gesdd at n = 2112 in 0.93 s
on a Titan X (pytorch/pytorch#1373): 21 n^3 = 2.0e11 flops at 0.21 TFLOP/s, 2-3 % of that
GPU's FP32 peak. Assumed to scale with the FP32 peak; unmeasured on A100 / H100."""
PAIR_HOST_S = 0.02
"""Seconds per pair beyond its flops: the solvers' host synchronisations and launches. LORO's
130M log (docs/training.md#loro: exact steps of 3.1-5.9 s against 0.51 s for a normal one, 84 pairs
at r = 256, every GPU computing every pair) gives 0.031-0.064 s per pair, of which the
rates above explain 0.008 on an A100 (their GPU is not named)."""
GATHERED = 2
"""Units of (d_out + d_in) x r elements an exact step gathers on every rank: the factors and
their directions."""
OWNER_WORKSPACE = 9
"""Units of (d_out + d_in) x r fp32 elements the owner's dense step allocates at its peak
besides the gathered factors and directions: Q of the factors, Z, the projected
complements, their QRs' Q and workspace, the stacked bases [Q, Q'] (two units) and the new
factors. Measured: 8.3-8.4 units (torch's MemTracker on CPU, tests/unit/test_loro_cost.py)."""


def pairs(args: ModelShape) -> list[tuple[int, int, int]]:
    """(d_out, d_in, r) of the seven pairs of one block."""
    r = args.effective_rank
    return [(d_out, d_in, r) for d_in, d_out in args.projection_shapes().values()]


def _qr_flops(m: int, n: int) -> float:
    """Householder QR of an m x n matrix with its Q formed (geqrf + orgqr)."""
    return 4 * m * n * n - 4 * n**3 / 3


def pair_flops(d_out: int, d_in: int, r: int) -> dict[str, float]:
    """Flops of one pair's dense exact step as `optim.loro_exact.exact_step` runs it:
    `qr` (QR of B and of A^T, then of the two projected complements, all d x r), `svd` (the
    2r x 2r core and the pseudo-inverses of R_A and R_B, r x r each; 21 n^3 for an n x n
    SVD with U and V, Golub and Van Loan) and `gemm` (Z_B, Z_A, K0, the projections off Q_B
    and Q_A, R_B R_A^T and the new factors [Q, Q'] U S^1/2: what torch's FlopCounterMode
    counts of it)."""
    qr = 2 * _qr_flops(d_out, r) + 2 * _qr_flops(d_in, r)
    gemm = 10 * (d_out + d_in) * r * r + 2 * r**3
    return {"qr": qr, "svd": 21 * (2 * r) ** 3 + 2 * 21 * r**3, "gemm": gemm}


def dense_seconds(flops: dict[str, float], fp32_flops: float) -> float:
    """Seconds of one pair's dense step (`pair_flops`) on a GPU whose FP32 peak is
    `fp32_flops`."""
    return (
        PAIR_HOST_S
        + flops["gemm"] / (fp32_flops * FP32_GEMM_EFFICIENCY)
        + flops["qr"] / (fp32_flops * QR_EFFICIENCY)
        + flops["svd"] / (fp32_flops * SVD_EFFICIENCY)
    )


def _gather(nbytes: float, plan: TrainingLayout, gpu: GpuProfile, dp_shard: int) -> float:
    """All-gather of a tensor of `nbytes` sharded over FSDP x TP: over FSDP first."""
    tp, fsdp = plan.tp, dp_shard * plan.cp
    in_node = tp * fsdp <= gpu.gpus_per_node
    outer = costs.gather_time(int(nbytes / (tp * fsdp)), fsdp, gpu, in_node)
    return outer + costs.collective_time("all_gather", int(nbytes / tp), tp, gpu)


def _broadcast(nbytes: float, plan: TrainingLayout, gpu: GpuProfile, dp_shard: int) -> float:
    """The owner's new factors to every rank: a broadcast along each mesh dimension in turn
    (`optim.loro_sharded.broadcast_over_mesh`), FSDP's first (across nodes at the NIC
    rate when they span several), then TP's."""
    fsdp = dp_shard * plan.cp
    if plan.tp * fsdp <= gpu.gpus_per_node:
        outer = costs.collective_time("broadcast", int(nbytes), fsdp, gpu)
    else:
        outer = costs.send_time(int(nbytes), gpu)  # pipelined through the nodes
    return outer + costs.collective_time("broadcast", int(nbytes), plan.tp, gpu)


def exact_step(
    args: ModelShape, plan: TrainingLayout, gpu: GpuProfile, params: int, dp_shard: int = 1
) -> dict[str, float]:
    """Seconds of one exact step on a rank of the busiest stage, by part: `comm` (the
    gathers and broadcasts of every pair of the stage), `dense` (the pairs it owns),
    `reset` (zeroing both moments of its `params` parameters)."""
    layers = max(stage_sizes(args, plan))
    mesh = plan.tp * dp_shard * plan.cp
    comm = dense = 0.0
    for d_out, d_in, r in pairs(args):
        unit = (d_out + d_in) * r * FP32
        comm += _gather(GATHERED * unit, plan, gpu, dp_shard) + _broadcast(
            unit, plan, gpu, dp_shard
        )
        dense += dense_seconds(pair_flops(d_out, d_in, r), gpu.peak_flops["fp32"])
    stage_pairs = len(pairs(args)) * layers
    owned = math.ceil(stage_pairs / mesh) / stage_pairs  # the share of the pairs a rank owns
    reset = costs.hbm_time(2 * FP32 * params, gpu)
    return {"comm": layers * comm, "dense": layers * dense * owned, "reset": reset}


def amortised_seconds(
    args: ModelShape, plan: TrainingLayout, gpu: GpuProfile, params: int, dp_shard: int = 1
) -> float:
    """`exact_step`'s seconds per optimizer step: divided by K (0 without LORO)."""
    if not plan.loro_exact_every:
        return 0.0
    return sum(exact_step(args, plan, gpu, params, dp_shard).values()) / plan.loro_exact_every


def transient_bytes(args: ModelShape, plan: TrainingLayout, layers: int, shards: int = 1) -> int:
    """Bytes the exact step adds on a rank of a stage of `layers` blocks at the optimizer
    step (0 without LORO): the directions of every factor on the rank (fp32, its share of the
    stage's pairs over TP x `shards` FSDP ranks, all computed before the first pair's step),
    then the largest pair's gathered factors and directions and the owner's workspace."""
    if not plan.loro_exact_every:
        return 0
    sizes = [(d_out + d_in) * r for d_out, d_in, r in pairs(args)]
    directions = layers * sum(sizes) // (plan.tp * shards) * FP32
    return directions + max(sizes) * (GATHERED + OWNER_WORKSPACE) * FP32
