"""Autograd-aware tensor-parallel collectives on local tensors.

Each function states what it does forward and backward. They run on the TP group's
process group through functional collectives, so `CommDebugMode` sees them and
`torch.compile` can trace them.
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed import ProcessGroup


def _all_reduce(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    return funcol.wait_tensor(funcol.all_reduce(x.contiguous(), "sum", group))


def _all_gather_last(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    out = funcol.all_gather_single(x.contiguous(), gather_dim=x.dim() - 1, group=group)
    return funcol.wait_tensor(out)


def _reduce_scatter_last(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    out = funcol.reduce_scatter_single(
        x.contiguous(), "sum", scatter_dim=x.dim() - 1, group=group
    )
    return funcol.wait_tensor(out)


def _own_slice(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    size, rank = group.size(), group.rank()
    chunk = x.shape[-1] // size
    return x.narrow(-1, rank * chunk, chunk).contiguous()


class _SumPartials(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ReduceGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _SumBoth(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class _GatherReplicatedGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _own_slice(grad, ctx.group), None


class _GatherPartialGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_last(grad, ctx.group), None


class _Split(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _own_slice(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_last(grad, ctx.group), None


def sum_partials(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """Forward: all-reduce partial sums to a replicated tensor. Backward: identity."""
    return _SumPartials.apply(x, group)


def reduce_grad(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """Forward: identity on a replicated tensor. Backward: all-reduce the partial grads of
    the column-parallel consumers that follow."""
    return _ReduceGrad.apply(x, group)


def sum_both(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """All-reduce forward and backward (a statistic whose consumers are sharded)."""
    return _SumBoth.apply(x, group)


def gather_last(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """Forward: all-gather the last dim. Backward: keep this rank's slice (grad replicated)."""
    return _GatherReplicatedGrad.apply(x, group)


def gather_last_reduce_scatter_grad(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """Forward: all-gather the last dim. Backward: reduce-scatter (grad partial per rank)."""
    return _GatherPartialGrad.apply(x, group)


def split_last(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """Forward: keep this rank's slice of the last dim. Backward: all-gather the grad."""
    return _Split.apply(x, group)
