"""Seconds of a training step under megatron, vanilla low-rank and BTP tensor parallelism:
a block, the model's ends, each pipeline stage, the step (`step_time`).

Every kernel class of `block`'s lists is priced by `costs` on a `gpus` profile: GEMMs on a
roofline with a derived shape-dependent efficiency, memory-bound kernels (`streams`) by
bytes over sustained HBM bandwidth, causal flash attention, one launch per kernel,
collectives on NCCL's ring model, pipeline sends over the network, the optimizer by bytes
per parameter; float8 GEMMs (`float8_costs`) at the float8 rate after their casts; the
host's launches beyond the GPU's work by `host`. Overlap is what the plans do: each
backward input-grad all-reduce of a column-parallel group runs behind that group's
weight-grad GEMMs; with `overlap_chunks` k > 1 each forward all-reduce that a GEMM
produces goes in k row blocks, block j's all-reduce behind block j+1's GEMM
(`chunked_exposed`); everything else is exposed. A step is `microbatches` micro-batches
through a 1F1B pipeline (fill and drain: the bubble) plus gradient clipping and one AdamW
update. STATE_BYTES is the time model's view of the state: the bytes its gradient and
optimizer traffic moves.
"""

from __future__ import annotations

from boost_titan.boost_llama.shapes import ModelShape
from boost_titan.perf import costs, float8_costs, host, loro
from boost_titan.perf.block import (
    FP32_BYTES,
    attention_flops,
    kv_width,
    layer_collectives,
    layer_gemms,
    layer_widths,
    norm_mode,
    params_per_rank,
    pipeline_send_elements,
    stage_ranges,
    stage_sizes,
    step_collectives,
    weight_streams,
)
from boost_titan.perf.float8_costs import float8_cast_streams, selection_counts
from boost_titan.perf.gpus import FLOAT8, GpuProfile
from boost_titan.perf.layout import BF16_WEIGHTS, TrainingLayout
from boost_titan.perf.streams import block_streams, embedding_streams, head_streams
from boost_titan.perf.work import Collective, Gemm, Stream

STATE_BYTES = {"bf16": (2, 2, 12), "fp32": (4, 4, 8), BF16_WEIGHTS: (2, 2, 4)}
"""Bytes per parameter of (weights, grads, optimizer state incl. any fp32 master copy), by
`TrainingLayout.state`."""
ADAMW_BYTES_PER_PARAM = {"bf16": 28, "fp32": 28, BF16_WEIGHTS: 14}
"""HBM traffic of one fused AdamW update per parameter (read master, grad, m, v; write
master, m, v, weight): 4+2+4+4+4+4+4+2 in bf16 training, 4+4+4+4+4+4+4 in fp32, and
2+2+2+2+2+2+2 in bf16 without master weights (no separate weight copy)."""
CLIP_GRAD_PASSES = 3
"""Gradient clipping reads every grad for the norm, then reads and writes it to scale."""
OPTIMIZER_LAUNCHES = 4
"""Fused multi-tensor kernels: grad norm, its reduction, scaling, AdamW."""
TIME_PARTS = ("gemm", "memory", "attention", "optimizer", "comm", "bubble", "host")
"""Classes a predicted step splits into; they add up to the step time. comm is the
communication nothing hides (TP collectives not overlapped, pipeline sends); host the time
the GPU waits for the host to launch kernels (`host`)."""


def time_parts(plan: TrainingLayout) -> tuple[str, ...]:
    """The parts `step_time` splits `plan`'s step into: `TIME_PARTS`, and under LORO its
    exact step amortised over K (`loro.EXACT_STEP`)."""
    return TIME_PARTS + (loro.EXACT_STEP,) * bool(plan.loro_exact_every)


def _gemm_time(g: Gemm, plan: TrainingLayout, gpu: GpuProfile) -> float:
    return costs.gemm_time(g, plan.dtype, plan.dtype_bytes, gpu)


def _collective_time(c: Collective, plan: TrainingLayout, gpu: GpuProfile) -> float:
    return costs.collective_time(c.kind, c.bytes(plan.tokens, plan.dtype_bytes), plan.tp, gpu)


def overlapped(
    collectives: list[Collective],
    weight_grads: dict[str, float],
    plan: TrainingLayout,
    gpu: GpuProfile,
) -> tuple[float, float]:
    """(exposed, hidden) seconds of `collectives`: each runs behind the weight-grad GEMMs
    named in its `behind`, and only what outlasts them is exposed."""
    exposed = hidden = 0.0
    for c in collectives:
        cost = _collective_time(c, plan, gpu)
        cover = sum(weight_grads[name] for name in c.behind)
        exposed += max(0.0, cost - cover)
        hidden += min(cost, cover)
    return exposed, hidden


def chunked_exposed(gemm_s: float, c: Collective, plan: TrainingLayout, gpu: GpuProfile) -> float:
    """Exposed seconds of forward all-reduce `c` produced by a GEMM of `gemm_s` seconds,
    both cut into `overlap_chunks` k row blocks: the GEMM blocks g = gemm_s / k and the
    all-reduce blocks a (each on T / k tokens, latency included) form a two-stage pipeline,
    g + (k - 1) max(g, a) + a in all, of which k g is the GEMM's own time."""
    k = plan.overlap_chunks
    if k == 1:
        return _collective_time(c, plan, gpu)
    g = gemm_s / k
    a = costs.collective_time(c.kind, c.bytes(plan.tokens, plan.dtype_bytes) / k, plan.tp, gpu)
    return (k - 1) * (max(g, a) - g) + a


def block_phases(
    args: ModelShape, plan: TrainingLayout, gpu: GpuProfile, selected: frozenset[str] = frozenset()
) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds of one block per micro-batch on one rank by class, (forward, backward): gemm,
    memory, attention, comm (exposed) and, in backward, comm_hidden (collective time behind
    weight-grad GEMMs) and what `ac` recomputes. The forward GEMMs named in `selected` run
    in float8 (`float8_selection`), with their casts as memory-bound work."""
    gemms = layer_gemms(args, plan)
    weight_grad_f8 = bool(selected) and float8_costs.recipe_shape(plan.float8)[0] == 3

    def seconds(g: Gemm, in_float8: bool) -> float:
        if in_float8:
            return costs.gemm_time(g, FLOAT8, plan.dtype_bytes, gpu)
        return _gemm_time(g, plan, gpu)

    gemm_fwd = {g.name: seconds(g, g.name in selected) for g in gemms}
    input_grads = sum(seconds(g.backward()[0], g.name in selected) for g in gemms)
    weight_grads = {
        g.name: seconds(g.backward()[1], weight_grad_f8 and g.name in selected) for g in gemms
    }
    attention = attention_flops(args, plan)
    attn_fwd = costs.attention_time(attention, plan.dtype, gpu)
    attn_bwd = costs.attention_time(attention, plan.dtype, gpu, backward=True)
    fwd_streams, bwd_streams = block_streams(
        layer_widths(args, plan), norm_mode(plan), plan.dtype_bytes
    )
    casts = float8_cast_streams(args, plan, selected)
    cast_fwd = [s for fwd, _ in casts.values() for s in fwd]
    cast_bwd = [s for _, bwd in casts.values() for s in bwd]
    mem_fwd = costs.stream_time(fwd_streams, gpu, plan.tokens) + costs.stream_time(cast_fwd, gpu)
    mem_bwd = costs.stream_time(bwd_streams, gpu, plan.tokens) + costs.stream_time(cast_bwd, gpu)
    weights = weight_streams(args, plan)
    concat = [w for w in weights if w.name.endswith(".concat_weights")]
    scale = [w for w in weights if not w.name.endswith(".concat_weights")]
    fwd_c, bwd_c = layer_collectives(args, plan)
    comm_fwd = sum(
        chunked_exposed(gemm_fwd[c.name], c, plan, gpu)
        if c.name in gemm_fwd
        else _collective_time(c, plan, gpu)
        for c in fwd_c
    )
    comm_bwd, hidden = overlapped(bwd_c, weight_grads, plan, gpu)
    (ring_fwd, ring_fwd_hidden), (ring_bwd, ring_bwd_hidden) = ring_times(
        args, plan, gpu, attn_fwd, attn_bwd
    )
    forward = {
        "gemm": sum(gemm_fwd.values()),
        "memory": mem_fwd + costs.stream_time(concat, gpu),
        "attention": attn_fwd,
        "comm": comm_fwd + ring_fwd,
    }
    backward = {
        "gemm": input_grads + sum(weight_grads.values()),
        "memory": mem_bwd + costs.stream_time(scale, gpu),
        "attention": attn_bwd,
        "comm": comm_bwd + ring_bwd,
        "comm_hidden": hidden + ring_fwd_hidden + ring_bwd_hidden,
    }
    b_gemms = sum(t for name, t in gemm_fwd.items() if name.endswith(".B"))
    a_casts = costs.stream_time(
        [s for name, (fwd, _) in casts.items() if not name.endswith(".B") for s in fwd], gpu
    )
    replay = _recomputed(
        plan, sum(gemm_fwd.values()), b_gemms, attn_fwd, mem_fwd, comm_fwd, a_casts, ring_fwd
    )
    return forward, {k: v + replay.get(k, 0.0) for k, v in backward.items()}


def ring_times(
    args: ModelShape, plan: TrainingLayout, gpu: GpuProfile, attn_fwd: float, attn_bwd: float
) -> tuple[tuple[float, float], tuple[float, float]]:
    """(exposed, hidden) seconds of CP's ring per block and micro-batch, (forward,
    backward), for the traffic of `ring_bytes`. Torch's ring runs cp attention steps: the
    K/V all-gather is issued before the first (on the rank's own chunk) and waited for
    before the second, so it hides behind one step (`attn / cp`); in backward each dK/dV
    pass hides behind the next step and the last is exposed. The CP group is inside one
    node when tp x cp GPUs fit one (TorchTitan's mesh puts tp innermost, cp next), else its
    traffic crosses the network."""
    if plan.cp == 1:
        return (0.0, 0.0), (0.0, 0.0)
    cp, in_node = plan.cp, plan.tp * plan.cp <= gpu.gpus_per_node
    kv_local = 2 * plan.tokens * kv_width(args, plan)
    gather = costs.gather_time(kv_local * plan.dtype_bytes, cp, gpu, in_node)
    grads = costs.pass_time(kv_local * FP32_BYTES, gpu, in_node)
    step_fwd, step_bwd = attn_fwd / cp, attn_bwd / cp
    forward = (max(0.0, gather - step_fwd), min(gather, step_fwd))
    exposed = max(0.0, gather - step_bwd) + (cp - 1) * max(0.0, grads - step_bwd) + grads
    hidden = min(gather, step_bwd) + (cp - 1) * min(grads, step_bwd)
    return forward, (exposed, hidden)


def block_time(
    args: ModelShape, plan: TrainingLayout, gpu: GpuProfile, selected: frozenset[str] = frozenset()
) -> dict[str, float]:
    """Seconds of one block per micro-batch on one rank, forward + backward (+ what `ac`
    recomputes), by class: gemm, memory, attention, comm (exposed) and comm_hidden
    (`block_phases` summed)."""
    forward, backward = block_phases(args, plan, gpu, selected)
    return {k: forward.get(k, 0.0) + v for k, v in backward.items()}


def _recomputed(
    plan: TrainingLayout,
    gemm_fwd: float,
    b_gemms: float,
    attn_fwd: float,
    mem_fwd: float,
    comm_fwd: float,
    a_casts: float,
    ring_fwd: float = 0.0,
) -> dict[str, float]:
    """Extra backward seconds per block by class: full replays the forward with its
    collectives (CP's K/V all-gather `ring_fwd` included); selective half of that; lowrank
    the B GEMMs (with their float8 casts), attention (not under CP: it keeps the ring's
    output, `ring_kept`) and the element-wise work, not the A GEMMs' float8 casts
    `a_casts` (vanilla also replays its B all-reduces, which sit inside the recomputed
    segments)."""
    if plan.ac == "none":
        return {}
    if plan.ac in ("full", "selective"):
        share = 0.5 if plan.ac == "selective" else 1.0
        return {
            "gemm": share * gemm_fwd,
            "attention": share * attn_fwd,
            "memory": share * mem_fwd,
            "comm": share * (comm_fwd + ring_fwd),
        }
    return {
        "gemm": b_gemms,
        "attention": attn_fwd if plan.cp == 1 else 0.0,
        "memory": mem_fwd - a_casts,
        "comm": comm_fwd if plan.strategy == "vanilla" else 0.0,
    }


def ends_time(
    args: ModelShape, plan: TrainingLayout, gpu: GpuProfile
) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per micro-batch of the model's ends, by class: (embedding, on the first
    stage; final norm + lm_head + cross-entropy + their collectives, on the last)."""
    b, t, btp = plan.dtype_bytes, plan.tokens, plan.strategy == "btp"
    residual = args.dim // plan.tp if btp else args.dim
    emb_fwd, emb_bwd = embedding_streams(residual, b)
    grad_bytes = STATE_BYTES[plan.state][1]
    zero_grad = Stream("embedding.zero_grad", args.vocab_size * residual * grad_bytes)
    embedding = {
        "memory": costs.stream_time(emb_fwd + emb_bwd, gpu, t) + costs.stream_time([zero_grad], gpu)
    }

    head = Gemm("lm_head", t, args.vocab_size // plan.tp, args.dim)
    dx, dw = head.backward()
    norm = "sync" if btp and plan.tp > 1 else "replicated"
    head_fwd, head_bwd = head_streams(residual, args.vocab_size // plan.tp, norm, b)
    fwd_c, bwd_c = step_collectives(args, plan)
    comm_bwd, hidden = overlapped(bwd_c, {"lm_head": _gemm_time(dw, plan, gpu)}, plan, gpu)
    output = {
        "gemm": sum(_gemm_time(g, plan, gpu) for g in (head, dx, dw)),
        "memory": costs.stream_time(head_fwd + head_bwd, gpu, t),
        "comm": sum(_collective_time(c, plan, gpu) for c in fwd_c) + comm_bwd,
        "comm_hidden": hidden,
    }
    return embedding, output


def memory_kernels(args: ModelShape, plan: TrainingLayout, gpu: GpuProfile) -> dict[str, float]:
    """Seconds per step of each memory-bound kernel of the blocks (forward and backward
    under one name) on a rank holding the most blocks (the first stage), largest first."""
    fwd, bwd = block_streams(layer_widths(args, plan), norm_mode(plan), plan.dtype_bytes)
    per_step = max(stage_sizes(args, plan)) * plan.microbatches
    seconds: dict[str, float] = {}

    def add(stream: Stream, s: float) -> None:
        name = stream.name.removesuffix(".bwd")
        seconds[name] = seconds.get(name, 0.0) + s

    for stream in fwd + bwd:
        add(stream, per_step * costs.stream_time([stream], gpu, plan.tokens))
    for stream in weight_streams(args, plan):
        add(stream, per_step * costs.stream_time([stream], gpu))
    for selected, count in selection_counts(args, plan, stage_ranges(args, plan)[0]).items():
        for cast_fwd, cast_bwd in float8_cast_streams(args, plan, selected).values():
            for stream in cast_fwd + cast_bwd:
                add(stream, count * plan.microbatches * costs.stream_time([stream], gpu))
    return dict(sorted(seconds.items(), key=lambda item: -item[1]))


def stage_times(args: ModelShape, plan: TrainingLayout, gpu: GpuProfile) -> list[dict[str, float]]:
    """Seconds per micro-batch of each pipeline stage by class: its blocks, its ends,
    across stages receiving activations (forward) and grads (backward) over the network,
    and the host's launches beyond what the GPU's work hides (`host`)."""
    blocks: dict[frozenset[str], tuple[dict, dict, tuple[int, int]]] = {}
    embedding, output = ends_time(args, plan, gpu)
    send = costs.send_time(plan.tokens * pipeline_send_elements(args, plan) * plan.dtype_bytes, gpu)
    stages = []
    for s, layers in enumerate(stage_ranges(args, plan)):
        parts: dict[str, float] = {}
        phases = []
        for selected, count in selection_counts(args, plan, layers).items():
            if selected not in blocks:
                fwd, bwd = block_phases(args, plan, gpu, selected)
                blocks[selected] = (fwd, bwd, host.block_launches(args, plan, selected))
            fwd, bwd, launches = blocks[selected]
            phases.append((count, fwd, bwd, launches))
            for k, v in {**fwd, **{k: fwd.get(k, 0.0) + v for k, v in bwd.items()}}.items():
                parts[k] = parts.get(k, 0.0) + count * v
        ends: dict[str, float] = {}
        for end in [embedding] * (s == 0) + [output] * (s == plan.pp - 1):
            parts = {k: parts[k] + end.get(k, 0.0) for k in parts}
            ends = {k: ends.get(k, 0.0) + v for k, v in end.items()}
        parts["comm"] += ((s > 0) + (s < plan.pp - 1)) * send
        end_launches = host.ends_launches(args, plan, s)
        extra = host.stage_host(args, plan, gpu, s, phases, (ends, end_launches))
        for k, v in extra.items():
            parts[k] = parts.get(k, 0.0) + v
        stages.append(parts)
    return stages


def step_time(
    args: ModelShape, plan: TrainingLayout, gpu: GpuProfile, dp_shard: int = 1
) -> dict[str, float]:
    """Seconds per optimizer step: `time_parts(plan)` (which add up to `step`), plus
    comm_hidden (collective time the plans hide behind weight-grad GEMMs).

    1F1B: the slowest stage runs all micro-batches back to back; the others' time for
    one micro-batch is the fill and drain around it (the bubble). Then, on every rank,
    the grads of micro-batches after the first are accumulated, clipped, and AdamW steps
    (LORO's approximate step moves the same bytes; its exact step, over the factors'
    mesh of TP x `dp_shard` FSDP ranks, is `loro.amortised_seconds`).
    """
    stages = stage_times(args, plan, gpu)
    totals = [sum(v for k, v in s.items() if k != "comm_hidden") for s in stages]
    slowest = stages[totals.index(max(totals))]
    parts = {k: plan.microbatches * slowest.get(k, 0.0) for k in TIME_PARTS}
    parts["bubble"] = sum(totals) - max(totals)
    params, grad_bytes = params_per_rank(args, plan), STATE_BYTES[plan.state][1]
    accumulate = Stream("accumulate_grads", (plan.microbatches - 1) * 3 * params * grad_bytes)
    parts["memory"] += costs.stream_time([accumulate, host.weight_casts(args, plan)], gpu)
    update = params * (ADAMW_BYTES_PER_PARAM[plan.state] + CLIP_GRAD_PASSES * grad_bytes)
    parts["optimizer"] = costs.hbm_time(update, gpu) + OPTIMIZER_LAUNCHES * gpu.launch_s
    launches = host.optimizer_launches(host.rank_tensors(args, plan), plan.legacy_launches)
    launches += host.STEP_LAUNCHES
    parts["host"] += host.host_exposed(
        [host.Phase("optimizer", launches, parts["optimizer"])], gpu.host_launch_s
    )
    if plan.loro_exact_every:
        parts[loro.EXACT_STEP] = loro.amortised_seconds(args, plan, gpu, params, dp_shard)
    step = sum(parts.values())
    return parts | {"step": step, "comm_hidden": plan.microbatches * slowest["comm_hidden"]}
