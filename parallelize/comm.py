"""Autograd-aware tensor-parallel collectives on local tensors.

Each function states what it does forward and backward. Every backward is our own (a
custom `autograd.Function`), so the collectives inside call torch's functional collective
ops directly (`torch.ops._c10d_functional`: launch, then `wait_tensor`), without the
autograd wrapper and the `AsyncCollectiveTensor` that `_functional_collectives` adds to
each call; `CommDebugMode` still sees them and `torch.compile` traces them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
from torch.distributed import ProcessGroup

from boost_titan.kernels import float8
from boost_titan.kernels.float8 import Float8

_OPS = torch.ops._c10d_functional


def _start_all_reduce(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """Launch the sum all-reduce of x; its result once `_wait` returns."""
    return _OPS.all_reduce(x.contiguous(), "sum", group.group_name)


def _wait(x: torch.Tensor) -> torch.Tensor:
    return _OPS.wait_tensor(x)


def _all_reduce(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    return _wait(_start_all_reduce(x, group))


def _all_gather_last(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    size = group.size()
    stacked = _wait(_OPS.all_gather_into_tensor(x.contiguous(), size, group.group_name))
    return torch.cat(stacked.chunk(size), dim=-1)  # [size * n, ..] -> [n, .., size * d]


def _reduce_scatter_last(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    size = group.size()
    stacked = torch.cat(x.chunk(size, dim=-1))  # each rank's slice of the last dim, in turn
    return _wait(_OPS.reduce_scatter_tensor(stacked, "sum", size, group.group_name))


def _own_slice(x: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    size, rank = group.size(), group.rank()
    chunk = x.shape[-1] // size
    return x.narrow(-1, rank * chunk, chunk).contiguous()


def row_blocks(rows: int, chunks: int) -> list[tuple[int, int]]:
    """[start, end) of `chunks` consecutive blocks of `rows` rows (fewer if rows < chunks)."""
    chunks = max(1, min(chunks, rows))
    size, extra = divmod(rows, chunks)
    bounds = [0]
    for k in range(chunks):
        bounds.append(bounds[-1] + size + (k < extra))
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def all_reduce_in_row_blocks(
    partials_of: Callable[[int, int], Sequence[torch.Tensor]],
    rows: int,
    chunks: int,
    group: ProcessGroup,
) -> list[torch.Tensor]:
    """Each of the 2-D partial sums `partials_of(start, end)` returns for a block of rows,
    all-reduced and concatenated over the blocks. Block k's all-reduces are launched before
    block k+1's partials are computed, so they run behind that work; all are waited for at
    the end (`overlap_chunks`: Domino-style overlap inside one collective site)."""
    pending = [
        [_start_all_reduce(p, group) for p in partials_of(start, end)]
        for start, end in row_blocks(rows, chunks)
    ]
    waited = [[_wait(t) for t in block] for block in pending]
    return [torch.cat(parts) if len(parts) > 1 else parts[0] for parts in zip(*waited, strict=True)]


class _RowLinear(torch.autograd.Function):
    """F.linear of a sharded input, all-reduced in row blocks (see `row_linear`)."""

    @staticmethod
    def forward(ctx, x, weight, group, chunks, f8):
        ctx.save_for_backward(x, weight)
        ctx.f8 = f8
        rows = x.flatten(0, -2)
        (y,) = all_reduce_in_row_blocks(
            lambda a, b: [float8.forward(rows[a:b], weight, f8)], rows.shape[0], chunks, group
        )
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = float8.input_grad(grad, weight, ctx.f8) if ctx.needs_input_grad[0] else None
        grad_w = float8.weight_grad(grad, x, ctx.f8) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, None, None, None


class _SumPartials(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ColumnLinears(torch.autograd.Function):
    """y_p = x_p W_p^T on a replicated input; backward all-reduces the input grad once,
    overlapped with the weight-grad GEMMs (Megatron's asynchronous grad all-reduce)."""

    @staticmethod
    def forward(ctx, x, group, split_input, chunks, f8s, *weights):
        ctx.group, ctx.split_input, ctx.chunks = group, split_input, chunks
        ctx.f8s = f8s = f8s or (None,) * len(weights)
        ctx.save_for_backward(x, *weights)
        return tuple(
            float8.forward(x_p, w, f8)
            for x_p, w, f8 in zip(_inputs(x, weights, split_input), weights, f8s, strict=True)
        )

    @staticmethod
    def backward(ctx, *grads):
        x, *weights = ctx.saved_tensors
        reduced = None
        if ctx.needs_input_grad[0]:
            rows = [g.flatten(0, -2) for g in grads]

            def grad_x_of(start: int, end: int) -> torch.Tensor:
                grads_x = [
                    float8.input_grad(g[start:end], w, f8)
                    for g, w, f8 in zip(rows, weights, ctx.f8s, strict=True)
                ]
                if ctx.split_input:
                    return torch.cat(grads_x, dim=-1)
                return functools.reduce(torch.add, grads_x)

            # each row block's all-reduce is launched at once and waited for after the
            # weight grads: it runs behind the next block's input grad and the weight grads
            reduced = [
                _start_all_reduce(grad_x_of(a, b), ctx.group)
                for a, b in row_blocks(rows[0].shape[0], ctx.chunks)
            ]
        grads_w = [
            float8.weight_grad(g, x_p, f8) if needed else None
            for g, x_p, f8, needed in zip(
                grads,
                _inputs(x, weights, ctx.split_input),
                ctx.f8s,
                ctx.needs_input_grad[5:],
                strict=True,
            )
        ]
        grad_x = None
        if reduced is not None:
            blocks = [_wait(block) for block in reduced]
            grad_x = (torch.cat(blocks) if len(blocks) > 1 else blocks[0]).view_as(x)
        return grad_x, None, None, None, None, *grads_w


def _inputs(x: torch.Tensor, weights: Sequence[torch.Tensor], split: bool) -> list[torch.Tensor]:
    if split:
        return list(x.split([w.shape[1] for w in weights], dim=-1))
    return [x] * len(weights)


class _SumBoth(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group), None


class WeightGradStash:
    """The (output grad, input, float8 recipe) of linears whose weight-grad GEMMs wait for
    the backward of a `reduce_grad`, by key; one per forward call."""

    def __init__(self) -> None:
        self.entries: dict[int, tuple[torch.Tensor, torch.Tensor, Float8 | None]] = {}


class _ReduceGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, stash, keys, *weights):
        ctx.group, ctx.stash, ctx.keys = group, stash, keys
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        # launched now, waited for after the stashed weight-grad GEMMs: it runs behind them
        reduced = _start_all_reduce(grad, ctx.group)
        grads_w = []
        for key, needed in zip(ctx.keys, ctx.needs_input_grad[4:], strict=True):
            entry = ctx.stash.entries.pop(key, None)
            grads_w.append(float8.weight_grad(*entry) if needed and entry is not None else None)
        return _wait(reduced), None, None, None, *grads_w


class _StashedWeightLinear(torch.autograd.Function):
    """F.linear whose backward computes the input grad and leaves the weight grad to the
    `reduce_grad` that owns `stash`."""

    @staticmethod
    def forward(ctx, x, weight, stash, index, f8):
        ctx.save_for_backward(x, weight)
        ctx.stash, ctx.index, ctx.f8 = stash, index, f8
        return float8.forward(x, weight, f8)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        if ctx.needs_input_grad[1]:
            ctx.stash.entries[ctx.index] = (grad, x, ctx.f8)
        grad_x = float8.input_grad(grad, weight, ctx.f8) if ctx.needs_input_grad[0] else None
        return grad_x, None, None, None, None


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


def row_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    group: ProcessGroup,
    chunks: int = 1,
    f8: Float8 | None = None,
) -> torch.Tensor:
    """Row-parallel ``F.linear(x, W)`` of a sharded input, all-reduced to a replicated
    output. Forward: one all-reduce per block of `chunks` row blocks, each launched before
    the next block's GEMM (overlap). Backward: no collective. `f8`: its three GEMMs in
    float8 (`kernels.float8`; with row blocks, each block's forward GEMM is scaled on its
    own)."""
    if chunks == 1:
        return sum_partials(float8.linear(x, weight, f8), group)
    return _RowLinear.apply(x, weight, group, chunks, f8)


def column_linears(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    group: ProcessGroup,
    *,
    split_input: bool = False,
    chunks: int = 1,
    f8s: Sequence[Float8 | None] = (),
) -> tuple[torch.Tensor, ...]:
    """Column-parallel linears ``F.linear(x_p, W_p)`` on a replicated input, one per local
    weight shard W_p: every W_p sees all of x, or with `split_input` x's last dim is cut
    into consecutive chunks of ``W_p.shape[1]`` (grouped up-projections of concatenated
    latents). Forward: no collective. Backward: the input grad (summed over p, or
    concatenated) is a partial sum; ONE all-reduce per row block (`chunks` of them) makes
    it whole, launched as soon as that block's input grad is computed and waited for after
    the weight-grad GEMMs. `f8s`: one float8 recipe or None per weight (empty: none)."""
    return _ColumnLinears.apply(x, group, split_input, chunks, tuple(f8s), *weights)


def reduce_grad(
    x: torch.Tensor,
    group: ProcessGroup,
    stash: WeightGradStash | None = None,
    weights: dict[int, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Forward: identity. Backward: all-reduce the grad (its consumers' grads are partial
    sums, e.g. several column-parallel GEMMs downstream of x; one all-reduce serves them
    all). With a `stash`, the weight grads of the linears that `stashed_linear` ran with
    it under the keys of `weights` (key -> that linear's weight) are computed here,
    behind the all-reduce, and returned as the grads of those weights."""
    weights = weights or {}
    return _ReduceGrad.apply(x, group, stash, tuple(weights), *weights.values())


def stashed_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    stash: WeightGradStash,
    key: int,
    f8: Float8 | None = None,
) -> torch.Tensor:
    """``F.linear(x, weight)`` whose weight grad is computed by the `reduce_grad` that
    holds `stash` and `weight` under `key` (its GEMMs in float8 with `f8`)."""
    return _StashedWeightLinear.apply(x, weight, stash, key, f8)


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
