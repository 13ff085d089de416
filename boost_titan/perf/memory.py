"""Peak memory per GPU of a training layout: the one formula `bench model` and the planner use.

Per rank of pipeline stage s (TorchTitan's split, `stage_layers`), for the product's
precision (`config.precision`: bf16 compute copies of fp32 master weights on every layout,
made by FSDP2's mixed-precision policy or, where nothing is sharded, `runtime.compute_copies`),
with N the stage's parameters on the rank and d the
FSDP shard degree:

- state, always resident: the weights (bf16 training: the fp32 master copy, 4 N / d) and
  AdamW's two moments (8 N / d); fp32 training the same, bf16 without master weights half.
- compute copy: bf16 training casts each weight to bf16 (2 bytes per parameter,
  unsharded). Where nothing is sharded (d = 1) the whole stage's copy stays from the
  step's first forward until each unit's backward in the last micro-batch frees it
  (`runtime.compute_copies` without PP, FSDP2 with `runtime.accumulation` under PP, as
  TorchTitan's policy for PP); with FSDP (d > 1) a
  block's copy lives during its forward and again during its backward, the final norm +
  lm_head's from forward to backward (TorchTitan does not reshard them).
- activations: `activations.activation_bytes` per block (exact against `bench trace`) x the
  stage's blocks x the micro-batches 1F1B keeps in flight on it (pp - s, at most all).
  Under context parallelism a rank holds T / cp tokens of each micro-batch, so every
  per-token term (activations, loss) falls by cp, and FSDP shards over dp_shard x cp.
- loss (last stage): the logits' temporaries, [T, V/tp] elements of `LOSS_BYTES` (TP 1:
  the fp32 log-softmax and two fp32 gradients in its backward) or `LOSS_PARALLEL_BYTES`
  (loss parallelism's fp32 temporaries in its forward); the bf16 final-norm output the
  lm_head keeps.
- backward of one block: its unsharded bf16 gradients and their fp32 copy for the
  reduction (6 bytes per block parameter), and with AC the block's recomputed activations
  (what `none` keeps minus what the mode kept).
- gradients: fp32 and sharded (4 N / d), all present when backward ends.
- CP's ring (`ring_buffers`), in a block's backward: the gathered K/V and the dK/dV passes.
- LORO (`plan.loro_exact_every`): the same two moments as AdamW; its exact step, at the
  optimizer step, adds `loro.transient_bytes` (every factor's direction, one pair
  gathered, the owner's workspace) to the state and every gradient: a fourth candidate
  peak, part `exact_step`.

The peak is the state plus the largest of three moments: the loss (compute copy +
activations + loss), the first block's backward (compute copy + activations + one block's
backward) and the last block's backward (every gradient + one block's backward, with the
whole kept copy only when an earlier micro-batch's backward ended that way); when a forward
follows a backward in the step (gradient accumulation, 1F1B's steady state) the first two
also hold every gradient. Communication buffers:
FSDP on one rank moves nothing (its cast-copy is the compute copy) and TP's collectives
write into tensors the activation accounting already counts; with d > 1, one block's
all-gather output is the compute copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from boost_titan.boost_llama.shapes import ModelShape
from boost_titan.perf import loro
from boost_titan.perf.activations import activation_bytes, end_activations
from boost_titan.perf.block import kv_width, layer_params
from boost_titan.perf.layout import BF16_WEIGHTS, TrainingLayout

GIB = 2**30
FP32 = 4
BF16 = 2
MASTER_BYTES = {"bf16": FP32, "fp32": FP32, BF16_WEIGHTS: BF16}
"""Bytes per parameter of the weights the optimizer updates (and of their gradients)."""
MOMENT_BYTES = {"bf16": 2 * FP32, "fp32": 2 * FP32, BF16_WEIGHTS: 2 * BF16}
"""AdamW's exp_avg and exp_avg_sq, in the weights' dtype."""
COPY_BYTES = {"bf16": BF16, "fp32": 0, BF16_WEIGHTS: 0}
"""The unsharded compute copy FSDP2's policy casts (none when weights are in compute dtype)."""
LOSS_BYTES = 3 * FP32
"""Per logit element at the loss's peak without TP, in its backward: the saved fp32
log-softmax and two fp32 gradients."""
LOSS_PARALLEL_BYTES = 16
"""Per logit element at the loss's peak under TP (loss parallelism): the bf16 logits and
the fp32 temporaries of torch's loss-parallel log-softmax and NLL
(`torch.distributed.tensor.parallel.loss`: upcast, shifted, exp, result), about 3.5 fp32
copies alive at once. Calibrated: MemTracker on real CPU tensors, debug flavor TP2, counts
15.7 bytes per element; on fake tensors it counts 22 (fp32 temporaries that real tensors
free earlier), so the fake-tensor checks sit a few % below the tracker under TP."""
PARTS = ("weights", "optimizer", "grads", "compute_copy", "activations", "loss", "backward")
"""What `stage_memory` splits a peak into (they add up to its total; under LORO also
`loro.EXACT_STEP`)."""


def stage_layers(n_layers: int, pp: int) -> list[int]:
    """Blocks of each stage as TorchTitan 0.2.2 splits them
    (`generate_llm_fqn_per_model_part`, the embedding and the norm + lm_head weighing one
    block each)."""
    if pp == 1:
        return [n_layers]
    effective = n_layers + 2
    base, extra = divmod(effective, pp)
    counts, left = [], n_layers
    for s in range(pp):
        take = base + (s < extra) - (s == 0) - (s == pp - 1)
        take = min(max(take, 0), left)
        counts.append(take)
        left -= take
    return counts


def split_error(n_layers: int, pp: int) -> str | None:
    """Why TorchTitan cannot split `n_layers` into `pp` stages, or None."""
    if pp == 1:
        return None
    base = (n_layers + 2) // pp
    if base < 1:
        return f"pp {pp} exceeds the {n_layers + 2} stage units (layers + embedding + head)"
    if any(n < 1 for n in stage_layers(n_layers, pp)):
        return f"pp {pp} leaves a stage without blocks ({n_layers} layers)"
    return None


def _end_params(args: ModelShape, plan: TrainingLayout) -> tuple[int, int]:
    """(embedding, final norm + lm_head) parameters on one rank."""
    btp = plan.strategy == "btp"
    embedding = args.vocab_size * args.dim // (plan.tp if btp else 1)
    head = args.vocab_size * args.dim // plan.tp + args.dim // (plan.tp if btp else 1)
    return embedding, head


def stage_params(args: ModelShape, plan: TrainingLayout, stage: int) -> int:
    """Parameters on one rank of pipeline stage `stage`."""
    embedding, head = _end_params(args, plan)
    blocks = stage_layers(args.n_layers, plan.pp)[stage] * layer_params(args, plan)
    return blocks + embedding * (stage == 0) + head * (stage == plan.pp - 1)


def in_flight(plan: TrainingLayout, stage: int) -> int:
    """Micro-batches whose activations 1F1B keeps on `stage` at its peak."""
    return min(plan.pp - stage, plan.microbatches)


def forward_saved_bytes(args: ModelShape, plan: TrainingLayout, stage: int = 0) -> int:
    """Bytes one micro-batch's forward keeps for backward on one rank of `stage`: its
    blocks (`activations.activation_bytes` each) and the model's ends on it
    (`activations.end_activations`): what `runtime.saved_activations` measures of a forward
    (with RMSNorm saving what CUDA's fused kernel saves)."""
    blocks = stage_layers(args.n_layers, plan.pp)[stage] * activation_bytes(args, plan)
    return blocks + sum(end_activations(args, plan, stage).values())


def _recomputed(args: ModelShape, plan: TrainingLayout) -> int:
    """Bytes a block's backward rebuilds under `plan.ac` (none: nothing)."""
    if plan.ac == "none":
        return 0
    none = activation_bytes(args, TrainingLayout(**{**plan.__dict__, "ac": "none"}))
    return max(0, none - activation_bytes(args, plan))


def ring_buffers(args: ModelShape, plan: TrainingLayout) -> int:
    """CP's transient buffers in one block's attention backward: the all-gathered K/V of
    the whole sequence, the rank's fp32 dK/dV accumulators and the pass in flight (0 without
    CP)."""
    if plan.cp == 1:
        return 0
    kv_local = 2 * plan.tokens * kv_width(args, plan)
    return kv_local * (plan.cp * plan.dtype_bytes + 2 * FP32)


@dataclass(frozen=True)
class StageMemory:
    """Peak bytes on one rank of one pipeline stage, by `PARTS`."""

    stage: int
    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())


def stage_memory(
    args: ModelShape, plan: TrainingLayout, stage: int = 0, dp_shard: int = 1
) -> StageMemory:
    """The peak of one rank of `stage` (module docstring), by part."""
    dp_shard *= plan.cp  # TorchTitan's FSDP mesh is dp_shard x cp
    state, last = plan.state, stage == plan.pp - 1
    n = stage_params(args, plan, stage)
    block = layer_params(args, plan)
    _, head = _end_params(args, plan)
    copy = COPY_BYTES[state]
    one_copy = copy * (head + block)  # FSDP: one block's and the final norm + lm_head's
    kept = plan.pp > 1 or dp_shard == 1  # kept across the step's micro-batches
    forward_copy = copy * n if kept else one_copy
    # the last micro-batch's backward frees each unit's copy after its backward
    end_copy = copy * n if kept and plan.microbatches > 1 else one_copy
    layers = stage_layers(args.n_layers, plan.pp)[stage]
    activations = activation_bytes(args, plan) * layers * in_flight(plan, stage)
    t, vocab = plan.tokens, args.vocab_size // plan.tp
    residual = args.dim // plan.tp if plan.strategy == "btp" else args.dim
    per_logit = LOSS_PARALLEL_BYTES if plan.tp > 1 else LOSS_BYTES
    loss = (per_logit * vocab + plan.dtype_bytes * residual) * t if last else 0
    backward = block * (copy + MASTER_BYTES[state]) + _recomputed(args, plan)
    backward += ring_buffers(args, plan)
    grads = MASTER_BYTES[state] * n // dp_shard
    # a forward that follows a backward (accumulation, 1F1B's steady state) finds every grad
    held = grads if plan.microbatches > in_flight(plan, stage) else 0
    phases = [  # (compute copy, grads, activations, loss, backward) at each candidate peak
        (forward_copy, held, activations, loss, 0),  # the loss: end of forward
        (forward_copy, held, activations, 0, backward),  # the first block's backward
        (end_copy, grads, 0, 0, backward),  # the last block's backward: every gradient
    ]
    names = ("compute_copy", "grads", "activations", "loss", "backward")
    if plan.loro_exact_every:  # the optimizer step: every gradient, no copy or activation
        names += (loro.EXACT_STEP,)
        exact = loro.transient_bytes(args, plan, layers, dp_shard)
        phases = [(*p, 0) for p in phases] + [(0, grads, 0, 0, 0, exact)]
    peak = max(phases, key=sum)
    fixed = {
        "weights": MASTER_BYTES[state] * n // dp_shard,
        "optimizer": MOMENT_BYTES[state] * n // dp_shard,
    }
    return StageMemory(stage, fixed | dict(zip(names, peak, strict=True)))


def peak_memory(args: ModelShape, plan: TrainingLayout, dp_shard: int = 1) -> StageMemory:
    """The busiest stage's peak (ties: the first)."""
    stages = [stage_memory(args, plan, s, dp_shard) for s in range(plan.pp)]
    return max(stages, key=lambda m: m.total)
