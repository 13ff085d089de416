"""The host's share of a training step: kernel launches x a per-launch host cost, overlapped
with the GPU's work phase by phase.

Every kernel costs the host time to issue it (Python, the dispatcher, autograd, FSDP2's
hooks, the launch itself): `GpuProfile.host_launch_s` on average, calibrated on one measured
H100 row (`measured`). The host runs ahead of the GPU within a phase, so a phase
takes the longer of its host time and its GPU time; phases follow one another:

- per block and micro-batch, its forward and its backward (with what activation
  checkpointing recomputes), launches counted from the model's own kernel lists: every
  GEMM (forward one, backward two), flash attention (1 forward, `FLASH_BACKWARD_LAUNCHES`
  backward), each memory-bound kernel (`streams`: eager as dispatched; compiled, each
  operation one fused kernel, SiLUs one per tensor), each collective (one per chunk);
- the model's ends (embedding; final norm, lm_head, cross-entropy, loss-parallel
  collectives);
- the weights' handling (casts, FSDP2's copies, gradient casts and additions,
  `weight_launches`)
  inside the phase of the unit they belong to, and per step the gradient norm, clipping
  and AdamW (`optimizer_launches`).

The counts are here: `block_launches` (a block), `ends_launches` (the model's ends),
`weight_launches` and `weight_casts` (the weights' handling, its launches and its GPU
traffic), `stage_host` (a pipeline stage's host seconds beyond its GPU time).

With CUDA graphs (`TrainingLayout.cuda_graphs`) a micro-batch is one graph launch: its host
time is a few launches and its kernels run back to back. `TrainingLayout.legacy_launches`
prices the launch pattern of commit 18fc3d3, on which the H100 rows were measured: FSDP2
resharded after every forward and backward (each weight cast and copied twice per
micro-batch, one unit per block) and one norm reduction per gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

from boost_titan.boost_llama.shapes import PROJECTIONS, ModelShape
from boost_titan.perf.block import (
    FP32_BYTES,
    layer_collectives,
    layer_gemms,
    layer_widths,
    norm_mode,
    params_per_rank,
    stage_sizes,
    step_collectives,
    weight_streams,
)
from boost_titan.perf.costs import FLASH_BACKWARD_LAUNCHES
from boost_titan.perf.float8_costs import float8_cast_streams
from boost_titan.perf.gpus import GpuProfile
from boost_titan.perf.layout import TrainingLayout
from boost_titan.perf.streams import block_streams
from boost_titan.perf.work import Stream

GRAPH_LAUNCHES = 5
"""Host launches of a graphed micro-batch: three input copies, the graph, the loss clone."""
STEP_LAUNCHES = 6
"""Per step besides the optimizer: the token count, the loss sum and the all-reduce that
agrees on loss and stop flags, zeroing, logging."""
HEAD_LAUNCHES = {"eager": (6, 7), "compiled": (3, 4)}
"""(forward, backward) kernels of the final norm, cross-entropy and the loss division
besides the lm_head GEMMs: eager RMSNorm 1 + cross-entropy 4 + division 1 (backward: 4 + 2
norm + 1 seed); compiled, the loss fused (TorchTitan compiles it with the model)."""
EMBEDDING_LAUNCHES = (1, 2)
"""The embedding lookup; its backward's zero-fill and scatter-add."""


@dataclass(frozen=True)
class Phase:
    """Work the host cannot run ahead of: `launches` kernels, `gpu_s` seconds of them."""

    name: str
    launches: float
    gpu_s: float

    def wall(self, host_launch_s: float) -> float:
        return max(self.launches * host_launch_s, self.gpu_s)


def stream_kernels(streams: list[Stream], compiled: bool) -> int:
    """Kernels of memory-bound work: as dispatched (eager), or one fused kernel per
    operation, a SiLU one per tensor (torch.compile, as Inductor's kernels show on CPU)."""
    if not compiled:
        return sum(s.launches for s in streams)
    return sum(s.launches if ".silu" in s.name else 1 for s in streams)


@dataclass(frozen=True)
class WeightLaunches:
    """Launches per micro-batch that handle the weights on one rank (FSDP2's mixed precision),
    by the phase they fall in: each block's forward or backward, or the ends'."""

    block_forward: float
    block_backward: float
    ends: float


def weight_launches(
    block_tensors: int, end_tensors: int, blocks: int, microbatches: int, plan_kind: str
) -> WeightLaunches:
    """`plan_kind`:

    - "product" (`runtime.accumulation`): a unit per block (and the embedding, and the
      norm + lm_head); each weight cast and copied before its block's first forward of the
      step, each micro-batch's bf16 gradients upcast (first) or added into the fp32
      accumulator after the block's backward when there are several, the unit's two
      reduction copies after the last;
    - "legacy" (18fc3d3): the same units; each weight cast and copied before its block's
      forward and again before its backward, each micro-batch reduced into the sharded
      gradient (an add from the second on) with the unit's two reduction copies;
    - "copies" (`runtime.compute_copies`, one device and TP): each weight cast once per
      step in its block's first forward; in every micro-batch's backward each bf16
      gradient cast to fp32, and added into the master's gradient from the second on;
    - "graphs": FSDP2 reshards and reduces after every micro-batch inside the graph: no
      host launches (the GPU side is `weight_casts`)."""
    m = microbatches
    if plan_kind == "graphs":
        return WeightLaunches(0.0, 0.0, 0.0)
    if plan_kind == "copies":
        backward = 1 + (m - 1) / m  # a cast per micro-batch, an add from the second on
        return WeightLaunches(
            block_forward=block_tensors / m,
            block_backward=backward * block_tensors,
            ends=end_tensors / m + backward * end_tensors,
        )
    if plan_kind == "legacy":
        adds = (m - 1) / m
        return WeightLaunches(
            block_forward=2 * block_tensors,
            block_backward=2 * block_tensors + adds * block_tensors + 2,
            ends=4 * end_tensors + adds * end_tensors + 4,
        )
    accumulate = 1.0 if m > 1 else 0.0  # an upcast or an add per tensor and micro-batch
    return WeightLaunches(
        block_forward=2 * block_tensors / m,
        block_backward=accumulate * block_tensors + 2 / m,
        ends=(2 * end_tensors + 4) / m + accumulate * end_tensors,
    )


def optimizer_launches(param_tensors: int, legacy: bool) -> int:
    """Per step: the exact gradient norm (legacy: a fp64 norm, a square and an add per
    gradient; product: one multi-tensor norm, a stack and a sum), clipping (a multi-tensor
    scale and its factor) and fused AdamW."""
    norm = 3 * param_tensors if legacy else 3
    return norm + 2 + 2


def host_exposed(phases: list[Phase], host_launch_s: float) -> float:
    """Seconds the phases take beyond their GPU time: where the host is the slower."""
    return sum(p.wall(host_launch_s) - p.gpu_s for p in phases)


def block_launches(
    args: ModelShape, plan: TrainingLayout, selected: frozenset[str]
) -> tuple[int, int]:
    """Kernels one block launches per micro-batch on one rank: (forward, backward with what
    `ac` recomputes), counted as the module docstring of `host` says."""
    gemms = layer_gemms(args, plan)
    fwd_s, bwd_s = block_streams(layer_widths(args, plan), norm_mode(plan), plan.dtype_bytes)
    casts = float8_cast_streams(args, plan, selected).values()
    weights = weight_streams(args, plan)
    concat = [w for w in weights if w.name.endswith(".concat_weights")]
    scale = [w for w in weights if not w.name.endswith(".concat_weights")]
    fwd_c, bwd_c = layer_collectives(args, plan)
    chunks, compiled = plan.overlap_chunks, plan.compiled
    cast_fwd = [c for fwd, _ in casts for c in fwd]
    cast_bwd = [c for _, bwd in casts for c in bwd]
    fwd = len(gemms) + 1 + stream_kernels(fwd_s + concat + cast_fwd, compiled)
    fwd += chunks * len(fwd_c)
    bwd = 2 * len(gemms) + FLASH_BACKWARD_LAUNCHES
    bwd += stream_kernels(bwd_s + scale + cast_bwd, compiled) + chunks * len(bwd_c)
    if plan.cp > 1:  # cp attention steps, the K/V all-gather, backward's cp dK/dV passes
        # (lowrank AC replays neither the steps nor the gather: it keeps the ring's output)
        fwd += plan.cp
        bwd += (plan.cp - 1) * FLASH_BACKWARD_LAUNCHES + 1 + plan.cp
    firsts = sum(g.name.endswith(".A") for g in gemms)
    recompute = {
        "none": 0,
        "full": fwd,
        "selective": fwd // 2,
        "lowrank": fwd - firsts - chunks * len(fwd_c) - (plan.cp + 1) * (plan.cp > 1),
    }[plan.ac]
    return fwd, bwd + recompute


def ends_launches(args: ModelShape, plan: TrainingLayout, stage: int) -> int:
    """Kernels of the model's ends on `stage` per micro-batch."""
    launches = sum(EMBEDDING_LAUNCHES) * (stage == 0)
    if stage == plan.pp - 1:
        fwd_c, bwd_c = step_collectives(args, plan)
        head = HEAD_LAUNCHES["compiled" if plan.compiled else "eager"]
        launches += 3 + sum(head) + len(fwd_c) + len(bwd_c)
    return launches


def _param_tensors(args: ModelShape, plan: TrainingLayout, stage: int) -> tuple[int, int]:
    """(parameter tensors of one block, of the ends) on one rank of `stage`."""
    per_block = 2 + len(PROJECTIONS) * (2 if args.low_rank else 1)
    return per_block, (stage == 0) + 2 * (stage == plan.pp - 1)


def rank_tensors(args: ModelShape, plan: TrainingLayout) -> int:
    """Parameter tensors on the busiest rank (the stage holding the most)."""
    counts = []
    for s in range(plan.pp):
        per_block, ends = _param_tensors(args, plan, s)
        counts.append(stage_sizes(args, plan)[s] * per_block + ends)
    return max(counts)


def launch_kind(plan: TrainingLayout) -> str:
    """`weight_launches`' pattern for `plan`: without PP the compute copies
    (`runtime.data_parallel`; the model prices layouts without data parallelism)."""
    if plan.cuda_graphs:
        return "graphs"
    if plan.legacy_launches:
        return "legacy"
    return "copies" if plan.pp == 1 else "product"


def weight_casts(args: ModelShape, plan: TrainingLayout) -> Stream:
    """The casts of the weights to the compute dtype per step on the busiest rank (bf16
    training with fp32 master weights only): the compute copies' once per step (read fp32,
    write bf16) plus each micro-batch's gradient casts back to fp32 (read bf16, write
    fp32); FSDP2's (and its copies into the unsharded weights) once per step, twice per
    micro-batch with `legacy_launches`, once per micro-batch under CUDA graphs
    (`weight_launches`)."""
    if plan.state != "bf16":
        return Stream("weight_casts", 0, 0)
    params, tensors = params_per_rank(args, plan), rank_tensors(args, plan)
    kind = launch_kind(plan)
    if kind == "copies":
        cast = FP32_BYTES + plan.dtype_bytes
        return Stream(
            "weight_casts",
            (1 + plan.microbatches) * cast * params,
            (1 + plan.microbatches) * tensors,
        )
    count = {"product": 1, "legacy": 2 * plan.microbatches, "graphs": plan.microbatches}[kind]
    read_cast_copy = FP32_BYTES + 2 * plan.dtype_bytes + 2 * plan.dtype_bytes
    return Stream("weight_casts", count * read_cast_copy * params, 2 * count * tensors)


def stage_host(
    args: ModelShape,
    plan: TrainingLayout,
    gpu: GpuProfile,
    stage: int,
    phases: list[tuple[int, dict[str, float], dict[str, float], tuple[int, int]]],
    ends: tuple[dict[str, float], int],
) -> dict[str, float]:
    """Host seconds per micro-batch of one stage beyond its GPU time (`host`), and (graphs)
    the weight handling each replay runs on the GPU: `phases` are (count, forward,
    backward, launches) of its blocks, `ends` (parts, launches) of its embedding and/or
    head."""
    block_tensors, end_tensors = _param_tensors(args, plan, stage)
    blocks = stage_sizes(args, plan)[stage]
    weights = weight_launches(
        block_tensors, end_tensors, blocks, plan.microbatches, launch_kind(plan)
    )
    h = gpu.host_launch_s

    def gpu_s(parts: dict[str, float]) -> float:
        return sum(v for k, v in parts.items() if k != "comm_hidden")

    work = []
    for count, fwd, bwd, (launches_fwd, launches_bwd) in phases:
        work.append(
            Phase("forward", count * (launches_fwd + weights.block_forward), count * gpu_s(fwd))
        )
        work.append(
            Phase("backward", count * (launches_bwd + weights.block_backward), count * gpu_s(bwd))
        )
    work.append(Phase("ends", ends[1] + weights.ends, gpu_s(ends[0])))
    if plan.cuda_graphs:
        gpu_total = sum(p.gpu_s for p in work)
        return {"host": max(0.0, GRAPH_LAUNCHES * h - gpu_total)}
    return {"host": host_exposed(work, h)}
