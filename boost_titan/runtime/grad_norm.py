"""The global gradient norm, exact whatever the layout, and clipping by it.

TorchTitan sums the gradients' squares in their own dtype (`torch._foreach_norm`): on CPU
an fp32 sum of a large tensor under-counts by ~1e-4 relative, and by a different amount
for each shard size, so the logged `grad_norm` and the clipping factor differ between TP1
and TP2 although the gradients agree. Here each rank sums the squares of its local
gradient shards in fp64; the sums of gradients spread over the same process groups are
added up and all-reduced over those groups once, then over the pipeline stages. Layouts
then agree to fp64 rounding. The cost is one extra read of the gradients (multi-tensor
kernels, not one per gradient) and one tiny all-reduce per sharding kind and group.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate


def _groups(grad: torch.Tensor) -> tuple[dist.ProcessGroup, ...]:
    """The process groups the grad's elements are spread over (none: replicated). A mesh
    dim of one rank spreads nothing (mixed precision's FSDP2 mesh, `runtime.data_parallel`)."""
    if not isinstance(grad, DTensor):
        return ()
    if any(p.is_partial() for p in grad.placements):
        raise ValueError("a gradient with Partial placement; reduce it before the norm")
    mesh = grad.device_mesh
    return tuple(
        mesh.get_group(i)
        for i, p in enumerate(grad.placements)
        if not p.is_replicate() and mesh.size(i) > 1
    )


CPU_CHUNK = 1 << 16
"""Elements per fp64 chunk of a gradient on CPU."""


def reduce_partial_grads(parameters: Iterable[torch.Tensor]) -> None:
    """Reduce every gradient still Partial (a replicated weight used in a sharded region,
    e.g. TorchTitan's llama3 norms under sequence parallelism), in place of the optimizer's
    implicit reduction: its norm needs the sum, and the optimizer then gets it reduced."""
    for p in parameters:
        grad = p.grad
        if isinstance(grad, DTensor) and any(pl.is_partial() for pl in grad.placements):
            placements = [Replicate() if pl.is_partial() else pl for pl in grad.placements]
            p.grad = grad.redistribute(grad.device_mesh, placements)


def _sum_of_squares(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The fp64 sum of the squares of every element: on a GPU one multi-tensor
    `_foreach_norm` in fp64 (a few kernels however many tensors); on CPU, where that
    materialises an fp64 copy of every tensor, chunk by chunk through one reused fp64
    buffer (fp64 products and sums either way)."""
    if tensors[0].device.type != "cpu":
        return torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float64)).square().sum()
    total = torch.zeros((), dtype=torch.float64)
    buffer = torch.empty(min(CPU_CHUNK, max(t.numel() for t in tensors)), dtype=torch.float64)
    for tensor in tensors:
        flat = tensor.reshape(-1)
        for start in range(0, flat.numel(), CPU_CHUNK):
            part = flat[start : start + CPU_CHUNK]
            chunk = buffer[: part.numel()].copy_(part)
            total += torch.dot(chunk, chunk)
    return total


def total_norm(grads: Iterable[torch.Tensor], pp_mesh: DeviceMesh | None = None) -> torch.Tensor:
    """sqrt(sum of squares of every gradient element), in fp64, the same on every rank.
    Gradients spread over the same groups are summed together (`_sum_of_squares`)."""
    spread: dict[tuple[str, ...], tuple[tuple[dist.ProcessGroup, ...], list[torch.Tensor]]] = {}
    device = None
    for grad in grads:
        groups = _groups(grad)
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        device = local.device
        key = tuple(group.group_name for group in groups)
        spread.setdefault(key, (groups, []))[1].append(local)
    total = torch.zeros((), dtype=torch.float64, device=device)
    for groups, locals_ in spread.values():
        square = _sum_of_squares(locals_)
        for group in groups:
            dist.all_reduce(square, group=group)
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
    reduce_partial_grads(parameters)
    norm = total_norm([p.grad for p in parameters if p.grad is not None], pp_mesh)
    if error_if_nonfinite and not torch.isfinite(norm):
        raise RuntimeError(f"the total gradient norm is {norm.item()}")
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm.float(), foreach)
    return norm


__all__ = ["clip_grad_norm_exact_", "total_norm"]
