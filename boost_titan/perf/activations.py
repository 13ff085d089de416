"""Activation memory: the bytes a block and the model's ends keep for backward per
micro-batch on one rank (`saved_activations`: the storages autograd keeps, as `bench
trace` measures them, with RMSNorm saving what its fused CUDA kernel saves), and what each
activation-checkpointing mode keeps of them (`activation_bytes`), which `memory` sums into
a rank's peak.
"""

from __future__ import annotations

from boost_titan.boost_llama.shapes import ModelShape
from boost_titan.perf.block import FP32_BYTES, SHARED_INPUTS, group_name, layer_widths, norm_mode
from boost_titan.perf.layout import TrainingLayout

INDEX_BYTES = 8
"""The int64 token ids the embedding keeps for its backward."""


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
    shapes, w, mode = args.projection_shapes(), layer_widths(args, plan), norm_mode(plan)
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
            items[f"{group_name(members)}.concat_weights"] = rows * cols * b

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
        if norm_mode(plan) == "replicated":
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
