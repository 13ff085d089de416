"""Analytic model of a training step under megatron, vanilla low-rank and BTP tensor parallelism.

Conventions (per rank and per micro-batch unless said otherwise; T = micro_batch * seq_len):
- Collectives are those our plans issue (see `layer_collectives`); a payload is the tensor
  a rank hands to the collective: T * elements_per_token * dtype bytes.
- FLOPs: 2*M*N*K for every GEMM on the local shard; attention 4*T*seq_len*d_attn (QK^T and
  AV) with the causal mask NOT halved, the usual MFU convention. Vanilla runs attention on
  all heads on every rank. Elementwise ops (norms, SiLU, RoPE, residual adds) are neither
  counted nor timed. Backward = 2x forward (dX and dW GEMMs).
- Memory: bf16 training keeps bf16 params and grads plus an fp32 master copy and AdamW's two
  fp32 moments (2+2+12 bytes per parameter); fp32 training 4+4+8.
- Time: every GEMM on a roofline (`gemm_time`); attention executes the causal half of its
  FLOPs at FlashAttention's efficiency; collectives on an alpha-beta ring over NVLink (TP
  inside a node), pipeline sends over InfiniBand; nothing overlaps. A step is `microbatches`
  micro-batches through a 1F1B pipeline plus one AdamW update.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from boost_titan.bench.gpus import GpuProfile, gpu_profile
from boost_titan.bench.records import PerfRecord, ValidationRow
from boost_titan.boost_llama.shapes import (
    PAPER_VOCAB,
    PROJECTIONS,
    ModelShape,
    flavor_shape,
    param_count,
    projection_params,
)
from boost_titan.boost_llama.strategies import STRATEGIES as REGISTRY
from boost_titan.config import RMSNORM_MODES
from boost_titan.config.errors import ConfigError

STRATEGIES = tuple(REGISTRY)
AC_MODES = ("none", "full", "selective", "lowrank")
DTYPE_BYTES = {"bf16": 2, "fp32": 4}
DTYPE_ALIASES = {"bfloat16": "bf16", "float32": "fp32"}
"""TorchTitan's spellings (`training.mixed_precision_param`) of the DTYPE_BYTES names."""
STATE_BYTES = {"bf16": (2, 2, 12), "fp32": (4, 4, 8)}
"""Bytes per parameter of (weights, grads, optimizer state incl. any fp32 master copy)."""
OPTIMIZER_BYTES_PER_PARAM = 28
"""HBM traffic of one AdamW update per parameter (read master, grad, m, v; write master,
m, v, weight): 4+2+4+4+4+4+4+2 in bf16 training, 4+4+4+4+4+4+4 in fp32."""
EFFICIENCY_HALF_DIM = 64
"""A GEMM whose smallest dim is m reaches gemm_efficiency * m / (m + 64) of peak: per-tile
prologue/epilogue and tile quantisation cost about 64 elements of the smallest dim, so
m = 256 keeps 80 %, 128 keeps 67 %, 1024 keeps 94 %."""
NORM_FED = ("q", "gate")
"""The first projection after each RMSNorm: its group's all-reduce carries the online
statistic (grouped or not), and sync RMSNorm's own all-reduce sits before it."""
SHARED_INPUTS = (("q", "k", "v"), ("o",), ("gate", "up"), ("down",))
"""Projections grouped by the input they consume (the two norm outputs, o's, down's)."""


@dataclass(frozen=True)
class Plan:
    """How one model is trained: parallel strategy, batch shape, dtype and recomputation."""

    strategy: str
    tp: int = 1
    pp: int = 1
    seq_len: int = 4096
    micro_batch: int = 1
    microbatches: int = 4
    dtype: str = "bf16"
    ac: str = "none"
    rmsnorm: str = "online"
    group_linears: bool = True

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class Collective:
    """One collective of the TP group; sizes are those of each rank's input tensor."""

    kind: str
    name: str
    elements_per_token: int

    def bytes(self, tokens: int, dtype_bytes: int) -> int:
        return tokens * self.elements_per_token * dtype_bytes

    def to_json(self, tokens: int, dtype_bytes: int) -> dict:
        return dataclasses.asdict(self) | {"bytes": self.bytes(tokens, dtype_bytes)}


@dataclass(frozen=True)
class Gemm:
    """A per-rank product [m, k] x [k, n]."""

    name: str
    m: int
    n: int
    k: int

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def bytes(self, dtype_bytes: int) -> int:
        return (self.m * self.k + self.k * self.n + self.m * self.n) * dtype_bytes

    def intensity(self, dtype_bytes: int) -> float:
        return self.flops / self.bytes(dtype_bytes)

    def backward(self) -> tuple[Gemm, Gemm]:
        """dX = dY W^T ([m, n] x [n, k]) and dW = X^T dY ([k, m] x [m, n])."""
        dx = Gemm(f"{self.name}.dX", self.m, self.k, self.n)
        return dx, Gemm(f"{self.name}.dW", self.k, self.n, self.m)

    def to_json(self, dtype_bytes: int) -> dict:
        return dataclasses.asdict(self) | {"flops": self.flops, "intensity": self.intensity(dtype_bytes)}


def _all_reduce(name: str, elements: int) -> Collective:
    return Collective("all_reduce", name, elements)


# ---- configuration ---------------------------------------------------------------------
def model_args(flavor: str, arch: str, strategy: str) -> ModelShape:
    """The flavor's arguments as `strategy` trains them: megatron always trains the fullrank
    twin; a flavor without a vocabulary gets the paper's 32000."""
    args = flavor_shape(flavor, arch="fullrank" if strategy == "megatron" else arch)
    if not args.vocab_size:
        args.vocab_size = PAPER_VOCAB
    args.validate()
    return args


def check(args: ModelShape, plan: Plan) -> None:
    """Raise ConfigError (one line, with the fix) for a plan the model cannot describe."""
    choices = {"strategy": (plan.strategy, STRATEGIES), "ac": (plan.ac, AC_MODES),
               "dtype": (plan.dtype, tuple(DTYPE_BYTES)), "rmsnorm": (plan.rmsnorm, RMSNORM_MODES)}
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
        raise ConfigError(f"tp {plan.tp} must be 1..8: tensor parallelism stays inside one NVLink node")
    if not 1 <= plan.pp <= args.n_layers:
        raise ConfigError(f"pp {plan.pp} must be 1..{args.n_layers} (the number of layers)")
    if min(plan.seq_len, plan.micro_batch, plan.microbatches) < 1:
        raise ConfigError("seq_len, micro_batch and microbatches must be positive")
    sharded = {"dim": args.dim, "n_heads": args.n_heads, "n_kv_heads": args.kv_heads,
               "ffn_dim": args.ffn_dim, "vocab_size": args.vocab_size}
    if plan.strategy == "vanilla":
        sharded["rank"] = args.effective_rank
    for name, size in sharded.items():
        if size % plan.tp:
            raise ConfigError(f"{name} {size} is not divisible by tp {plan.tp}; pick a tp that divides it")


def _groups(plan: Plan) -> list[tuple[str, ...]]:
    """Projections whose down-projections run as one GEMM (and one all-reduce)."""
    if plan.group_linears:
        return list(SHARED_INPUTS)
    return [(p,) for p in PROJECTIONS]


def _group_name(group: tuple[str, ...]) -> str:
    return {("q", "k", "v"): "qkv", ("gate", "up"): "gate_up"}.get(group, "_".join(group))


# ---- communication ---------------------------------------------------------------------
def layer_collectives(args: ModelShape, plan: Plan) -> tuple[list[Collective], list[Collective]]:
    """Collectives of one block, forward and backward, in issue order.

    megatron: all-reduce after row-parallel o and down; backward, the grads of the two norm
    outputs feeding column-parallel q/k/v and gate/up (independent of grouping).
    vanilla: every row-parallel B all-reduces its full output; backward, the input grads of
    the column-parallel A's, once per input they share (grouped or not).
    btp: every row-parallel A group all-reduces at the rank; online RMSNorm appends its
    statistic (+1, in the activation dtype) to the first group after each norm, sync
    RMSNorm adds one all-reduce of [T, 1] per norm each way; backward, the input grads of
    the column-parallel B's (one per group).
    """
    if plan.tp == 1:
        return [], []
    shapes, groups, r = args.projection_shapes(), _groups(plan), args.effective_rank
    if plan.strategy == "megatron":
        fwd = [_all_reduce("o", shapes["o"][1]), _all_reduce("down", shapes["down"][1])]
        bwd = [_all_reduce("gate_up", shapes["gate"][0]), _all_reduce("qkv", shapes["q"][0])]
        return fwd, bwd
    if plan.strategy == "vanilla":
        fwd = [_all_reduce(f"{p}.B", shapes[p][1]) for p in PROJECTIONS]
        inputs = reversed(SHARED_INPUTS)
        bwd = [_all_reduce(f"{_group_name(g)}.A", shapes[g[0]][0]) for g in inputs]
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
        bwd.append(_all_reduce(f"{_group_name(group)}.B", r * len(group)))
        if group[0] in NORM_FED and plan.rmsnorm == "sync":
            bwd.append(_all_reduce(norms[group[0]], 1))
    return fwd, bwd


def step_collectives(args: ModelShape, plan: Plan) -> tuple[list[Collective], list[Collective]]:
    """Model-level collectives per micro-batch: output side of the model and loss parallel.

    Every strategy ends in a vocab-parallel lm_head whose loss-parallel cross entropy
    all-reduces three [T] statistics (max, sum of exp, target logit). btp first runs the
    final norm as a sync RMSNorm on the sharded residual and all-gathers it ([T, d/tp] in,
    reduce-scatter of [T, d] backward); megatron/vanilla hold a replicated residual and
    all-reduce the lm_head input grad. Embeddings (btp: sharded on the embedding dim;
    others: replicated) need no communication.
    """
    if plan.tp == 1:
        return [], []
    d = args.dim
    loss = [_all_reduce(f"loss.{stat}", 1) for stat in ("max", "sumexp", "target")]
    if plan.strategy == "btp":
        fwd = [_all_reduce("final_norm", 1), Collective("all_gather", "final_gather", d // plan.tp), *loss]
        bwd = [Collective("reduce_scatter", "final_gather", d), _all_reduce("final_norm", 1)]
        return fwd, bwd
    return loss, [_all_reduce("lm_head", d)]


def pipeline_send_elements(args: ModelShape, plan: Plan) -> int:
    """Elements per token one rank sends across a stage boundary (btp's residual is sharded)."""
    return args.dim // plan.tp if plan.strategy == "btp" else args.dim


def collective_time(c: Collective, plan: Plan, gpu: GpuProfile) -> float:
    """Alpha-beta ring over NVLink: all-reduce 2(p-1)/p of the buffer, all-gather and
    reduce-scatter (p-1)/p of the full (gathered / unreduced) buffer."""
    p = plan.tp
    size = c.bytes(plan.tokens, plan.dtype_bytes)
    bw, alpha = gpu.nvlink_bw * gpu.link_efficiency, gpu.nvlink_alpha_s
    if c.kind == "all_reduce":
        return 2 * (p - 1) / p * size / bw + 2 * (p - 1) * alpha
    full = size * p if c.kind == "all_gather" else size
    return (p - 1) / p * full / bw + (p - 1) * alpha


# ---- compute ---------------------------------------------------------------------------
def layer_gemms(args: ModelShape, plan: Plan) -> list[Gemm]:
    """Forward GEMMs of one block on one rank, in execution order."""
    t, tp, shapes = plan.tokens, plan.tp, args.projection_shapes()
    if plan.strategy == "megatron":
        column = ("q", "k", "v", "gate", "up")
        return [Gemm(p, t, d_out // tp, d_in) if p in column else Gemm(p, t, d_out, d_in // tp)
                for p, (d_in, d_out) in shapes.items()]
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


def attention_flops(args: ModelShape, plan: Plan) -> int:
    """Forward QK^T and AV of one block on one rank (causal mask not halved)."""
    heads_per_rank = args.n_heads if plan.strategy == "vanilla" else args.n_heads // plan.tp
    return 4 * plan.tokens * plan.seq_len * heads_per_rank * args.head_dim


def layer_flops(args: ModelShape, plan: Plan) -> int:
    """Forward FLOPs of one block on one rank."""
    return sum(g.flops for g in layer_gemms(args, plan)) + attention_flops(args, plan)


def gemm_time(g: Gemm, dtype: str, gpu: GpuProfile) -> float:
    """Roofline: the slower of compute at a shape-dependent efficiency and HBM traffic."""
    m = min(g.m, g.n, g.k)
    efficiency = gpu.gemm_efficiency * m / (m + EFFICIENCY_HALF_DIM)
    return max(g.flops / (gpu.peak_flops[dtype] * efficiency), g.bytes(DTYPE_BYTES[dtype]) / gpu.hbm_bw)


def attention_time(flops: int, dtype: str, gpu: GpuProfile) -> float:
    """FlashAttention skips masked tiles: it executes half of the counted causal FLOPs."""
    return flops / 2 / (gpu.peak_flops[dtype] * gpu.attention_efficiency)


# ---- memory ----------------------------------------------------------------------------
def layer_params(args: ModelShape, plan: Plan) -> int:
    """Parameters of one block on one rank: every projection is sharded over tp; the two
    norm weights are sharded by btp, replicated by megatron/vanilla."""
    norms = 2 * args.dim // (plan.tp if plan.strategy == "btp" else 1)
    return norms + sum(projection_params(args, p, 0) for p in PROJECTIONS) // plan.tp


def params_per_rank(args: ModelShape, plan: Plan) -> int:
    """Parameters on the busiest rank: its stage's blocks plus embedding and/or head."""
    tp, btp = plan.tp, plan.strategy == "btp"
    embedding = args.vocab_size * args.dim // (tp if btp else 1)
    head = args.vocab_size * args.dim // tp + args.dim // (tp if btp else 1)
    ends = embedding + head if plan.pp == 1 else max(embedding, head)
    return _layers_per_stage(args, plan) * layer_params(args, plan) + ends


def activation_elements_per_token(args: ModelShape, plan: Plan) -> float:
    """Saved-for-backward elements of one block per token on one rank.

    none: each norm's input and output (residual width, sharded by btp), RoPE'd q, k, v and
    the attention output (head-sharded except in vanilla), the MLP's gate, up and product
    (+ SiLU(gate) for fullrank; sharded except in vanilla), and per low-rank pair its A
    output and, for CoLA, the SiLU of it (vanilla: sharded along r).
    full: the block input only. selective: TorchTitan's default, every 2nd block full, so
    the mean of none and full. lowrank (BOOST §5): two residual checkpoints and the 7
    post-all-reduce latents, 2d/tp + 7r for btp (vanilla: 2d + 7r/tp).
    """
    tp, d, r = plan.tp, args.dim, args.effective_rank
    residual = d / tp if plan.strategy == "btp" else d
    latent = r / tp if plan.strategy == "vanilla" else r
    if plan.ac == "full":
        return residual
    if plan.ac == "lowrank":
        return 2 * residual + 7 * latent
    shapes, split = args.projection_shapes(), 1 if plan.strategy == "vanilla" else tp
    attention = (shapes["q"][1] + shapes["k"][1] + shapes["v"][1] + shapes["o"][0]) / split
    mlp = (3 if args.low_rank else 4) * args.ffn_dim / split
    pairs = 7 * latent * (2 if args.activation == "silu" else 1) if args.low_rank else 0
    none = 4 * residual + attention + mlp + pairs
    return (none + residual) / 2 if plan.ac == "selective" else none


def _layers_per_stage(args: ModelShape, plan: Plan) -> int:
    return -(-args.n_layers // plan.pp)


def memory_per_rank(args: ModelShape, plan: Plan) -> dict[str, int]:
    """Bytes of weights, grads, optimizer state and activations on the busiest rank (1F1B
    keeps min(pp, microbatches) micro-batches of activations alive on the first stage)."""
    n = params_per_rank(args, plan)
    weights, grads, optimizer = (n * b for b in STATE_BYTES[plan.dtype])
    in_flight = min(plan.pp, plan.microbatches)
    per_layer = activation_elements_per_token(args, plan) * plan.tokens * plan.dtype_bytes
    activations = round(per_layer * _layers_per_stage(args, plan) * in_flight)
    parts = {"params": weights, "grads": grads, "optimizer": optimizer, "activations": activations}
    return parts | {"total": sum(parts.values())}


# ---- time ------------------------------------------------------------------------------
def step_time(args: ModelShape, plan: Plan, gpu: GpuProfile) -> dict[str, float]:
    """Seconds per optimizer step, split into parts that add up to `step`."""
    dtype = plan.dtype
    gemms = layer_gemms(args, plan)
    fwd_c, bwd_c = layer_collectives(args, plan)
    gemm_fwd = sum(gemm_time(g, dtype, gpu) for g in gemms)
    gemm_bwd = sum(gemm_time(b, dtype, gpu) for g in gemms for b in g.backward())
    attn_fwd = attention_time(attention_flops(args, plan), dtype, gpu)
    comm_fwd = sum(collective_time(c, plan, gpu) for c in fwd_c)
    comm_bwd = sum(collective_time(c, plan, gpu) for c in bwd_c)
    recompute = _recompute_time(args, plan, gpu, gemm_fwd + attn_fwd, comm_fwd)

    head = Gemm("lm_head", plan.tokens, args.vocab_size // plan.tp, args.dim)
    head_s = gemm_time(head, dtype, gpu) + sum(gemm_time(b, dtype, gpu) for b in head.backward())
    head_s += sum(collective_time(c, plan, gpu) for c in sum(step_collectives(args, plan), []))
    p2p_s = 0.0
    if plan.pp > 1:  # one activation send forward, one gradient send backward
        size = plan.tokens * pipeline_send_elements(args, plan) * plan.dtype_bytes
        p2p_s = 2 * (gpu.ib_alpha_s + size / (gpu.ib_bw * gpu.link_efficiency))

    per_mb = plan.microbatches * _layers_per_stage(args, plan)
    parts = {
        "gemm": per_mb * (gemm_fwd + gemm_bwd),
        "attention": per_mb * 3 * attn_fwd,
        "comm": per_mb * (comm_fwd + comm_bwd),
        "recompute": per_mb * recompute,
        "head": plan.microbatches * head_s,
        "p2p": plan.microbatches * p2p_s,
    }
    stage = sum(parts.values()) / plan.microbatches
    parts["bubble"] = (plan.pp - 1) * stage
    parts["optimizer"] = params_per_rank(args, plan) * OPTIMIZER_BYTES_PER_PARAM / gpu.hbm_bw
    return parts | {"step": sum(parts.values())}


def _recompute_time(
    args: ModelShape, plan: Plan, gpu: GpuProfile, compute_fwd: float, comm_fwd: float
) -> float:
    """Extra backward seconds per block: full replays the forward with its collectives;
    selective half of that; lowrank the B GEMMs and attention (vanilla also replays its
    B all-reduces, which sit inside the recomputed segments)."""
    if plan.ac in ("full", "selective"):
        return (compute_fwd + comm_fwd) / (2 if plan.ac == "selective" else 1)
    if plan.ac == "none":
        return 0.0
    b_gemms = sum(gemm_time(g, plan.dtype, gpu) for g in layer_gemms(args, plan) if g.name.endswith(".B"))
    attn = attention_time(attention_flops(args, plan), plan.dtype, gpu)
    return b_gemms + attn + (comm_fwd if plan.strategy == "vanilla" else 0.0)


def recompute_flops(args: ModelShape, plan: Plan) -> int:
    """Extra backward FLOPs of one block per rank caused by `plan.ac`."""
    if plan.ac in ("full", "selective"):
        return layer_flops(args, plan) // (2 if plan.ac == "selective" else 1)
    if plan.ac == "none":
        return 0
    b_gemms = sum(g.flops for g in layer_gemms(args, plan) if g.name.endswith(".B"))
    return b_gemms + attention_flops(args, plan)


# ---- records ---------------------------------------------------------------------------
def evaluate(flavor: str, args: ModelShape, plan: Plan, gpus: list[str]) -> PerfRecord:
    """The full record of one configuration; step times on every profile in `gpus`, the
    first of which `add_speedups` compares on."""
    check(args, plan)
    t, db = plan.tokens, plan.dtype_bytes
    fwd, bwd = layer_collectives(args, plan)
    step_fwd, step_bwd = step_collectives(args, plan)
    flops = layer_flops(args, plan)
    times = {g: step_time(args, plan, gpu_profile(g)) for g in gpus}
    return PerfRecord(
        flavor=flavor, arch=args.arch, strategy=plan.strategy, tp=plan.tp, pp=plan.pp,
        seq_len=plan.seq_len, micro_batch=plan.micro_batch, microbatches=plan.microbatches,
        dtype=plan.dtype, ac=plan.ac, rmsnorm=plan.rmsnorm, group_linears=plan.group_linears,
        collectives_per_layer_fwd=len(fwd),
        collectives_per_layer_bwd=len(bwd),
        comm_bytes_per_layer_fwd=sum(c.bytes(t, db) for c in fwd),
        comm_bytes_per_layer_bwd=sum(c.bytes(t, db) for c in bwd),
        collectives_fwd=[c.to_json(t, db) for c in fwd],
        collectives_bwd=[c.to_json(t, db) for c in bwd],
        step_collectives_fwd=[c.to_json(t, db) for c in step_fwd],
        step_collectives_bwd=[c.to_json(t, db) for c in step_bwd],
        flops_per_layer=flops,
        flops_per_layer_bwd=2 * flops,
        recompute_flops_per_layer=recompute_flops(args, plan),
        gemms=[g.to_json(db) for g in layer_gemms(args, plan)],
        activation_bytes_per_layer=round(activation_elements_per_token(args, plan) * t * db),
        params_total=param_count(args),
        params_per_rank=params_per_rank(args, plan),
        memory_bytes_per_rank=memory_per_rank(args, plan),
        predicted_step_s={g: parts["step"] for g, parts in times.items()},
        time_breakdown_s={g: {k: v for k, v in parts.items() if k != "step"} for g, parts in times.items()},
        speedup_gpu=gpus[0],
    )


def add_speedups(records: list[PerfRecord]) -> None:
    """Fill predicted_speedup between records that differ only in strategy (and arch)."""
    def key(r: PerfRecord) -> tuple:
        return (r.flavor, r.tp, r.pp, r.seq_len, r.micro_batch, r.microbatches, r.dtype,
                r.ac, r.rmsnorm, r.group_linears, r.speedup_gpu)

    for r in records:
        mine = r.predicted_step_s[r.speedup_gpu]
        r.predicted_speedup = {
            o.strategy: o.predicted_step_s[o.speedup_gpu] / mine
            for o in records if key(o) == key(r) and o.strategy != r.strategy
        }


def sweep(
    flavors: list[str], arch: str, strategies: list[str], tps: list[int], gpus: list[str], **plan
) -> list[PerfRecord]:
    """Records for every flavor x tp x strategy (other Plan fields from `plan`), with speedups."""
    records = [
        evaluate(f, model_args(f, arch, s), Plan(strategy=s, tp=tp, **plan), gpus)
        for f in flavors for tp in tps for s in strategies
    ]
    add_speedups(records)
    return records


# ---- validation against BOOST §6 -------------------------------------------------------
PAPER_ITERATION_S: dict[tuple[str, int, int], dict[str, float]] = {
    ("1B", 1, 1): {"megatron": 0.85, "vanilla": 0.56, "btp": 0.59},
    ("3B", 2, 1): {"megatron": 1.14, "vanilla": 1.41, "btp": 0.78},
    ("7B", 4, 1): {"megatron": 1.06, "vanilla": 1.64, "btp": 0.72},
    ("13B", 4, 2): {"megatron": 2.07, "vanilla": 2.42, "btp": 1.30},
}
"""BOOST §6 seconds per iteration (flavor, tp, pp): CoLA, A100-80GB, seq 4096, micro-batch 1
x 4 accumulation, for full-rank TP (megatron), vanilla low-rank TP and BOOST (btp)."""


def validation_rows(gpu: str = "a100", ac: str = "none") -> list[ValidationRow]:
    """The model's seconds per iteration next to the published ones, for the paper's setup."""
    rows = []
    for (flavor, tp, pp), paper in PAPER_ITERATION_S.items():
        plan = dict(tp=tp, pp=pp, seq_len=4096, micro_batch=1, microbatches=4, ac=ac)
        records = [evaluate(flavor, model_args(flavor, "cola", s), Plan(strategy=s, **plan), [gpu])
                   for s in paper]
        predicted = {r.strategy: r.predicted_step_s[gpu] for r in records}
        rows.append(ValidationRow(flavor=flavor, tp=tp, pp=pp, paper_s=paper, predicted_s=predicted))
    return rows
