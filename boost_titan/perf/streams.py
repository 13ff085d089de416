"""Memory-bound kernels of a training step as the product runs them on a GPU (eager):
normalisation, RoPE, activations, products, residual adds, concatenations, cross-entropy.

Each kernel reads its inputs once and writes its outputs once; `b` is the activation
dtype's bytes per element; sizes are bytes per token. Single-kernel operations: RMSNorm
(PyTorch's fused CUDA kernel), the online norm's statistics and backward (our Triton
kernels), SiLU, products, adds, concatenations. Two operations of the product's own code
decompose into many element-wise kernels with fp32 temporaries: RoPE (`apply_rope`) and
sync RMSNorm (`sync_rmsnorm`, also BTP's final norm); `Eager` holds their traffic, counted
from the aten ops they dispatch (tests/unit/test_step_model.py measures it again). A norm
group hands its consumers the parts of one split, so their grads meet in one
concatenation. Under torch.compile most of this fuses; the model prices eager.
"""

from __future__ import annotations

from dataclasses import dataclass

from boost_titan.perf.work import Stream, Widths


@dataclass(frozen=True)
class Eager:
    """Bytes and kernels per element of an eager decomposition: fp32 traffic of its fp32
    kernels, passes at the activation dtype, and dtype casts (b + 4 bytes each; in fp32
    training `.float()` / `.type_as` are no-ops)."""

    fp32_bytes: int
    passes: int
    casts: int
    kernels: int
    """Kernels besides the casts."""

    def bytes(self, b: int) -> int:
        return self.fp32_bytes + self.passes * b + self.casts * self._cast(b)

    def launches(self, b: int) -> int:
        return self.kernels + (self.casts if self._cast(b) else 0)

    @staticmethod
    def _cast(b: int) -> int:
        return 0 if b == 4 else b + 4


ROPE_FORWARD = Eager(fp32_bytes=8, passes=0, casts=2, kernels=1)
"""`apply_rope` per rotated element: upcast; one complex multiply of the fp32 pairs by
cos + i sin (reads 4, writes 4 bytes); downcast."""
ROPE_BACKWARD = Eager(fp32_bytes=8, passes=0, casts=2, kernels=2)
"""Upcast; the complex multiply by the conjugate (8), whose table rows are conjugated
into a copy first (one small kernel, [seq, head_dim / 2]); downcast."""
INTERLEAVED_ROPE_FORWARD = Eager(fp32_bytes=36, passes=0, casts=2, kernels=7)
"""RoPE as the product ran it until issue 47 (`TrainingLayout.interleaved_rope`), per rotated
element: upcast; four products and a sub / add on the interleaved halves (4 + 4 + 6 bytes
each group of three); stack (8); downcast."""
INTERLEAVED_ROPE_BACKWARD = Eager(fp32_bytes=56, passes=0, casts=2, kernels=10)
"""Casts back; four products (4 each), a negation (4), two adds (6 each), two
select-backwards (zeros + copy, 6 each) and their sum (12)."""
SYNC_NORM_FORWARD = Eager(fp32_bytes=20, passes=2, casts=3, kernels=7)
"""`sync_rmsnorm` per element of the local shard: upcast, square (8), row sum (4), upcast,
scale (8), downcast, times the weight (2b); three [T, 1] kernels for the statistic."""
SYNC_NORM_BACKWARD = Eager(fp32_bytes=52, passes=9, casts=3, kernels=14)
"""Weight product and its grad (3b + 2b + b), three casts, the fp32 chain of the scale
and the statistic (12 + 8 + 4 + 8 + 8 + 12), and the sum of the two grads of x (3b)."""

FLOAT8_CAST = Eager(fp32_bytes=21, passes=3, casts=1, kernels=10)
"""One GEMM operand cast to float8 by torchao's dynamic scaling (`hp_tensor_to_float8_dynamic`,
which `kernels/float8.py` calls for both operands of every float8 GEMM), eager, per element:
amax as abs (2b) and max (b); five scalar kernels turn it into the scale; upcast; scale
(8), clamp (8) and the float8 cast (4 + 1)."""
FLOAT8_POW2_KERNELS = 3
"""Scalar kernels (log2, floor, exp2) that round a scale to a power of two, in the recipes
whose torchao config sets `round_scales_to_power_of_2` (the rowwise ones)."""
FLOAT8_CAST_FUSED = Eager(fp32_bytes=1, passes=2, casts=0, kernels=2)
"""The same cast as torch.compile fuses it: an amax reduction reads the operand, one
kernel reads it again and writes float8 (1 byte)."""

NORM_CONSUMERS = {"attention_norm": 3, "ffn_norm": 2}
"""Low-rank pairs (or full linears) reading each pre-norm's output: q, k, v; gate, up."""
CE_FORWARD_BYTES = 16
CE_BACKWARD_BYTES = 20
"""Cross-entropy over fp32 logits, per logit beyond the activation-dtype read/write: the
upcast writes 4 bytes; log-softmax reads 4 twice (max, sum) and writes 4; backward writes
the one-hot grad (4), reads log-probs and grad (8) and writes 4, and the downcast reads 4."""


def _norm_forward(name: str, w: Widths, mode: str, b: int) -> list[Stream]:
    """A pre-norm and (BTP) what its all-reduce adds: `mode` is replicated (a plain
    RMSNorm), online (BOOST's: stats pass, statistic appended, latents rescaled) or sync."""
    r = w.residual
    if mode == "replicated":
        return [Stream(name, 2 * r * b)]
    if mode == "sync":
        return [Stream(name, r * SYNC_NORM_FORWARD.bytes(b), SYNC_NORM_FORWARD.launches(b))]
    n = NORM_CONSUMERS[name]
    latents, first = n * w.latent, (n if w.grouped else 1) * w.latent
    return [
        Stream(f"{name}.stats", 2 * r * b),
        Stream(f"{name}.append_statistic", 2 * (first + 1) * b),
        Stream(f"{name}.inv_rms", 0, 3),
        Stream(f"{name}.rescale", 2 * latents * b, 1 if w.grouped else n),
    ]


def _norm_backward(name: str, w: Widths, mode: str, b: int) -> list[Stream]:
    """dx and the weight grad (two kernels reading x and dy); online adds the rescale of
    the latent grads, <G, out> (product and row sum) and the [T, 1] coefficient; sync is
    its eager chain."""
    r = w.residual
    if mode == "sync":
        return [
            Stream(f"{name}.bwd", r * SYNC_NORM_BACKWARD.bytes(b), SYNC_NORM_BACKWARD.launches(b))
        ]
    streams = [Stream(f"{name}.bwd", 5 * r * b, 2)]
    if mode == "online":
        latents = NORM_CONSUMERS[name] * w.latent
        streams += [
            Stream(f"{name}.grad_rescale", 2 * latents * b),
            Stream(f"{name}.grad_dot_out", 4 * latents * b, 2),
            Stream(f"{name}.coef", 0, 5),
        ]
    return streams


def _silu(name: str, width: int, count: int, b: int, backward: bool) -> list[Stream]:
    """SiLU on `count` tensors of `width`: forward reads and writes, backward reads input
    and grad and writes the grad."""
    per = (3 if backward else 2) * width * b
    return (
        [Stream(f"{name}.silu" + (".bwd" if backward else ""), count * per, count)] if count else []
    )


def _latent_silu(name: str, w: Widths, n: int, silu: int, b: int, backward: bool) -> list[Stream]:
    """SiLU on a norm group's `n` latents: once on the group output when the group applies
    it (`Widths.shared_silu`), else once per latent."""
    if w.shared_silu:
        return _silu(name, n * w.latent, silu, b, backward)
    return _silu(name, w.latent, n * silu, b, backward)


def _consumer_grads(name: str, w: Widths, widths: tuple[int, ...], b: int) -> Stream:
    """The grads of a norm's consumers meeting at the norm. Grouped, each consumer took its
    part of one split of the group output: the split's backward concatenates the n grads
    (reads them, writes the whole output once). Ungrouped, their input grads
    (residual-wide) are summed."""
    n = len(widths)
    if w.grouped:
        return Stream(f"{name}.cat_grads", 2 * sum(widths) * b, 1)
    return Stream(f"{name}.sum_grads", (n - 1) * 3 * w.residual * b, n - 1)


def block_streams(w: Widths, norm_mode: str, b: int) -> tuple[list[Stream], list[Stream]]:
    """Memory-bound kernels of one block per token on one rank: (forward, backward).
    `norm_mode`: replicated (megatron, vanilla, and any plan at TP1), online or sync (BTP)."""
    r, f, lat = w.residual, w.ffn, w.latent
    # what each of a norm's consumers writes per rank: its latent, or its full-rank output
    firsts = {
        "attention_norm": (lat,) * 3 if lat else (w.q, w.kv, w.kv),
        "ffn_norm": (lat,) * 2 if lat else (f, f),
    }
    silu = int(w.silu_latents and lat > 0)
    rotated = w.q + w.kv  # RoPE'd queries and keys

    fwd = _norm_forward("attention_norm", w, norm_mode, b)
    fwd += _latent_silu("qkv", w, 3, silu, b, False)
    rope_fwd, rope_bwd = (
        (INTERLEAVED_ROPE_FORWARD, INTERLEAVED_ROPE_BACKWARD)
        if w.interleaved_rope
        else (ROPE_FORWARD, ROPE_BACKWARD)
    )
    fwd.append(Stream("rope", rotated * rope_fwd.bytes(b), 2 * rope_fwd.launches(b)))
    fwd += _silu("o", lat, silu, b, False)
    fwd.append(Stream("residual_add", 3 * r * b))
    fwd += _norm_forward("ffn_norm", w, norm_mode, b)
    fwd += _latent_silu("gate_up", w, 2, silu, b, False)
    fwd += _silu("gate", f, int(w.silu_gate), b, False)
    fwd.append(Stream("gate_mul", 3 * f * b))
    fwd += _silu("down", lat, silu, b, False)
    fwd.append(Stream("residual_add", 3 * r * b))

    bwd = [Stream("residual_grad_add", 3 * r * b)]
    bwd += _silu("down", lat, silu, b, True)
    bwd.append(Stream("gate_mul.bwd", 5 * f * b, 2))
    bwd += _silu("gate", f, int(w.silu_gate), b, True)
    bwd += _latent_silu("gate_up", w, 2, silu, b, True)
    bwd.append(_consumer_grads("ffn_norm", w, firsts["ffn_norm"], b))
    bwd += _norm_backward("ffn_norm", w, norm_mode, b)
    bwd.append(Stream("residual_grad_add", 3 * r * b))
    bwd += _silu("o", lat, silu, b, True)
    bwd.append(Stream("rope.bwd", rotated * rope_bwd.bytes(b), 2 * rope_bwd.launches(b)))
    bwd += _latent_silu("qkv", w, 3, silu, b, True)
    bwd.append(_consumer_grads("attention_norm", w, firsts["attention_norm"], b))
    bwd += _norm_backward("attention_norm", w, norm_mode, b)
    return fwd, bwd


def embedding_streams(residual: int, b: int) -> tuple[list[Stream], list[Stream]]:
    """Per token: the embedding lookup and its grad's scatter-add (forward, backward)."""
    return [Stream("embedding", 2 * residual * b)], [Stream("embedding.bwd", 2 * residual * b)]


def head_streams(
    residual: int, logits: int, final_norm_mode: str, b: int
) -> tuple[list[Stream], list[Stream]]:
    """Per token: final norm and cross-entropy over `logits` per rank (forward,
    backward). `final_norm_mode` is replicated or sync (BTP)."""
    if final_norm_mode == "sync":
        norm_fwd = Stream(
            "final_norm", residual * SYNC_NORM_FORWARD.bytes(b), SYNC_NORM_FORWARD.launches(b)
        )
        norm_bwd = Stream(
            "final_norm.bwd", residual * SYNC_NORM_BACKWARD.bytes(b), SYNC_NORM_BACKWARD.launches(b)
        )
    else:
        norm_fwd, norm_bwd = (
            Stream("final_norm", 2 * residual * b),
            Stream("final_norm.bwd", 5 * residual * b, 2),
        )
    fwd = [norm_fwd, Stream("cross_entropy", logits * (b + CE_FORWARD_BYTES), 4)]
    bwd = [Stream("cross_entropy.bwd", logits * (b + CE_BACKWARD_BYTES), 4), norm_bwd]
    return fwd, bwd
