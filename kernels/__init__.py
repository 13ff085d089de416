"""Fused element-wise kernels around the GEMMs of BOOST's online RMSNorm.

`rmsnorm` holds the public, device-dispatching functions (Triton on CUDA, torch ops
elsewhere); `_rmsnorm_triton` the Triton kernels, imported on first use. `float8` holds
the three GEMMs of a linear in float8 through torchao (imported on first use), which the
TP styles call with a recipe or None.
"""

from .rmsnorm import (
    partial_backward_reference,
    partial_stats_reference,
    rmsnorm_partial_backward,
    rmsnorm_partial_stats,
)

__all__ = [
    "partial_backward_reference",
    "partial_stats_reference",
    "rmsnorm_partial_backward",
    "rmsnorm_partial_stats",
]
