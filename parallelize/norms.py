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
import torch.nn.functional as F
from boost_titan.kernels import rmsnorm_partial_backward, rmsnorm_partial_stats
from torch.distributed import ProcessGroup

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
    """

    @staticmethod
    def forward(ctx, x, weight, dim, eps, group, chunks, *downs):
        scaled, sum_sq = rmsnorm_partial_stats(x, weight)  # one fused pass over x on GPU
        if chunks == 1:
            partials = [F.linear(scaled, down) for down in downs]
            sum_sq = sum_sq.to(partials[0].dtype)
            first = _all_reduce(torch.cat([partials[0], sum_sq], dim=-1), group)
            ys = [first[..., :-1]] + [_all_reduce(p, group) for p in partials[1:]]
        else:
            rows, stats = scaled.flatten(0, -2), sum_sq.flatten(0, -2).to(scaled.dtype)

            def partials_of(start: int, end: int) -> list[torch.Tensor]:
                block = [F.linear(rows[start:end], down) for down in downs]
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
        grad_scaled = sum(g @ down for g, down in zip(grad_ys, downs))  # w.r.t. x_i * g_i
        grad_dot_out = sum((g * out).sum(-1, keepdim=True) for g, out in zip(grads, outs))
        coef = (inv_rms.pow(2) / ctx.dim) * grad_dot_out
        grad_x, grad_weight = rmsnorm_partial_backward(x, weight, grad_scaled, coef)
        tokens = x.flatten(0, -2)  # A_p's grad, G_p^T (x * g), without materialising x * g
        grad_downs = [(g.flatten(0, -2).t() @ tokens) * weight for g in grad_ys]
        return grad_x, grad_weight, None, None, None, None, *grad_downs


def online_rmsnorm_down(
    x: torch.Tensor,
    weight: torch.Tensor,
    downs: Sequence[torch.Tensor],
    dim: int,
    eps: float,
    group: ProcessGroup,
    chunks: int = 1,
) -> tuple[torch.Tensor, ...]:
    """Replicated ``F.linear(rms_norm(x) * weight, down)`` for each of `downs` from
    hidden-sharded x: one all-reduce of ``down.shape[0]`` elements per token each, plus
    one element (the statistic) in the first; no collective in backward. With `chunks`
    > 1 the tokens go in that many row blocks, each block's all-reduces launched before
    the next block's GEMMs (overlap)."""
    return _OnlineRMSNormDown.apply(x, weight, dim, eps, group, chunks, *downs)


def sync_rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, dim: int, eps: float, group: ProcessGroup
) -> torch.Tensor:
    """RMSNorm of hidden-sharded x: the [.., 1] sum of squares is all-reduced forward and
    its gradient all-reduced backward; the output stays sharded like x."""
    sum_sq = sum_both(x.float().pow(2).sum(-1, keepdim=True), group)
    return (x.float() * torch.rsqrt(sum_sq / dim + eps)).type_as(x) * weight
