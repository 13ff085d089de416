"""Context parallelism in one process: the sequence sharding and its inverse, and the
one-line refusals of `apply_context_parallel` (twin: tests/distributed/
test_context_parallel.py, CP against one process on 4 gloo ranks)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor.experimental._context_parallel import _attention as ring

from boost_titan.boost_llama import BoostTransformer, flavor_args
from boost_titan.boost_llama.strategies import boost_layout
from boost_titan.parallelize import PlanError
from boost_titan.parallelize.context_parallel import (
    apply_context_parallel,
    chunk_order,
    shard_sequence,
    unshard_sequence,
)
from tests.helpers.foreign_models import CONFIG, PLAIN_LAYOUT, PlainDecoder


@dataclasses.dataclass
class Rank:
    """What `shard_sequence` reads of a CP mesh."""

    world: int
    rank: int

    def size(self) -> int:
        return self.world

    def get_local_rank(self) -> int:
        return self.rank


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("balance", [True, False], ids=["balanced", "in-order"])
def test_shards_reassemble_the_sequence(world, balance):
    seq = torch.arange(2 * 3 * 4 * world).view(2, 3, -1).transpose(1, 2)  # [2, 8w, 3]
    shards = [shard_sequence(Rank(world, r), [seq], load_balance=balance)[0] for r in range(world)]
    assert all(s.shape == (2, 4, 3) for s in shards)
    assert torch.equal(unshard_sequence(shards, load_balance=balance), seq)
    if balance:  # head-tail: rank r holds chunks r and 2n-1-r, each a quarter-chunk long
        chunks = seq.chunk(2 * world, dim=1)
        for r, shard in enumerate(shards):
            assert torch.equal(shard, torch.cat([chunks[r], chunks[2 * world - 1 - r]], 1))


def test_chunk_order():
    assert chunk_order(2, True) == [0, 3, 1, 2]
    assert chunk_order(2, False) == [0, 1, 2, 3]


def test_refuses_a_sequence_not_divisible_by_two_cp():
    with pytest.raises(
        PlanError, match=r"sequence length 6 is not divisible by 2 x CP degree \(4\)"
    ):
        shard_sequence(Rank(2, 0), [torch.zeros(1, 6)])


def _boost_model() -> BoostTransformer:
    return BoostTransformer(flavor_args("debug", n_layers=1, vocab_size=64))


def test_refuses_a_layout_naming_no_attention():
    layout = dataclasses.replace(boost_layout(_boost_model().args), attention=("attn",))
    with pytest.raises(PlanError, match=r"no module matches 'layers\.\*\.attn'.*attention"):
        apply_context_parallel(_boost_model(), None, layout)


def test_refuses_a_model_without_positions():
    model = PlainDecoder(dict(CONFIG, rank=16))
    layout = dataclasses.replace(PLAIN_LAYOUT, attention=("attn",))
    with pytest.raises(PlanError, match=r"PlainDecoder\.forward to take `positions`"):
        apply_context_parallel(model, None, layout)


class Masked(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(4, 4, dtype=bool))


class Wrapper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Masked()])

    def forward(self, q, positions=None):
        return self.layers[0](q, q, q)


@pytest.fixture
def ring_dispatch_restored():
    """`apply_context_parallel` routes DTensor SDPA to the ring process-wide: undo it."""
    yield
    ring._disable_context_parallel_dispatcher()


def test_refuses_masked_attention(ring_dispatch_restored):
    model = Wrapper()
    apply_context_parallel(
        model, None, dataclasses.replace(PLAIN_LAYOUT, blocks="layers", attention=("0",))
    )
    with pytest.raises(PlanError, match="without attn_mask; this model passes a mask"):
        model(torch.zeros(1, 1, 4, 8))
