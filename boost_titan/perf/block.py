"""What one transformer block (and the model's ends) runs on one rank per micro-batch, under
megatron, vanilla low-rank and BTP tensor parallelism: its GEMMs, collectives, widths,
FLOPs and parameters, as plain records (`work`) that `timing` prices.

Conventions (per rank and per micro-batch unless said otherwise; T = micro_batch * seq_len
/ cp, the rank's share of the tokens under context parallelism):
- Collectives are those our plans issue (see `layer_collectives`); a payload is the tensor
  a rank hands to the collective: T * elements_per_token * dtype bytes.
- FLOPs: 2*M*N*K for every GEMM on the local shard; attention 4*T*seq_len*d_attn (QK^T and
  AV: the rank's queries against every key) with the causal mask NOT halved, the usual MFU
  convention. Vanilla runs attention on all heads on every rank. Backward GEMMs = 2x
  forward (dX and dW). CP's K/V ring: `ring_bytes`, behind attention as
  `timing.ring_times` says.
"""

from __future__ import annotations

from boost_titan.boost_llama.shapes import PROJECTIONS, ModelShape, projection_params
from boost_titan.perf.layout import TrainingLayout
from boost_titan.perf.work import Collective, Gemm, Stream, Widths

NORM_FED = ("q", "gate")
"""The first projection after each RMSNorm: its group's all-reduce carries the online
statistic (grouped or not), and sync RMSNorm's own all-reduce sits before it."""
SHARED_INPUTS = (("q", "k", "v"), ("o",), ("gate", "up"), ("down",))
"""Projections grouped by the input they consume (the two norm outputs, o's, down's)."""
GROUP_MEMBERS = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}
"""The projections of each grouped first GEMM, by the GEMM's name."""
_NORM_CONSUMERS = ("q", "k", "v", "gate", "up")
FP32_BYTES = 4
"""Statistics kept in fp32 whatever the training dtype: RMSNorm's rstd, attention's
log-sum-exp, sync RMSNorm's upcasts."""


def _all_reduce(name: str, elements: int, behind: tuple[str, ...] = ()) -> Collective:
    return Collective("all_reduce", name, elements, behind)


def _grouped(plan: TrainingLayout) -> bool:
    """A norm's consumers run their first GEMMs as one (without TP the model runs as
    written: one GEMM per projection)."""
    return plan.group_linears and plan.tp > 1


def _groups(plan: TrainingLayout) -> list[tuple[str, ...]]:
    """Projections whose first GEMMs run as one GEMM (and one all-reduce)."""
    if _grouped(plan):
        return list(SHARED_INPUTS)
    return [(p,) for p in PROJECTIONS]


def group_name(group: tuple[str, ...]) -> str:
    """The name of the GEMM (and all-reduce) a group of projections shares."""
    return next((name for name, m in GROUP_MEMBERS.items() if m == group), "_".join(group))


def norm_mode(plan: TrainingLayout) -> str:
    """How the block's pre-norms run: replicated, or BTP's online / sync."""
    return plan.rmsnorm if plan.strategy == "btp" and plan.tp > 1 else "replicated"


def layer_collectives(
    args: ModelShape, plan: TrainingLayout
) -> tuple[list[Collective], list[Collective]]:
    """Collectives of one block, forward and backward, in issue order.

    megatron: all-reduce after row-parallel o and down; backward, the grads of the two norm
    outputs feeding column-parallel q/k/v and gate/up (independent of grouping).
    vanilla: every row-parallel B all-reduces its full output; backward, the input grads of
    the column-parallel A's, once per input they share (grouped or not).
    btp: every row-parallel A group all-reduces at the rank; online RMSNorm appends its
    statistic (+1, in the activation dtype) to the first group after each norm, sync
    RMSNorm adds one all-reduce of [T, 1] per norm each way; backward, the input grads of
    the column-parallel B's (one per group).
    Every backward input-grad all-reduce runs behind the weight-grad GEMMs of the
    column-parallel GEMMs whose input grads it sums (`Collective.behind`).
    """
    if plan.tp == 1:
        return [], []
    shapes, groups, r = args.projection_shapes(), _groups(plan), args.effective_rank
    if plan.strategy == "megatron":
        fwd = [_all_reduce("o", shapes["o"][1]), _all_reduce("down", shapes["down"][1])]
        bwd = [
            _all_reduce("gate_up", shapes["gate"][0], _firsts(plan, ("gate", "up"), "")),
            _all_reduce("qkv", shapes["q"][0], _firsts(plan, ("q", "k", "v"), "")),
        ]
        return fwd, bwd
    if plan.strategy == "vanilla":
        fwd = [_all_reduce(f"{p}.B", shapes[p][1]) for p in PROJECTIONS]
        bwd = [
            _all_reduce(f"{group_name(g)}.A", shapes[g[0]][0], _firsts(plan, g, ".A"))
            for g in reversed(SHARED_INPUTS)
        ]
        return fwd, bwd
    norms = {"q": "attention_norm", "gate": "ffn_norm"}
    fwd, bwd = [], []
    for group in groups:
        name, stat = group_name(group), 0
        if group[0] in NORM_FED and plan.rmsnorm == "sync":
            fwd.append(_all_reduce(norms[group[0]], 1))
        elif group[0] in NORM_FED:
            stat = 1
        fwd.append(_all_reduce(f"{name}.A", r * len(group) + stat))
    for group in reversed(groups):
        bwd.append(
            _all_reduce(f"{group_name(group)}.B", r * len(group), tuple(f"{p}.B" for p in group))
        )
        if group[0] in NORM_FED and plan.rmsnorm == "sync":
            bwd.append(_all_reduce(norms[group[0]], 1))
    return fwd, bwd


def _firsts(plan: TrainingLayout, members: tuple[str, ...], suffix: str) -> tuple[str, ...]:
    """Names of the first GEMMs of `members` (grouped: theirs is one GEMM)."""
    if _grouped(plan) and len(members) > 1:
        return (group_name(members) + suffix,)
    return tuple(p + suffix for p in members)


def step_collectives(
    args: ModelShape, plan: TrainingLayout
) -> tuple[list[Collective], list[Collective]]:
    """Model-level collectives per micro-batch: output side of the model and loss parallel.

    Every strategy ends in a vocab-parallel lm_head whose loss-parallel cross entropy
    all-reduces three [T] statistics (max, sum of exp, target logit). btp first runs the
    final norm as a sync RMSNorm on the sharded residual and all-gathers it ([T, d/tp] in,
    reduce-scatter of [T, d] backward); megatron/vanilla hold a replicated residual and
    all-reduce the lm_head input grad behind its weight-grad GEMM. Embeddings (btp: sharded
    on the embedding dim; others: replicated) need no communication.
    """
    if plan.tp == 1:
        return [], []
    d = args.dim
    loss = [_all_reduce(f"loss.{stat}", 1) for stat in ("max", "sumexp", "target")]
    if plan.strategy == "btp":
        fwd = [
            _all_reduce("final_norm", 1),
            Collective("all_gather", "final_gather", d // plan.tp),
            *loss,
        ]
        bwd = [Collective("reduce_scatter", "final_gather", d), _all_reduce("final_norm", 1)]
        return fwd, bwd
    return loss, [_all_reduce("lm_head", d, ("lm_head",))]


def pipeline_send_elements(args: ModelShape, plan: TrainingLayout) -> int:
    """Elements per token one rank sends across a stage boundary (btp's residual is sharded)."""
    return args.dim // plan.tp if plan.strategy == "btp" else args.dim


def layer_gemms(args: ModelShape, plan: TrainingLayout) -> list[Gemm]:
    """Forward GEMMs of one block on one rank, in execution order. Grouped, a norm's
    consumers run their first GEMMs as one (megatron: q/k/v and gate/up themselves;
    low-rank: their A's)."""
    t, tp, shapes = plan.tokens, plan.tp, args.projection_shapes()
    if plan.strategy == "megatron":
        gemms = []
        for group in _groups(plan):
            if group[0] in ("o", "down"):  # row-parallel
                gemms.append(Gemm(group[0], t, shapes[group[0]][1], shapes[group[0]][0] // tp))
            else:  # column-parallel
                n = sum(shapes[p][1] for p in group) // tp
                gemms.append(Gemm(group_name(group), t, n, shapes[group[0]][0]))
        return gemms
    r, gemms = args.effective_rank, []
    for group in _groups(plan):
        d_in = shapes[group[0]][0]
        if plan.strategy == "btp":
            gemms.append(Gemm(f"{group_name(group)}.A", t, r * len(group), d_in // tp))
            gemms += [Gemm(f"{p}.B", t, shapes[p][1] // tp, r) for p in group]
        else:
            gemms.append(Gemm(f"{group_name(group)}.A", t, r // tp * len(group), d_in))
            gemms += [Gemm(f"{p}.B", t, shapes[p][1], r // tp) for p in group]
    return gemms


def layer_widths(args: ModelShape, plan: TrainingLayout) -> Widths:
    """Per-rank widths of one block's activations: btp shards the residual and keeps
    latents whole; vanilla keeps activations whole and shards latents; megatron shards
    heads and the MLP."""
    tp, shapes = plan.tp, args.projection_shapes()
    replicated = plan.strategy == "vanilla"
    split = 1 if replicated else tp
    latent = 0
    if args.low_rank:
        latent = args.effective_rank // tp if replicated else args.effective_rank
    return Widths(
        residual=args.dim // tp if plan.strategy == "btp" else args.dim,
        q=shapes["q"][1] // split,
        kv=shapes["k"][1] // split,
        ffn=args.ffn_dim // split,
        latent=latent,
        grouped=_grouped(plan),
        silu_latents=args.low_rank and args.activation == "silu",
        silu_gate=not (args.low_rank and args.activation == "silu"),
        shared_silu=plan.tp > 1 and (plan.strategy == "btp" or _grouped(plan)),
        interleaved_rope=plan.interleaved_rope,
    )


def attention_flops(args: ModelShape, plan: TrainingLayout) -> int:
    """Forward QK^T and AV of one block on one rank (causal mask not halved): the rank's
    T/cp queries against the whole sequence's keys (under CP, head-tail load balancing
    gives every rank the same share of the causal triangle)."""
    heads_per_rank = args.n_heads if plan.strategy == "vanilla" else args.n_heads // plan.tp
    return 4 * plan.tokens * plan.seq_len * heads_per_rank * args.head_dim


def kv_width(args: ModelShape, plan: TrainingLayout) -> int:
    """Elements per token of one rank's keys (and of its values): the un-repeated K/V heads
    (GQA's n_kv_heads), sharded over tp except by vanilla (all heads on every rank)."""
    width = args.kv_heads * args.head_dim
    return width if plan.strategy == "vanilla" else width // plan.tp


def ring_bytes(args: ModelShape, plan: TrainingLayout) -> tuple[int, int]:
    """Bytes one rank receives through CP's ring per block and micro-batch, (forward,
    backward), as torch's ring attention runs it (`_templated_ring_attention`, TorchTitan's
    default allgather rotation): forward, one all-gather of the un-repeated K/V, of which a
    rank receives (cp - 1)/cp of the whole sequence's K/V volume; backward, that all-gather
    again plus cp passes of the rank's dK/dV accumulators (fp32) around the ring."""
    if plan.cp == 1:
        return 0, 0
    kv_local = 2 * plan.tokens * kv_width(args, plan)  # K and V, elements
    gather = (plan.cp - 1) * kv_local * plan.dtype_bytes
    return gather, gather + plan.cp * kv_local * FP32_BYTES


def layer_flops(args: ModelShape, plan: TrainingLayout) -> int:
    """Forward FLOPs of one block on one rank."""
    return sum(g.flops for g in layer_gemms(args, plan)) + attention_flops(args, plan)


def recompute_flops(args: ModelShape, plan: TrainingLayout) -> int:
    """Extra backward FLOPs of one block per rank caused by `plan.ac`."""
    if plan.ac in ("full", "selective"):
        return layer_flops(args, plan) // (2 if plan.ac == "selective" else 1)
    if plan.ac == "none":
        return 0
    b_gemms = sum(g.flops for g in layer_gemms(args, plan) if g.name.endswith(".B"))
    return b_gemms + (attention_flops(args, plan) if plan.cp == 1 else 0)


def layer_params(args: ModelShape, plan: TrainingLayout) -> int:
    """Parameters of one block on one rank: every projection is sharded over tp; the two
    norm weights are sharded by btp, replicated by megatron/vanilla."""
    norms = 2 * args.dim // (plan.tp if plan.strategy == "btp" else 1)
    return norms + sum(projection_params(args, p, 0) for p in PROJECTIONS) // plan.tp


def params_per_rank(args: ModelShape, plan: TrainingLayout) -> int:
    """Parameters on the busiest rank: its stage's blocks plus embedding and/or head."""
    tp, btp = plan.tp, plan.strategy == "btp"
    embedding = args.vocab_size * args.dim // (tp if btp else 1)
    head = args.vocab_size * args.dim // tp + args.dim // (tp if btp else 1)
    ends = embedding + head if plan.pp == 1 else max(embedding, head)
    return _layers_per_stage(args, plan) * layer_params(args, plan) + ends


def _layers_per_stage(args: ModelShape, plan: TrainingLayout) -> int:
    return -(-args.n_layers // plan.pp)


def stage_sizes(args: ModelShape, plan: TrainingLayout) -> list[int]:
    """Blocks per pipeline stage as the time model splits them: the first stages take the
    remainder (`memory.stage_layers` is TorchTitan's split, which the memory model uses)."""
    base, extra = divmod(args.n_layers, plan.pp)
    return [base + (s < extra) for s in range(plan.pp)]


def stage_ranges(args: ModelShape, plan: TrainingLayout) -> list[range]:
    """Block indices of each pipeline stage."""
    ends = [sum(stage_sizes(args, plan)[: s + 1]) for s in range(plan.pp)]
    return [range(end - n, end) for end, n in zip(ends, stage_sizes(args, plan), strict=True)]


def weight_streams(args: ModelShape, plan: TrainingLayout) -> list[Stream]:
    """Weight-sized memory-bound kernels of one block per micro-batch: grouped first GEMMs
    concatenate their weight shards every forward; BTP's online RMSNorm scales its
    down-projections' weight grads by the norm weight."""
    b, streams = plan.dtype_bytes, []
    online = norm_mode(plan) == "online"
    for g in layer_gemms(args, plan):
        base = g.name.removesuffix(".A")
        weight = 2 * g.n * g.k * b  # read + write
        if _grouped(plan) and base in GROUP_MEMBERS:
            streams.append(Stream(f"{base}.concat_weights", weight))
        if (
            online
            and g.name.endswith(".A")
            and GROUP_MEMBERS.get(base, (base,))[0] in _NORM_CONSUMERS
        ):
            streams.append(Stream(f"{base}.scale_weight_grad", weight))
    return streams
