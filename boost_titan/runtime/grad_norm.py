"""The global gradient norm, exact whatever the layout, and clipping by it.

TorchTitan sums the gradients' squares in their own dtype (`torch._foreach_norm`): on CPU
an fp32 sum of a large tensor under-counts by ~1e-4 relative, and by a different amount
for each shard size, so the logged `grad_norm` and the clipping factor differ between TP1
and TP2 although the gradients agree. Here each rank sums the squares of its local
gradient shards in fp64; the sums of gradients sharded the same way (same mesh, same
sharded mesh dims) are added up and all-reduced over those dims once, then over the
pipeline stages. Layouts then agree to fp64 rounding. The cost is one extra read of the
gradients in fp64 and one tiny all-reduce per sharding kind and mesh dim.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor


def _sharding(grad: torch.Tensor) -> tuple[DeviceMesh | None, tuple[int, ...]]:
    """The grad's mesh and the mesh dims its elements are spread over (none: replicated)."""
    if not isinstance(grad, DTensor):
        return None, ()
    if any(p.is_partial() for p in grad.placements):
        raise ValueError("a gradient with Partial placement; reduce it before the norm")
    return grad.device_mesh, tuple(i for i, p in enumerate(grad.placements) if not p.is_replicate())


def total_norm(grads: Iterable[torch.Tensor], pp_mesh: DeviceMesh | None = None) -> torch.Tensor:
    """sqrt(sum of squares of every gradient element), in fp64, the same on every rank."""
    sums: dict[tuple[int, tuple[int, ...]], tuple[DeviceMesh | None, torch.Tensor]] = {}
    device = None
    for grad in grads:
        mesh, dims = _sharding(grad)
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        device = local.device
        square = torch.linalg.vector_norm(local, dtype=torch.float64).square()
        key = (id(mesh), dims)
        previous = sums.get(key, (mesh, torch.zeros((), dtype=torch.float64, device=device)))[1]
        sums[key] = (mesh, previous + square)
    total = torch.zeros((), dtype=torch.float64, device=device)
    for (_, dims), (mesh, square) in sums.items():
        for dim in dims:
            dist.all_reduce(square, group=mesh.get_group(dim))
        total = total + square
    if pp_mesh is not None:
        dist.all_reduce(total, group=pp_mesh.get_group())
    return total.sqrt()


def clip_grad_norm_exact_(
    parameters: Iterable[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
    pp_mesh: DeviceMesh | None = None,
    ep_enabled: bool = False,
) -> torch.Tensor:
    """`torchtitan.distributed.utils.clip_grad_norm_` with the norm from `total_norm`
    (2-norm only; no expert parallelism). Returns the fp64 norm."""
    if norm_type != 2.0 or ep_enabled:
        raise ValueError("the exact gradient norm supports the 2-norm without expert parallelism")
    parameters = list(parameters)
    norm = total_norm([p.grad for p in parameters if p.grad is not None], pp_mesh)
    if error_if_nonfinite and not torch.isfinite(norm):
        raise RuntimeError(f"the total gradient norm is {norm.item()}")
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm.float(), foreach)
    return norm


__all__ = ["clip_grad_norm_exact_", "total_norm"]
