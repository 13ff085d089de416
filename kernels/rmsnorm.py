"""Element-wise halves of the online RMSNorm on one rank's hidden shard, fused.

Forward, `rmsnorm_partial_stats`: ``scaled = x * weight`` (fed to the down GEMMs) and the
per-row fp32 ``sum(x^2)`` (the statistic that rides in the all-reduce). Backward,
`rmsnorm_partial_backward`: ``grad_x = weight * gsx - coef * x`` and
``grad_weight = sum_rows(gsx * x)``, with gsx the gradient w.r.t. ``scaled`` (from the
GEMM with the down weights) and coef the per-row scalar of the norm's Jacobian.

Why fusing helps on GPU: these ops are memory-bound, so their cost is the bytes they
move. Unfused, the forward reads x once for ``x * weight`` and again for the statistic
(in bf16, ``x.float().pow(2)`` also writes and re-reads two fp32 copies of x) and writes
``x * weight``; the fused kernel reads x once and writes ``x * weight`` plus one fp32 per
row. Unfused, the backward materialises ``weight * gsx``, ``coef * x`` and ``gsx * x`` as
temporaries of x's size, each written once and read back; the fused kernel reads x and
gsx once and writes grad_x plus one fp32 row of weight-gradient partials per block of
rows (summed by a tiny torch reduction: two stages, no atomics, deterministic).

Dispatch: Triton when x is on CUDA, or when the environment sets ``BOOST_TITAN_TRITON=1``
(with ``TRITON_INTERPRET=1`` that runs the kernels on CPU, for tests); the torch
references otherwise, and always under torch.compile: there Inductor can generate the
references' element-wise work and row reduction as one pass over x itself (the bytes of
these kernels) and fuse them into their neighbours, which an opaque hand-written kernel
would keep it from. Both take x of any shape ``[..., d]`` and compute in fp32.
"""

from __future__ import annotations

import os

import torch


def _use_triton(x: torch.Tensor) -> bool:
    if torch.compiler.is_compiling():
        return False
    return x.is_cuda or os.environ.get("BOOST_TITAN_TRITON") == "1"


def partial_stats_reference(
    x: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch version of `rmsnorm_partial_stats`."""
    xf = x.float()
    return (xf * weight.float()).to(x.dtype), xf.pow(2).sum(-1, keepdim=True)


def partial_backward_reference(
    x: torch.Tensor, weight: torch.Tensor, gsx: torch.Tensor, coef: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch version of `rmsnorm_partial_backward`."""
    xf, gf = x.float(), gsx.float()
    grad_x = (weight.float() * gf - coef.float() * xf).to(x.dtype)
    grad_weight = (gf * xf).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
    return grad_x, grad_weight


def rmsnorm_partial_stats(
    x: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x * weight, sum(x^2, -1, keepdim=True))`` in one pass over x [..., d].

    weight: [d]. Returns scaled in x's dtype and the sum of squares in fp32, [..., 1].
    """
    if not _use_triton(x):
        return partial_stats_reference(x, weight)
    from ._rmsnorm_triton import partial_stats

    return partial_stats(x, weight)


def rmsnorm_partial_backward(
    x: torch.Tensor, weight: torch.Tensor, gsx: torch.Tensor, coef: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight * gsx - coef * x, sum over rows of gsx * x)`` in one pass over x, gsx.

    x, gsx: [..., d]; weight: [d]; coef: [..., 1], one scalar per row. Returns grad_x in
    x's dtype and grad_weight [d] in weight's dtype, both accumulated in fp32.
    """
    if not _use_triton(x):
        return partial_backward_reference(x, weight, gsx, coef)
    from ._rmsnorm_triton import partial_backward

    return partial_backward(x, weight, gsx, coef)
