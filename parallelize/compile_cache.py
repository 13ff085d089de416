"""Compile caches that never hand one rank another rank's graph.

torch 2.13's AOTAutograd cache (on by default with Inductor) keys a compiled graph by
the dynamo graph, the inputs' metadata and the compile configs. For a DTensor input that
metadata is its `DTensorSpec` (mesh shape, placements, global shape), the same on every
rank of the mesh. But AOT autograd lowers DTensor ops to local ops with facts of this
rank baked in: its mesh coordinate (loss parallel's cross-entropy compares the labels
with this rank's vocabulary range, [0, V/tp) on rank 0 and [V/tp, 2V/tp) on rank 1)
and the names of the process groups its collectives use. So in a cache folder that
several ranks share (Inductor's default folder, one per machine and user, outlives
every job), the second run of a job loads, on every rank, whichever rank's graph was
stored under the shared key: the loss of a compiled TP job is silently wrong from its
first step (step-1 loss 1.78 instead of 8.85 on the debug model). A cold cache compiles
each rank's own graph, which is why the first run is right.

Upstream: pytorch/pytorch#188390 (rank 1 hit rank 0's AOTAutograd entry); its fix,
#188401, adds the local tensor's device to the DTensor key, which separates ranks on
different CUDA devices of one machine but not ranks on CPU, nor a rank on `cuda:0` of
one node from `cuda:0` of another sharing a cache folder or remote cache; the graphs of
different TP groups share keys too (pytorch/pytorch#176532).

The fix here puts what the graphs depend on into every key: `torch.compiler.config.
cache_key_tag`, which Inductor's FX graph cache and the AOTAutograd cache (and dynamo's
profile-guided cache) add to their keys, gets this rank's global rank and the name and
members of every process group of the given meshes. A rank then only reuses graphs it
compiled itself under the same groups, in any later job and in any cache folder; nothing
is turned off.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from .torch_internals import set_compile_cache_tag

TAG_MARK = "boost-titan-rank:"
"""Starts this module's part of `torch.compiler.config.cache_key_tag` (a user's own tag
stays in front of it)."""


def rank_cache_tag(meshes: list[DeviceMesh]) -> str:
    """This rank and, for each dimension of `meshes` with more than one rank, its process
    group's name and global ranks; sorted, so the order of `meshes` does not matter."""
    groups = set()
    for mesh in meshes:
        for dim in range(mesh.ndim):
            if mesh.size(dim) > 1:
                group = mesh.get_group(dim)
                groups.add(f"{group.group_name}={dist.get_process_group_ranks(group)}")
    return f"{TAG_MARK}{dist.get_rank()};" + ";".join(sorted(groups))


def key_compile_caches_by_rank(*meshes: DeviceMesh) -> str:
    """Make every compile cache key of this process name this rank and the process groups
    of `meshes`, so that no rank loads a graph compiled by another rank or for other
    groups (see the module docstring). Call it after the meshes exist and before the first
    compiled call; calling it again replaces the previous rank part. Returns the tag.

    Args:
        *meshes (DeviceMesh): the device meshes whose collectives or coordinates compiled
            graphs may use (`apply_plan` passes its TP mesh; a trainer passes all of its
            meshes).

    Returns:
        str: the new ``torch.compiler.config.cache_key_tag``: a tag already set by the
        user, then this rank and, per mesh dimension of more than one rank, its process
        group's name and ranks.

    Example::

        >>> import torch
        >>> import torch.distributed as dist
        >>> from torch.distributed.device_mesh import init_device_mesh
        >>> from boost_titan.parallelize import key_compile_caches_by_rank
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> mesh = init_device_mesh("cpu", (1,))  # under torchrun: ("cuda", (tp,))
        >>> key_compile_caches_by_rank(mesh)  # a 1-rank mesh has no group to name
        'boost-titan-rank:0;'
        >>> torch.compiler.config.cache_key_tag
        'boost-titan-rank:0;'
        >>> dist.destroy_process_group()
    """
    user_tag = torch.compiler.config.cache_key_tag.split(TAG_MARK)[0]
    set_compile_cache_tag(user_tag + rank_cache_tag(list(meshes)))
    return torch.compiler.config.cache_key_tag
