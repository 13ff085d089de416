"""Triton kernels for `rmsnorm`: row-major [rows, d] tiles, masked on both edges.

Imported lazily, so that ``TRITON_INTERPRET`` (read when ``triton.jit`` decorates) can be
set before the first use. Block sizes are untuned heuristics.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_TILE = 2048  # elements per [BLOCK_M, BLOCK_D] tile
_MAX_BLOCK_D = 512
_MAX_BLOCK_M = 64
_ROWS_PER_GROUP = 256  # rows one backward program reduces: a multiple of every BLOCK_M


@triton.jit
def _stats_kernel(
    x_ptr,
    w_ptr,
    scaled_ptr,
    sum_sq_ptr,
    n_rows,
    n_cols,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    row_offs = rows.to(tl.int64)[:, None] * n_cols
    acc = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_D):
        cols = start + tl.arange(0, BLOCK_D)
        col_mask = cols < n_cols
        mask = row_mask[:, None] & col_mask[None, :]
        offs = row_offs + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        scaled = (x * w[None, :]).to(scaled_ptr.dtype.element_ty)
        tl.store(scaled_ptr + offs, scaled, mask=mask)
        acc += tl.sum(x * x, axis=1)
    tl.store(sum_sq_ptr + rows, acc, mask=row_mask)


@triton.jit
def _backward_kernel(
    x_ptr,
    w_ptr,
    gsx_ptr,
    coef_ptr,
    grad_x_ptr,
    partial_ptr,
    n_rows,
    n_cols,
    ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    group = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    col_mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, ROWS, BLOCK_M):
        rows = group * ROWS + start + tl.arange(0, BLOCK_M)
        row_mask = rows < n_rows
        mask = row_mask[:, None] & col_mask[None, :]
        offs = rows.to(tl.int64)[:, None] * n_cols + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(gsx_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        c = tl.load(coef_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
        grad_x = w[None, :] * g - c[:, None] * x
        tl.store(grad_x_ptr + offs, grad_x.to(grad_x_ptr.dtype.element_ty), mask=mask)
        acc += tl.sum(g * x, axis=0)
    tl.store(partial_ptr + group.to(tl.int64) * n_cols + cols, acc, mask=col_mask)


def _blocks(n_cols: int) -> tuple[int, int]:
    block_d = min(triton.next_power_of_2(n_cols), _MAX_BLOCK_D)
    return min(_TILE // block_d, _MAX_BLOCK_M), block_d


def partial_stats(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton `rmsnorm.rmsnorm_partial_stats`."""
    d = x.shape[-1]
    x2 = x.reshape(-1, d).contiguous()
    scaled = torch.empty_like(x2)
    sum_sq = torch.empty(x2.shape[0], device=x.device, dtype=torch.float32)
    block_m, block_d = _blocks(d)
    grid = (triton.cdiv(x2.shape[0], block_m),)
    _stats_kernel[grid](
        x2,
        weight.contiguous(),
        scaled,
        sum_sq,
        x2.shape[0],
        d,
        BLOCK_M=block_m,
        BLOCK_D=block_d,
    )
    return scaled.view(x.shape), sum_sq.view(*x.shape[:-1], 1)


def partial_backward(
    x: torch.Tensor, weight: torch.Tensor, gsx: torch.Tensor, coef: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton `rmsnorm.rmsnorm_partial_backward`."""
    d = x.shape[-1]
    x2 = x.reshape(-1, d).contiguous()
    gsx2 = gsx.reshape(-1, d).contiguous()
    coef1 = coef.reshape(-1).contiguous()
    n_rows = x2.shape[0]
    grad_x = torch.empty_like(x2)
    block_m, block_d = _blocks(d)
    groups = triton.cdiv(n_rows, _ROWS_PER_GROUP)
    partials = torch.empty(groups, d, device=x.device, dtype=torch.float32)
    grid = (groups, triton.cdiv(d, block_d))
    _backward_kernel[grid](
        x2,
        weight.contiguous(),
        gsx2,
        coef1,
        grad_x,
        partials,
        n_rows,
        d,
        ROWS=_ROWS_PER_GROUP,
        BLOCK_M=block_m,
        BLOCK_D=block_d,
    )
    return grad_x.view(x.shape), partials.sum(0).to(weight.dtype)
