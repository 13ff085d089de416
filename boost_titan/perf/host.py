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

With CUDA graphs (`TrainingLayout.cuda_graphs`) a micro-batch is one graph launch: its host
time is a few launches and its kernels run back to back. `TrainingLayout.legacy_launches`
prices the launch pattern of commit 18fc3d3, on which the H100 rows were measured: FSDP2
resharded after every forward and backward (each weight cast and copied twice per
micro-batch, one unit per block) and one norm reduction per gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

from boost_titan.perf.costs import FLASH_BACKWARD_LAUNCHES
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
      host launches (the GPU side is `step_model.weight_casts`)."""
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


__all__ = [
    "EMBEDDING_LAUNCHES",
    "FLASH_BACKWARD_LAUNCHES",
    "GRAPH_LAUNCHES",
    "HEAD_LAUNCHES",
    "STEP_LAUNCHES",
    "Phase",
    "host_exposed",
    "optimizer_launches",
    "stream_kernels",
    "WeightLaunches",
    "weight_launches",
]
