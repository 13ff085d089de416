"""RMSNorm over a hidden dim that is sharded across the TP group.

`online_rmsnorm_down` is BOOST's online RMSNorm (BOOST.md §4): the norm is folded into the
row-parallel down-projection that follows it, and the per-token sum of squares rides in
the same all-reduce as the projection's partial sums: one collective forward, none of its
own backward. `sync_rmsnorm` all-reduces the statistic on its own (forward and backward).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.distributed import ProcessGroup

from .comm import _all_reduce, sum_both


class _OnlineRMSNormDown(torch.autograd.Function):
    """out = (sum_i A_i (x_i * g_i)) / rms(x), rms over the full hidden dim `dim`.

    Each rank holds x_i, g_i (its hidden shard and norm weight shard) and A_i (the
    matching columns of the down-projection weight). Forward: one all-reduce of
    [partials, sum(x_i^2)]. Backward, with s = 1/rms and y the all-reduced partials:
    dx_i = s g_i (A_i^T G) - (s^3 / dim) <G, y> x_i, all local.
    """

    @staticmethod
    def forward(ctx, x, weight, down, dim, eps, group):
        partial = F.linear(x * weight, down)
        sum_sq = x.float().pow(2).sum(-1, keepdim=True).to(partial.dtype)
        total = _all_reduce(torch.cat([partial, sum_sq], dim=-1), group)
        y, sum_sq = total[..., :-1], total[..., -1:]
        inv_rms = torch.rsqrt(sum_sq.float() / dim + eps).to(y.dtype)
        ctx.save_for_backward(x, weight, down, y, inv_rms)
        ctx.dim = dim
        return y * inv_rms

    @staticmethod
    def backward(ctx, grad):
        x, weight, down, y, inv_rms = ctx.saved_tensors
        grad_y = grad * inv_rms
        grad_scaled_x = grad_y @ down  # A_i^T (G s): grad w.r.t. x_i * g_i
        grad_dot_y = (grad * y).sum(-1, keepdim=True)
        grad_x = weight * grad_scaled_x - (inv_rms.pow(3) / ctx.dim) * grad_dot_y * x
        grad_weight = (grad_scaled_x * x).flatten(0, -2).sum(0)
        grad_down = grad_y.flatten(0, -2).t() @ (x * weight).flatten(0, -2)
        return grad_x, grad_weight, grad_down, None, None, None


def online_rmsnorm_down(
    x: torch.Tensor,
    weight: torch.Tensor,
    down: torch.Tensor,
    dim: int,
    eps: float,
    group: ProcessGroup,
) -> torch.Tensor:
    """Replicated ``F.linear(rms_norm(x) * weight, down)`` from hidden-sharded x with ONE
    all-reduce of ``down.shape[0] + 1`` elements per token; no collective in backward."""
    return _OnlineRMSNormDown.apply(x, weight, down, dim, eps, group)


def sync_rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, dim: int, eps: float, group: ProcessGroup
) -> torch.Tensor:
    """RMSNorm of hidden-sharded x: the [.., 1] sum of squares is all-reduced forward and
    its gradient all-reduced backward; the output stays sharded like x."""
    sum_sq = sum_both(x.float().pow(2).sum(-1, keepdim=True), group)
    return (x.float() * torch.rsqrt(sum_sq / dim + eps)).type_as(x) * weight
