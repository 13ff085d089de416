"""RMSNorm over a hidden dim that is sharded across the TP group.

`online_rmsnorm_down` is BOOST's online RMSNorm (BOOST.md §4): the norm is folded into the
row-parallel down-projection that follows it, and the per-token sum of squares rides in
the same all-reduce as the projection's partial sums (the first one's, when several
projections follow the norm without grouping): no collective of its own, forward or
backward. `sync_rmsnorm` all-reduces the statistic on its own (forward and backward).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed import ProcessGroup

from boost_titan.kernels import float8, rmsnorm_partial_backward, rmsnorm_partial_stats
from boost_titan.kernels.float8 import Float8

from .comm import _all_reduce, all_reduce_in_row_blocks, sum_both


class _OnlineRMSNormDown(torch.autograd.Function):
    """out_p = (sum_i A_p,i (x_i * g_i)) * s for each down-projection weight A_p, with
    s = 1/rms(x) over the full hidden dim `dim`.

    Each rank holds x_i, g_i (its hidden shard and norm weight shard) and A_p,i (the
    matching columns of each down weight). Forward: one all-reduce per A_p; the first also
    carries sum(x_i^2), appended to its partial sums in their dtype. Backward, with G_p the
    (replicated) upstream grads: dx_i = s g_i sum_p A_p,i^T G_p - (s^2 / dim) sum_p <G_p,
    out_p> x_i, all local. It saves the outputs rather than the all-reduced partials y_p =
    out_p / s: the consumers of out_p keep it alive anyway.

    The statistic's precision. It rides in the payload's dtype, so in bf16 the all-reduce
    rounds it, and each partial sum on the way, to 8 bits. Measured on gloo against fp64
    (d = 4096 bf16 residuals, 2048 tokens; Gaussian, massive-activation channels, shards
    10^k apart, token scales over 6 decades), relative error of the global sum of squares,
    median / max over tokens: TP2 1.6e-3 / 7.2e-3, TP4 1.7e-3 / 8.6e-3. Two bf16 halves
    (hi, lo = s - hi) barely help, since the sum of the hi halves is rounded again (TP2
    1.9e-3 / 3.9e-3, TP4 1.9e-3 / 7.8e-3); an exact bf16 encoding would need an exponent
    agreed across ranks, i.e. another collective. An fp32 payload is exact (< 5e-7) but
    doubles the bytes of the two all-reduces that carry statistics: +36% of a BTP layer's
    TP bytes. With the partial sums fixed, the bf16 statistic adds at most 5% to the
    output's own bf16 error (mean |out - fp64| / mean |out|: TP2 3.03e-3 vs 2.89e-3 with
    an exact statistic, TP4 3.63e-3 vs 3.47e-3), so it stays one element in the payload's
    dtype, exact in fp32 runs.
    """

    @staticmethod
    def forward(ctx, x, weight, dim, eps, group, chunks, f8s, *downs):
        f8s = ctx.f8s = f8s or (None,) * len(downs)
        scaled, sum_sq = rmsnorm_partial_stats(x, weight)  # one fused pass over x on GPU
        if chunks == 1:
            partials = [
                float8.forward(scaled, down, f8) for down, f8 in zip(downs, f8s, strict=True)
            ]
            sum_sq = sum_sq.to(partials[0].dtype)
            first = _all_reduce(torch.cat([partials[0], sum_sq], dim=-1), group)
            ys = [first[..., :-1]] + [_all_reduce(p, group) for p in partials[1:]]
        else:
            rows, stats = scaled.flatten(0, -2), sum_sq.flatten(0, -2).to(scaled.dtype)

            def partials_of(start: int, end: int) -> list[torch.Tensor]:
                block = [
                    float8.forward(rows[start:end], down, f8)
                    for down, f8 in zip(downs, f8s, strict=True)
                ]
                return [torch.cat([block[0], stats[start:end]], dim=-1), *block[1:]]

            reduced = all_reduce_in_row_blocks(partials_of, rows.shape[0], chunks, group)
            first, *others = [r.view(*x.shape[:-1], r.shape[-1]) for r in reduced]
            ys = [first[..., :-1], *others]
        inv_rms = torch.rsqrt(first[..., -1:].float() / dim + eps).to(first.dtype)
        outs = tuple(y * inv_rms for y in ys)
        ctx.save_for_backward(x, weight, inv_rms, *downs, *outs)
        ctx.dim = dim
        return outs

    @staticmethod
    def backward(ctx, *grads):
        x, weight, inv_rms, *rest = ctx.saved_tensors
        downs, outs = rest[: len(grads)], rest[len(grads) :]
        grad_ys = [grad * inv_rms for grad in grads]  # grads w.r.t. the partial sums
        grad_scaled = sum(
            float8.input_grad(g, down, f8)  # w.r.t. x_i * g_i
            for g, down, f8 in zip(grad_ys, downs, ctx.f8s, strict=True)
        )
        grad_dot_out = sum(
            (g * out).sum(-1, keepdim=True) for g, out in zip(grads, outs, strict=True)
        )
        coef = (inv_rms.pow(2) / ctx.dim) * grad_dot_out
        grad_x, grad_weight = rmsnorm_partial_backward(x, weight, grad_scaled, coef)
        tokens = x.flatten(0, -2)  # A_p's grad, G_p^T (x * g), without materialising x * g
        grad_downs = [
            float8.weight_grad(g, tokens, f8) * weight
            for g, f8 in zip(grad_ys, ctx.f8s, strict=True)
        ]
        return grad_x, grad_weight, None, None, None, None, None, *grad_downs


def online_rmsnorm_down(
    x: torch.Tensor,
    weight: torch.Tensor,
    downs: Sequence[torch.Tensor],
    dim: int,
    eps: float,
    group: ProcessGroup,
    chunks: int = 1,
    f8s: Sequence[Float8 | None] = (),
) -> tuple[torch.Tensor, ...]:
    """Replicated ``F.linear(rms_norm(x) * weight, down)`` for each of `downs` from
    hidden-sharded x: one all-reduce of ``down.shape[0]`` elements per token each, plus
    one element (the statistic) in the first; no collective in backward. With `chunks`
    > 1 the tokens go in that many row blocks, each block's all-reduces launched before
    the next block's GEMMs (overlap). `f8s`: one float8 recipe or None per down (empty:
    none), for its three GEMMs (`kernels.float8`)."""
    return _OnlineRMSNormDown.apply(x, weight, dim, eps, group, chunks, tuple(f8s), *downs)


def sync_rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, dim: int, eps: float, group: ProcessGroup
) -> torch.Tensor:
    """RMSNorm of hidden-sharded x: the [.., 1] sum of squares is all-reduced forward and
    its gradient all-reduced backward; the output stays sharded like x."""
    sum_sq = sum_both(x.float().pow(2).sum(-1, keepdim=True), group)
    return (x.float() * torch.rsqrt(sum_sq / dim + eps)).type_as(x) * weight
