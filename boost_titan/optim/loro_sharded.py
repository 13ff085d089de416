"""LORO's exact step on factors that may be DTensors (BTP's Shard(0) B and Shard(1) A on a TP
mesh, FSDP2's dim-0 shards on top, any placements of one mesh per pair), done once per pair.

For each pair, every rank of the pair's mesh gathers B, A, D_B, D_A to full tensors
(`full_tensor()`: an all-gather of (d_out + d_in) x r x 2); the pair's owner (the mesh's
rank number `pair index mod mesh size`, so the dense work is spread round-robin) runs the
dense step (`loro_exact.exact_step`: QRs and the one 2r x 2r SVD); the owner's new B and A
reach every rank of the mesh in one broadcast of (d_out + d_in) x r (along each mesh
dimension in turn), and each rank keeps its own shard, the placements unchanged. No rank
computes another's SVD: ranks that computed their own could pick different singular-vector
signs and corrupt B A. Pairs go in rounds of one pair per rank of the mesh, so a rank holds
at most one pair's full tensors and the owners' dense steps run side by side. Plain tensors
(one process, or a pair outside any mesh) take the dense step where they are.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor

from .loro_exact import exact_step

PairStep = tuple[Tensor, Tensor, Tensor, Tensor, float]
"""One pair's exact step: B, A (the parameters, changed in place), D_B, D_A, lr."""


def pair_mesh(b: Tensor, a: Tensor) -> DeviceMesh | None:
    """The one mesh of a pair's factors (None for plain tensors); a ValueError for a pair
    split between a DTensor and a plain tensor or over two meshes."""
    meshes = {t.device_mesh if isinstance(t, DTensor) else None for t in (b, a)}
    if len(meshes) != 1:
        raise ValueError("LORO: a pair's factors must both be plain tensors or share one mesh")
    return meshes.pop()


def _full(t: Tensor) -> Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _owner_coordinate(mesh: DeviceMesh, index: int) -> tuple[int, ...]:
    """The mesh coordinate of the rank numbered `index mod mesh size` (row-major)."""
    flat = index % mesh.size()
    coordinate = []
    for extent in reversed(mesh.shape):
        coordinate.append(flat % extent)
        flat //= extent
    return tuple(reversed(coordinate))


def broadcast_over_mesh(t: Tensor, mesh: DeviceMesh, owner: Sequence[int]) -> None:
    """Overwrite `t` on every rank of `mesh` with the owner's: a broadcast along each mesh
    dimension in turn (after dimension i, every rank holds the value of the rank whose
    coordinates up to i are the owner's and the rest its own)."""
    for dim, source in enumerate(owner):
        dist.broadcast(t, group=mesh.get_group(dim), group_src=source)


def _keep_own_shard(param: Tensor, full: Tensor) -> None:
    """Write this rank's part of `full` into `param` (its placements unchanged)."""
    if isinstance(param, DTensor):
        full = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
    param.copy_(full)


@torch.no_grad()
def exact_steps(steps: Sequence[PairStep]) -> None:
    """Each pair's exact step (the module docstring), every rank of each pair's mesh
    calling with the same pairs in the same order."""
    meshes = [pair_mesh(b, a) for b, a, *_ in steps]
    size = max((mesh.size() for mesh in meshes if mesh is not None), default=1)
    for start in range(0, len(steps), size):
        chunk = list(
            enumerate(zip(steps[start : start + size], meshes[start : start + size], strict=True))
        )
        owned = {}
        for i, ((b, a, d_b, d_a, lr), mesh) in chunk:  # every rank gathers every pair
            full = [_full(t) for t in (b, a, d_b, d_a)]
            if mesh is None or tuple(mesh.get_coordinate()) == _owner_coordinate(mesh, start + i):
                owned[i] = (*full, lr)
        new = {i: exact_step(*args) for i, args in owned.items()}  # the owners side by side
        for i, ((b, a, *_), mesh) in chunk:
            sizes = [b.numel(), a.numel()]
            if i in new:
                flat = torch.cat([t.reshape(-1).to(b.dtype) for t in new[i]])
            else:
                flat = torch.empty(sum(sizes), dtype=b.dtype, device=b.device)
            if mesh is not None:
                broadcast_over_mesh(flat, mesh, _owner_coordinate(mesh, start + i))
            new_b, new_a = flat.split(sizes)
            _keep_own_shard(b, new_b.view(b.shape))
            _keep_own_shard(a, new_a.view(a.shape))
