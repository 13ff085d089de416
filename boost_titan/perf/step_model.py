"""Analytic model of a training step under megatron, vanilla low-rank and BTP tensor parallelism.

Conventions (per rank and per micro-batch unless said otherwise; T = micro_batch * seq_len
/ cp, the rank's share of the tokens under context parallelism):
- Collectives are those our plans issue (see `layer_collectives`); a payload is the tensor
  a rank hands to the collective: T * elements_per_token * dtype bytes.
- FLOPs: 2*M*N*K for every GEMM on the local shard; attention 4*T*seq_len*d_attn (QK^T and
  AV: the rank's queries against every key) with the causal mask NOT halved, the usual MFU
  convention. Vanilla runs attention on all heads on every rank. Backward GEMMs = 2x
  forward (dX and dW). CP's K/V ring: `ring_bytes`, behind attention as `ring_times` says.
- Activations (`saved_activations`): the storages autograd keeps, as `bench trace`
  measures them (with RMSNorm saving what its fused CUDA kernel saves).
- Memory: `memory` (peak per rank and pipeline stage, checked against torch's
  MemTracker by `bench memory --check`). STATE_BYTES is the time model's view of the
  state: the bytes its gradient and optimizer traffic moves.
- Float8 (`TrainingLayout.float8`, a torchao recipe): the per-rank GEMMs the runtime selects
  (`float8_costs`) run at the float8 rate, forward, input grad and (unless the recipe
  keeps it in high precision) weight grad, each after casting both operands to float8.
- Time (`step_time`): every kernel class priced by `costs` on a `gpus` profile: GEMMs on a
  roofline with a derived shape-dependent efficiency, memory-bound kernels (`streams`) by
  bytes over sustained HBM bandwidth, causal flash attention, one launch per kernel,
  collectives on NCCL's ring model, pipeline sends over the network, the optimizer by bytes
  per parameter. Overlap is what the plans do: each backward input-grad all-reduce of a
  column-parallel group runs behind that group's weight-grad GEMMs; with `overlap_chunks`
  k > 1 each forward all-reduce that a GEMM produces goes in k row blocks, block j's
  all-reduce behind block j+1's GEMM (`chunked_exposed`); everything else is exposed. A
  step is `microbatches` micro-batches through a 1F1B pipeline (fill and drain: the bubble)
  plus gradient clipping and one AdamW update.
"""

from __future__ import annotations

from boost_titan.boost_llama.shapes import (
    PAPER_VOCAB,
    PROJECTIONS,
    ModelShape,
    flavor_shape,
    projection_params,
)
from boost_titan.boost_llama.strategies import STRATEGIES as REGISTRY
from boost_titan.boost_llama.strategies import sizes as strategy_sizes
from boost_titan.config import AC_MODES, RMSNORM_MODES
from boost_titan.config.errors import ConfigError
from boost_titan.perf import costs, float8_costs, host
from boost_titan.perf.gpus import FLOAT8, GpuProfile
from boost_titan.perf.layout import BF16_WEIGHTS, DTYPE_BYTES, STRATEGIES, TrainingLayout
from boost_titan.perf.streams import block_streams, embedding_streams, head_streams
from boost_titan.perf.work import Collective, Gemm, Stream, Widths

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
NORM_FED = ("q", "gate")
"""The first projection after each RMSNorm: its group's all-reduce carries the online
statistic (grouped or not), and sync RMSNorm's own all-reduce sits before it."""
SHARED_INPUTS = (("q", "k", "v"), ("o",), ("gate", "up"), ("down",))
"""Projections grouped by the input they consume (the two norm outputs, o's, down's)."""
TIME_PARTS = ("gemm", "memory", "attention", "optimizer", "comm", "bubble", "host")
"""Classes a predicted step splits into; they add up to the step time. comm is the
communication nothing hides (TP collectives not overlapped, pipeline sends); host the time
the GPU waits for the host to launch kernels (`host`)."""


def _all_reduce(name: str, elements: int, behind: tuple[str, ...] = ()) -> Collective:
    return Collective("all_reduce", name, elements, behind)


# ---- configuration ---------------------------------------------------------------------
def model_args(flavor: str, arch: str, strategy: str) -> ModelShape:
    """The flavor's arguments as `strategy` trains them: megatron always trains the fullrank
    twin; a flavor without a vocabulary gets the paper's 32000."""
    args = flavor_shape(flavor, arch="fullrank" if strategy == "megatron" else arch)
    if not args.vocab_size:
        args.vocab_size = PAPER_VOCAB
    args.validate()
    return args


def check(args: ModelShape, plan: TrainingLayout) -> None:
    """Raise ConfigError (one line, with the fix) for a plan the model cannot describe."""
    choices = {
        "strategy": (plan.strategy, STRATEGIES),
        "ac": (plan.ac, AC_MODES),
        "dtype": (plan.dtype, tuple(DTYPE_BYTES)),
        "rmsnorm": (plan.rmsnorm, RMSNORM_MODES),
        "float8 casts": (plan.float8_casts, float8_costs.CASTS),
    }
    for option, (value, allowed) in choices.items():
        if value not in allowed:
            raise ConfigError(f"unknown {option} {value!r}; choose one of {', '.join(allowed)}")
    if args.arch == "lax":
        raise ConfigError(
            "the perf model covers fullrank, svd and cola; LaX's crossing is not modelled, "
            "use --arch cola"
        )
    if plan.strategy != "megatron" and not args.low_rank:
        raise ConfigError(
            f"strategy {plan.strategy} needs a low-rank arch (svd or cola); "
            "fullrank trains with megatron"
        )
    if plan.ac == "lowrank" and plan.strategy == "megatron":
        raise ConfigError(
            "ac lowrank keeps bottleneck latents, which megatron's fullrank model lacks; "
            "use --ac full or selective"
        )
    if not 1 <= plan.tp <= 8:
        raise ConfigError(
            f"tp {plan.tp} must be 1..8: tensor parallelism stays inside one NVLink node"
        )
    if not 1 <= plan.pp <= args.n_layers:
        raise ConfigError(f"pp {plan.pp} must be 1..{args.n_layers} (the number of layers)")
    if min(plan.seq_len, plan.micro_batch, plan.microbatches) < 1:
        raise ConfigError("seq_len, micro_batch and microbatches must be positive")
    if plan.cp < 1:
        raise ConfigError(f"cp {plan.cp} must be >= 1")
    if plan.cp > 1 and plan.seq_len % (2 * plan.cp):
        raise ConfigError(
            f"seq_len {plan.seq_len} is not divisible by 2 x cp {plan.cp} (head-tail load "
            "balancing gives each rank two chunks); pick a cp that divides seq_len / 2"
        )
    sizes = strategy_sizes(args)
    for name in REGISTRY[plan.strategy].divisible:
        if sizes[name] % plan.tp:
            size = sizes[name]
            raise ConfigError(
                f"{name} {size} is not divisible by tp {plan.tp}; pick a tp that divides it"
            )


def _grouped(plan: TrainingLayout) -> bool:
    """A norm's consumers run their first GEMMs as one (without TP the model runs as
    written: one GEMM per projection)."""
    return plan.group_linears and plan.tp > 1


def _groups(plan: TrainingLayout) -> list[tuple[str, ...]]:
    """Projections whose first GEMMs run as one GEMM (and one all-reduce)."""
    if _grouped(plan):
        return list(SHARED_INPUTS)
    return [(p,) for p in PROJECTIONS]


def _group_name(group: tuple[str, ...]) -> str:
    return {("q", "k", "v"): "qkv", ("gate", "up"): "gate_up"}.get(group, "_".join(group))


# ---- communication ---------------------------------------------------------------------
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
            _all_reduce(f"{_group_name(g)}.A", shapes[g[0]][0], _firsts(plan, g, ".A"))
            for g in reversed(SHARED_INPUTS)
        ]
        return fwd, bwd
    norms = {"q": "attention_norm", "gate": "ffn_norm"}
    fwd, bwd = [], []
    for group in groups:
        name, stat = _group_name(group), 0
        if group[0] in NORM_FED and plan.rmsnorm == "sync":
            fwd.append(_all_reduce(norms[group[0]], 1))
        elif group[0] in NORM_FED:
            stat = 1
        fwd.append(_all_reduce(f"{name}.A", r * len(group) + stat))
    for group in reversed(groups):
        bwd.append(
            _all_reduce(f"{_group_name(group)}.B", r * len(group), tuple(f"{p}.B" for p in group))
        )
        if group[0] in NORM_FED and plan.rmsnorm == "sync":
            bwd.append(_all_reduce(norms[group[0]], 1))
    return fwd, bwd


def _firsts(plan: TrainingLayout, members: tuple[str, ...], suffix: str) -> tuple[str, ...]:
    """Names of the first GEMMs of `members` (grouped: theirs is one GEMM)."""
    if _grouped(plan) and len(members) > 1:
        return (_group_name(members) + suffix,)
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


# ---- compute ---------------------------------------------------------------------------
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
                gemms.append(Gemm(_group_name(group), t, n, shapes[group[0]][0]))
        return gemms
    r, gemms = args.effective_rank, []
    for group in _groups(plan):
        d_in = shapes[group[0]][0]
        if plan.strategy == "btp":
            gemms.append(Gemm(f"{_group_name(group)}.A", t, r * len(group), d_in // tp))
            gemms += [Gemm(f"{p}.B", t, shapes[p][1] // tp, r) for p in group]
        else:
            gemms.append(Gemm(f"{_group_name(group)}.A", t, r // tp * len(group), d_in))
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
    )


def _norm_mode(plan: TrainingLayout) -> str:
    """How the block's pre-norms run: replicated, or BTP's online / sync."""
    return plan.rmsnorm if plan.strategy == "btp" and plan.tp > 1 else "replicated"


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


# ---- memory ----------------------------------------------------------------------------
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


FP32_BYTES = 4
"""Statistics kept in fp32 whatever the training dtype: RMSNorm's rstd, attention's
log-sum-exp, sync RMSNorm's upcasts."""


def saved_activations(args: ModelShape, plan: TrainingLayout) -> dict[str, int]:
    """Bytes one block keeps for backward per micro-batch on one rank without
    recomputation, by item: every distinct storage autograd saves, as `bench trace`
    measures it (each storage once, however many views of it are saved; parameters
    excluded). `b` is the activation dtype's bytes, widths are per rank.

    - Norms. Replicated (megatron, vanilla, TP1): PyTorch's fused RMSNorm keeps its input
      and the fp32 rstd; its output is kept by the consumers' first GEMM. BTP online: the
      input, the [T, 1] statistic (dtype b) and the latents it hands out; ungrouped, it
      also keeps each consumer's latent separately (the consumers read the concatenation).
      BTP sync (`sync_rmsnorm`, eager): two fp32 upcasts of the input (one in fp32
      training: the upcast is the input), the fp32 rstd, the normalised product before
      the weight and the output.
    - Grouped first GEMMs keep their concatenated weight shards (per micro-batch, not
      per token): megatron [q+k+v, d] / [2 d_ff, d], low-rank the A's.
    - Attention: RoPE'd q and k, v, the output and the fp32 log-sum-exp (per head). A
      megatron group's q, k, v are views of one GEMM output, which v keeps alive whole.
      GQA: k and v un-repeated (SDPA's `enable_gqa`) where the kernel takes grouped heads
      (`kv_repeated`), else repeated to q's width. Under CP the ring's output is head-major,
      so wo's input is a copy of it (`attention.out_copy`, q wide).
    - MLP: gate and up (megatron grouped: one [2 d_ff] storage), SiLU(gate) when the
      gate has one (fullrank, SVD), and the product (kept by down).
    - Low-rank pairs: each A output (the latent; BTP's first projections after a norm
      hand out one concatenation) and, for CoLA, its SiLU (kept by B).
    """
    t, b, tp = plan.tokens, plan.dtype_bytes, plan.tp
    shapes, w, mode = args.projection_shapes(), layer_widths(args, plan), _norm_mode(plan)
    lat, grouped, items = w.latent, w.grouped, {}

    def add(name: str, elements_per_token: float, nbytes: int = b) -> None:
        items[name] = items.get(name, 0) + round(t * elements_per_token * nbytes)

    for norm, n, first in (("attention_norm", 3, "q"), ("ffn_norm", 2, "gate")):
        if mode == "replicated":
            add(f"{norm}.input", w.residual)
            add(f"{norm}.rstd", 1, FP32_BYTES)
            add(f"{norm}.output", w.residual)
        elif mode == "online":
            add(f"{norm}.input", w.residual)
            add(f"{norm}.statistic", 1)
            if not grouped and n > 1:
                add(f"{norm}.latents", n * lat)
        else:
            add(f"{norm}.upcast", w.residual * (2 if b != FP32_BYTES else 1), FP32_BYTES)
            add(f"{norm}.rstd", 1, FP32_BYTES)
            add(f"{norm}.normalised", w.residual)
            add(f"{norm}.output", w.residual)
        if grouped:
            members = SHARED_INPUTS[0] if first == "q" else SHARED_INPUTS[2]
            if args.low_rank:
                rows, cols = (
                    n * args.effective_rank // (tp if plan.strategy == "vanilla" else 1),
                    shapes[first][0] // (tp if plan.strategy == "btp" else 1),
                )
            else:
                rows, cols = sum(shapes[p][1] for p in members) // tp, shapes[first][0]
            items[f"{_group_name(members)}.concat_weights"] = rows * cols * b

    heads = args.n_heads if plan.strategy == "vanilla" else args.n_heads // tp
    repeated = kv_repeated(args, plan)
    add("attention.q", w.q)
    add("attention.k", w.q if repeated else w.kv)
    if repeated:
        add("attention.v", w.q)
    elif plan.strategy == "megatron" and grouped:
        add("attention.qkv", w.q + 2 * w.kv)
    else:
        add("attention.v", w.kv)
    add("attention.out", w.q)
    add("attention.lse", heads, FP32_BYTES)
    if plan.cp > 1:
        add("attention.out_copy", w.q)

    if plan.strategy == "megatron" and grouped:
        add("mlp.gate_up", 2 * w.ffn)
    else:
        add("mlp.gate", w.ffn)
        add("mlp.up", w.ffn)
    if w.silu_gate:
        add("mlp.silu_gate", w.ffn)
    add("mlp.product", w.ffn)

    if args.low_rank:
        add("pairs.latents", 7 * lat)
        if w.silu_latents:
            add("pairs.silu", 7 * lat)
    return items


def kv_repeated(args: ModelShape, plan: TrainingLayout) -> bool:
    """Whether GQA's K/V reach SDPA repeated to n_heads: the model passes grouped heads
    where the kernel takes them (`boost_llama.layers.takes_grouped_kv`): CUDA's flash
    attention (fp16/bf16, head_dim <= 256) and CPU's; the GPU priced here runs fp32
    through another kernel, which takes them repeated."""
    grouped = args.kv_heads < args.n_heads
    return grouped and (plan.dtype == "fp32" or args.head_dim > 256)


INDEX_BYTES = 8
"""The int64 token ids the embedding keeps for its backward."""


def end_activations(args: ModelShape, plan: TrainingLayout, stage: int = 0) -> dict[str, int]:
    """Bytes one micro-batch's forward keeps outside the blocks on one rank of pipeline
    stage `stage`, by item: under CP the RoPE table's rows of the shard's positions (fp32
    [T, head_dim], indexed by every stage); first stage, the token ids (the embedding's
    output is block 0's norm input, counted there); last stage, the final norm: replicated
    as a block's pre-norm (`saved_activations`), under BTP TP always sync
    (`parallelize.styles.ShardedRMSNorm`), with its output whole (BTP gathers it for the
    vocab-parallel lm_head, which keeps it).
    The logits are the loss's (`memory.LOSS_BYTES`), not the forward's."""
    t, b, items = plan.tokens, plan.dtype_bytes, {}
    if plan.cp > 1:
        items["rope.rows"] = t * args.head_dim * FP32_BYTES
    if stage == 0:
        items["embedding.tokens"] = t * INDEX_BYTES
    if stage == plan.pp - 1:
        residual = layer_widths(args, plan).residual
        if _norm_mode(plan) == "replicated":
            items["norm.input"] = t * residual * b
        else:  # BTP's `ShardedRMSNorm`, sync whatever `plan.rmsnorm`: the fp32 upcasts
            items["norm.upcast"] = t * residual * (2 if b != FP32_BYTES else 1) * FP32_BYTES
            items["norm.normalised"] = t * residual * b
        items["norm.rstd"] = t * FP32_BYTES
        items["norm.output"] = t * args.dim * b
    return items


def activation_bytes(args: ModelShape, plan: TrainingLayout) -> int:
    """Bytes one block keeps for backward per micro-batch on one rank under `plan.ac`.

    none: `saved_activations`. full: the block input only. selective: TorchTitan's
    default, every 2nd block full, so the mean of none and full. lowrank (BOOST §5, as
    `python -m boost_titan.activation_memory` measures `parallelize/lowrank_ac.py`): the
    block input and the outputs of the forward collectives, which under BTP are the 7
    latents (+ online RMSNorm's two statistics, or sync RMSNorm's two fp32 [T, 1] sums):
    d/tp + 7r + 2; under vanilla the B all-reduces at the full output dims: d + 5d +
    2 d_ff; without TP the down-projection outputs: d + 7r. Under CP lowrank also keeps the
    ring attention's output and fp32 log-sum-exp (`ring_kept`), so that backward replays no
    ring.
    """
    tp, t, b = plan.tp, plan.tokens, plan.dtype_bytes
    residual = args.dim // tp if plan.strategy == "btp" else args.dim
    if plan.ac == "full":
        return t * residual * b
    if plan.ac == "lowrank":
        if tp == 1:
            return t * (residual + 7 * args.effective_rank) * b + ring_kept(args, plan)
        if plan.strategy == "vanilla":
            outputs = sum(d_out for _, d_out in args.projection_shapes().values())
            return t * (residual + outputs) * b + ring_kept(args, plan)
        stats = 2 * b if plan.rmsnorm == "online" else 2 * FP32_BYTES
        return t * ((residual + 7 * args.effective_rank) * b + stats) + ring_kept(args, plan)
    none = sum(saved_activations(args, plan).values())
    return round((none + t * residual * b) / 2) if plan.ac == "selective" else none


def ring_kept(args: ModelShape, plan: TrainingLayout) -> int:
    """Bytes low-rank AC keeps of one block's attention under CP: its output and fp32
    log-sum-exp, as `saved_activations` counts them (0 without CP)."""
    if plan.cp == 1:
        return 0
    saved = saved_activations(args, plan)
    return saved["attention.out"] + saved["attention.lse"]


def _layers_per_stage(args: ModelShape, plan: TrainingLayout) -> int:
    return -(-args.n_layers // plan.pp)


# ---- time ------------------------------------------------------------------------------
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


_MEMBERS = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}
_NORM_CONSUMERS = ("q", "k", "v", "gate", "up")


def weight_streams(args: ModelShape, plan: TrainingLayout) -> list[Stream]:
    """Weight-sized memory-bound kernels of one block per micro-batch: grouped first GEMMs
    concatenate their weight shards every forward; BTP's online RMSNorm scales its
    down-projections' weight grads by the norm weight."""
    b, streams = plan.dtype_bytes, []
    online = _norm_mode(plan) == "online"
    for g in layer_gemms(args, plan):
        base = g.name.removesuffix(".A")
        weight = 2 * g.n * g.k * b  # read + write
        if _grouped(plan) and base in _MEMBERS:
            streams.append(Stream(f"{base}.concat_weights", weight))
        if online and g.name.endswith(".A") and _MEMBERS.get(base, (base,))[0] in _NORM_CONSUMERS:
            streams.append(Stream(f"{base}.scale_weight_grad", weight))
    return streams


def float8_selection(args: ModelShape, plan: TrainingLayout, layer: int) -> dict[str, str | None]:
    """Each forward GEMM of block `layer` (`layer_gemms`' names) -> None when the runtime
    runs it in float8, else why not; {} with float8 off."""
    if not plan.float8:
        return {}
    reasons = {}
    for g in layer_gemms(args, plan):
        base, _, factor = g.name.partition(".")
        fqns = float8_costs.module_fqns(layer, _MEMBERS.get(base, (base,)), factor)
        reasons[g.name] = float8_costs.skip_reason(
            g.n, g.k, tuple(fqns), plan.float8, plan.float8_filter
        )
    return reasons


def _selected(args: ModelShape, plan: TrainingLayout, layer: int) -> frozenset[str]:
    reasons = float8_selection(args, plan, layer)
    return frozenset(name for name, why in reasons.items() if why is None)


def float8_cast_streams(
    args: ModelShape, plan: TrainingLayout, selected: frozenset[str]
) -> dict[str, tuple[list[Stream], list[Stream]]]:
    """The float8 casts of one block per micro-batch, (forward, backward) kernels for each
    forward GEMM named in `selected`."""
    return {
        g.name: float8_costs.cast_streams(g, plan.float8, plan.float8_casts, plan.dtype_bytes)
        for g in layer_gemms(args, plan)
        if g.name in selected
    }


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
        layer_widths(args, plan), _norm_mode(plan), plan.dtype_bytes
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
    fwd, bwd = block_streams(layer_widths(args, plan), _norm_mode(plan), plan.dtype_bytes)
    per_step = max(_stage_layers(args, plan)) * plan.microbatches
    seconds: dict[str, float] = {}

    def add(stream: Stream, s: float) -> None:
        name = stream.name.removesuffix(".bwd")
        seconds[name] = seconds.get(name, 0.0) + s

    for stream in fwd + bwd:
        add(stream, per_step * costs.stream_time([stream], gpu, plan.tokens))
    for stream in weight_streams(args, plan):
        add(stream, per_step * costs.stream_time([stream], gpu))
    for selected, count in selection_counts(args, plan, _stage_blocks(args, plan)[0]).items():
        for cast_fwd, cast_bwd in float8_cast_streams(args, plan, selected).values():
            for stream in cast_fwd + cast_bwd:
                add(stream, count * plan.microbatches * costs.stream_time([stream], gpu))
    return dict(sorted(seconds.items(), key=lambda item: -item[1]))


def _stage_layers(args: ModelShape, plan: TrainingLayout) -> list[int]:
    """Blocks per pipeline stage (the first stages take the remainder)."""
    base, extra = divmod(args.n_layers, plan.pp)
    return [base + (s < extra) for s in range(plan.pp)]


def _stage_blocks(args: ModelShape, plan: TrainingLayout) -> list[range]:
    """Block indices of each pipeline stage."""
    ends = [sum(_stage_layers(args, plan)[: s + 1]) for s in range(plan.pp)]
    return [range(end - n, end) for end, n in zip(ends, _stage_layers(args, plan), strict=True)]


def selection_counts(
    args: ModelShape, plan: TrainingLayout, blocks: range
) -> dict[frozenset[str], int]:
    """How many of `blocks` run each set of float8 GEMMs (one empty set without float8)."""
    counts: dict[frozenset[str], int] = {}
    for layer in blocks:
        selected = _selected(args, plan, layer)
        counts[selected] = counts.get(selected, 0) + 1
    return counts


def block_launches(
    args: ModelShape, plan: TrainingLayout, selected: frozenset[str]
) -> tuple[int, int]:
    """Kernels one block launches per micro-batch on one rank: (forward, backward with what
    `ac` recomputes), counted as the module docstring of `host` says."""
    gemms = layer_gemms(args, plan)
    fwd_s, bwd_s = block_streams(layer_widths(args, plan), _norm_mode(plan), plan.dtype_bytes)
    casts = float8_cast_streams(args, plan, selected).values()
    weights = weight_streams(args, plan)
    concat = [w for w in weights if w.name.endswith(".concat_weights")]
    scale = [w for w in weights if not w.name.endswith(".concat_weights")]
    fwd_c, bwd_c = layer_collectives(args, plan)
    chunks, compiled = plan.overlap_chunks, plan.compiled
    cast_fwd = [c for fwd, _ in casts for c in fwd]
    cast_bwd = [c for _, bwd in casts for c in bwd]
    fwd = len(gemms) + 1 + host.stream_kernels(fwd_s + concat + cast_fwd, compiled)
    fwd += chunks * len(fwd_c)
    bwd = 2 * len(gemms) + host.FLASH_BACKWARD_LAUNCHES
    bwd += host.stream_kernels(bwd_s + scale + cast_bwd, compiled) + chunks * len(bwd_c)
    if plan.cp > 1:  # cp attention steps, the K/V all-gather, backward's cp dK/dV passes
        # (lowrank AC replays neither the steps nor the gather: it keeps the ring's output)
        fwd += plan.cp
        bwd += (plan.cp - 1) * host.FLASH_BACKWARD_LAUNCHES + 1 + plan.cp
    firsts = sum(g.name.endswith(".A") for g in gemms)
    recompute = {
        "none": 0,
        "full": fwd,
        "selective": fwd // 2,
        "lowrank": fwd - firsts - chunks * len(fwd_c) - (plan.cp + 1) * (plan.cp > 1),
    }[plan.ac]
    return fwd, bwd + recompute


def weight_casts(args: ModelShape, plan: TrainingLayout) -> Stream:
    """The casts of the weights to the compute dtype per step on the busiest rank (bf16
    training with fp32 master weights only): the compute copies' once per step (read fp32,
    write bf16) plus each micro-batch's gradient casts back to fp32 (read bf16, write
    fp32); FSDP2's (and its copies into the unsharded weights) once per step, twice per
    micro-batch with `legacy_launches`, once per micro-batch under CUDA graphs
    (`host.weight_launches`)."""
    if plan.state != "bf16":
        return Stream("weight_casts", 0, 0)
    params, tensors = params_per_rank(args, plan), _rank_tensors(args, plan)
    kind = _launch_kind(plan)
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


def _ends_launches(args: ModelShape, plan: TrainingLayout, stage: int) -> int:
    """Kernels of the model's ends on `stage` per micro-batch."""
    launches = sum(host.EMBEDDING_LAUNCHES) * (stage == 0)
    if stage == plan.pp - 1:
        fwd_c, bwd_c = step_collectives(args, plan)
        head = host.HEAD_LAUNCHES["compiled" if plan.compiled else "eager"]
        launches += 3 + sum(head) + len(fwd_c) + len(bwd_c)
    return launches


def _param_tensors(args: ModelShape, plan: TrainingLayout, stage: int) -> tuple[int, int]:
    """(parameter tensors of one block, of the ends) on one rank of `stage`."""
    per_block = 2 + len(PROJECTIONS) * (2 if args.low_rank else 1)
    return per_block, (stage == 0) + 2 * (stage == plan.pp - 1)


def _rank_tensors(args: ModelShape, plan: TrainingLayout) -> int:
    """Parameter tensors on the busiest rank (the stage holding the most)."""
    counts = []
    for s in range(plan.pp):
        per_block, ends = _param_tensors(args, plan, s)
        counts.append(_stage_layers(args, plan)[s] * per_block + ends)
    return max(counts)


def _launch_kind(plan: TrainingLayout) -> str:
    """`host.weight_launches`' pattern for `plan`: without PP the compute copies
    (`boost_llama.data_parallel`; the model prices layouts without data parallelism)."""
    if plan.cuda_graphs:
        return "graphs"
    if plan.legacy_launches:
        return "legacy"
    return "copies" if plan.pp == 1 else "product"


def _stage_host(
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
    blocks = _stage_layers(args, plan)[stage]
    weights = host.weight_launches(
        block_tensors, end_tensors, blocks, plan.microbatches, _launch_kind(plan)
    )
    h = gpu.host_launch_s

    def gpu_s(parts: dict[str, float]) -> float:
        return sum(v for k, v in parts.items() if k != "comm_hidden")

    work = []
    for count, fwd, bwd, (launches_fwd, launches_bwd) in phases:
        work.append(
            host.Phase(
                "forward", count * (launches_fwd + weights.block_forward), count * gpu_s(fwd)
            )
        )
        work.append(
            host.Phase(
                "backward", count * (launches_bwd + weights.block_backward), count * gpu_s(bwd)
            )
        )
    work.append(host.Phase("ends", ends[1] + weights.ends, gpu_s(ends[0])))
    if plan.cuda_graphs:
        gpu_total = sum(p.gpu_s for p in work)
        return {"host": max(0.0, host.GRAPH_LAUNCHES * h - gpu_total)}
    return {"host": host.host_exposed(work, h)}


def stage_times(args: ModelShape, plan: TrainingLayout, gpu: GpuProfile) -> list[dict[str, float]]:
    """Seconds per micro-batch of each pipeline stage by class: its blocks, its ends,
    across stages receiving activations (forward) and grads (backward) over the network,
    and the host's launches beyond what the GPU's work hides (`host`)."""
    blocks: dict[frozenset[str], tuple[dict, dict, tuple[int, int]]] = {}
    embedding, output = ends_time(args, plan, gpu)
    send = costs.send_time(plan.tokens * pipeline_send_elements(args, plan) * plan.dtype_bytes, gpu)
    stages = []
    for s, layers in enumerate(_stage_blocks(args, plan)):
        parts: dict[str, float] = {}
        phases = []
        for selected, count in selection_counts(args, plan, layers).items():
            if selected not in blocks:
                fwd, bwd = block_phases(args, plan, gpu, selected)
                blocks[selected] = (fwd, bwd, block_launches(args, plan, selected))
            fwd, bwd, launches = blocks[selected]
            phases.append((count, fwd, bwd, launches))
            for k, v in {**fwd, **{k: fwd.get(k, 0.0) + v for k, v in bwd.items()}}.items():
                parts[k] = parts.get(k, 0.0) + count * v
        ends: dict[str, float] = {}
        for end in [embedding] * (s == 0) + [output] * (s == plan.pp - 1):
            parts = {k: parts[k] + end.get(k, 0.0) for k in parts}
            ends = {k: ends.get(k, 0.0) + v for k, v in end.items()}
        parts["comm"] += ((s > 0) + (s < plan.pp - 1)) * send
        extra = _stage_host(args, plan, gpu, s, phases, (ends, _ends_launches(args, plan, s)))
        for k, v in extra.items():
            parts[k] = parts.get(k, 0.0) + v
        stages.append(parts)
    return stages


def step_time(args: ModelShape, plan: TrainingLayout, gpu: GpuProfile) -> dict[str, float]:
    """Seconds per optimizer step: `TIME_PARTS` (which add up to `step`), plus
    comm_hidden (collective time the plans hide behind weight-grad GEMMs).

    1F1B: the slowest stage runs all micro-batches back to back; the others' time for
    one micro-batch is the fill and drain around it (the bubble). Then, on every rank,
    the grads of micro-batches after the first are accumulated, clipped, and AdamW steps.
    """
    stages = stage_times(args, plan, gpu)
    totals = [sum(v for k, v in s.items() if k != "comm_hidden") for s in stages]
    slowest = stages[totals.index(max(totals))]
    parts = {k: plan.microbatches * slowest.get(k, 0.0) for k in TIME_PARTS}
    parts["bubble"] = sum(totals) - max(totals)
    params, grad_bytes = params_per_rank(args, plan), STATE_BYTES[plan.state][1]
    accumulate = Stream("accumulate_grads", (plan.microbatches - 1) * 3 * params * grad_bytes)
    parts["memory"] += costs.stream_time([accumulate, weight_casts(args, plan)], gpu)
    update = params * (ADAMW_BYTES_PER_PARAM[plan.state] + CLIP_GRAD_PASSES * grad_bytes)
    parts["optimizer"] = costs.hbm_time(update, gpu) + OPTIMIZER_LAUNCHES * gpu.launch_s
    launches = host.optimizer_launches(_rank_tensors(args, plan), plan.legacy_launches)
    launches += host.STEP_LAUNCHES
    parts["host"] += host.host_exposed(
        [host.Phase("optimizer", launches, parts["optimizer"])], gpu.host_launch_s
    )
    step = sum(parts.values())
    return parts | {"step": step, "comm_hidden": plan.microbatches * slowest["comm_hidden"]}


def recompute_flops(args: ModelShape, plan: TrainingLayout) -> int:
    """Extra backward FLOPs of one block per rank caused by `plan.ac`."""
    if plan.ac in ("full", "selective"):
        return layer_flops(args, plan) // (2 if plan.ac == "selective" else 1)
    if plan.ac == "none":
        return 0
    b_gemms = sum(g.flops for g in layer_gemms(args, plan) if g.name.endswith(".B"))
    return b_gemms + (attention_flops(args, plan) if plan.cp == 1 else 0)
