"""torch.compile's caches keyed by rank (`parallelize.compile_cache`): the key tag names the
rank and its process groups (one process, fake process groups).
`tests/distributed/test_compile_cache.py`: a compiled job rerun on a warm cache equals eager.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from boost_titan.parallelize import key_compile_caches_by_rank


def _tag(rank: int, shape: tuple[int, ...], user_tag: str = "", calls: int = 1) -> str:
    """The tag rank `rank` of a fake world of prod(shape) ranks sets for a mesh of `shape`."""
    world = 1
    for size in shape:
        world *= size
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    saved = torch.compiler.config.cache_key_tag
    try:
        torch.compiler.config.cache_key_tag = user_tag
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp")[-len(shape) :])
        for _ in range(calls):
            tag = key_compile_caches_by_rank(mesh)
        assert torch.compiler.config.cache_key_tag == tag
        return tag
    finally:
        torch.compiler.config.cache_key_tag = saved
        dist.destroy_process_group()


def test_every_rank_gets_its_own_tag():
    tags = [_tag(rank, (2,)) for rank in range(2)]
    assert tags[0] != tags[1]
    assert tags[0] == _tag(0, (2,))  # stable: the same rank reuses its own entries


def test_same_coordinate_in_other_groups_differs():
    """Ranks 1 and 3 of DP 2 x TP 2 hold the same TP coordinate in different TP groups, and
    rank 1 of TP 2 x DP 2 is not rank 1 of TP 4: the graphs name other process groups."""
    assert _tag(1, (2, 2)) != _tag(3, (2, 2))
    assert _tag(1, (2, 2)) != _tag(1, (4,))


def test_user_tag_kept_and_calls_replace_not_append():
    once = _tag(1, (2,), user_tag="mine|")
    assert once.startswith("mine|boost-titan-rank:1;")
    assert _tag(1, (2,), user_tag="mine|", calls=3) == once
