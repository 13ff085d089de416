"""Context parallelism in one process: the sequence sharding and its inverse, the one-line
refusals of `apply_context_parallel` and of a model's first CP forward (on a 1-rank gloo
group), and `context_parallel_step` (twin: tests/distributed/test_context_parallel.py, CP
against one process on 4 gloo ranks)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental._context_parallel import _attention as ring

from boost_titan.boost_llama import BoostTransformer, flavor_args
from boost_titan.boost_llama.strategies import boost_layout
from boost_titan.parallelize import PlanError
from boost_titan.parallelize.context_parallel import (
    apply_context_parallel,
    chunk_order,
    load_balancing,
    shard_sequence,
    unshard_sequence,
)
from boost_titan.parallelize.cp_step import context_parallel_step
from tests.helpers import cp_models
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


def test_load_balance_option_is_scoped():
    """Sharding leaves torch's global CP option alone; `load_balancing` sets it for its
    block only, and restores it after an error too."""
    before = ring._cp_options.enable_load_balance
    shard_sequence(Rank(2, 0), [torch.zeros(1, 8)], load_balance=not before)
    assert ring._cp_options.enable_load_balance == before
    with pytest.raises(KeyError), load_balancing(not before):
        assert ring._cp_options.enable_load_balance == (not before)
        raise KeyError
    assert ring._cp_options.enable_load_balance == before


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


@pytest.mark.parametrize("world", [1, 2, 4])
def test_positions_of_shape_s_shard_along_their_only_dim(world):
    """Positions [s] (shared by the batch) give each rank what the rows of [b, s] get."""
    positions = torch.arange(8 * world) + 5
    rows = positions.expand(3, -1)
    for r in range(world):
        one, both = shard_sequence(Rank(world, r), [positions, rows])
        assert one.shape == (8,) and torch.equal(both, one.expand(3, -1))
    shards = [shard_sequence(Rank(world, r), [positions])[0] for r in range(world)]
    assert torch.equal(unshard_sequence(shards), positions)


def test_refuses_a_tensor_without_a_sequence_dim():
    with pytest.raises(PlanError, match=r"shards along dim 1, but a tensor has shape \(\)"):
        shard_sequence(Rank(2, 0), [torch.tensor(3)])


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
    hf_keyword = dataclasses.replace(cp_models.LAYOUT, positions="position_ids_")
    with pytest.raises(PlanError, match=r"to take `position_ids_`.*ModelLayout\.positions"):
        apply_context_parallel(cp_models.build("position-ids")[0], None, hf_keyword)


class Masked(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(4, 4, dtype=bool))


class Wrapper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Masked()])

    def forward(self, q, positions=None):
        return self.layers[0](q + positions, q, q)


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
        model(torch.zeros(1, 1, 4, 8), positions=torch.zeros(1))


@pytest.fixture
def one_rank(ring_dispatch_restored):
    """A 1-rank CP mesh (gloo): the ring runs, on the whole sequence."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, CONFIG["vocab"], (2, 16), generator=torch.Generator().manual_seed(1))
    return tokens, tokens.roll(-1, 1)


@pytest.mark.parametrize(
    "kind, message",
    [
        (
            "hand-written",
            r"^context parallelism: blocks\.0\.attn's forward called no "
            r"F\.scaled_dot_product_attention; only SDPA runs as ring attention",
        ),
        (
            "unused-positions",
            r"^context parallelism: UnusedPositions\.forward took `position_ids` but no "
            r"operation read it",
        ),
        (
            "block-sdpa",
            r"^context parallelism: F\.scaled_dot_product_attention ran at cp_models\.py:\d+ "
            r"in forward, outside the modules ModelLayout\.attention names \(blocks\.\*\.attn\)",
        ),
    ],
)
def test_silently_wrong_models_are_refused_at_the_first_step(one_rank, kind, message):
    """The three models that CP trained silently wrong (issue 46: gradients up to 88% off)
    are refused in one line by their first CP forward."""
    model, layout = cp_models.build(kind)
    apply_context_parallel(model, one_rank, layout)
    with pytest.raises(PlanError, match=message) as refused:
        context_parallel_step(model, *_batch())
    assert "\n" not in str(refused.value)


def test_refuses_a_forward_without_positions_and_a_second_apply(one_rank):
    model, layout = cp_models.build("position-ids")
    apply_context_parallel(model, one_rank, layout)
    with pytest.raises(PlanError, match=r"PositionIdsDecoder was called without `position_ids`"):
        model(_batch()[0])
    with pytest.raises(PlanError, match="already applied to this PositionIdsDecoder"):
        apply_context_parallel(model, one_rank, layout)


def test_step_refuses_a_model_without_cp_an_fsdp_model_and_a_wrong_batch(one_rank):
    from torch.distributed.fsdp import fully_shard

    model, layout = cp_models.build("position-ids")
    tokens, labels = _batch()
    with pytest.raises(PlanError, match="call apply_context_parallel.*first"):
        context_parallel_step(model, tokens, labels)
    sharded, _ = cp_models.build("position-ids")
    apply_context_parallel(sharded, one_rank, layout)
    fully_shard(sharded, mesh=one_rank)
    with pytest.raises(PlanError, match="FSDP would reduce them again"):
        context_parallel_step(sharded, tokens, labels)
    apply_context_parallel(model, one_rank, layout)
    with pytest.raises(PlanError, match=r"tokens and labels \[batch, seq\] of one shape"):
        context_parallel_step(model, tokens, labels[:, :8])
    with pytest.raises(PlanError, match=r"positions of shape \(8,\) for tokens \(2, 16\)"):
        context_parallel_step(model, tokens, labels, positions=torch.arange(8))


@pytest.mark.parametrize("kind, attention", [("position-ids", "attn"), ("block-sdpa", "")])
def test_step_computes_the_models_loss_and_gradients(one_rank, kind, attention):
    """`position_ids` [s] with an offset, and SDPA in the block's forward named by "": the
    step's loss and every gradient are the model's own (1 rank; CP 2 and 4 in the twin)."""
    model, layout = cp_models.build(kind, attention=(attention,))
    reference, _ = cp_models.build(kind)
    tokens, labels = _batch()
    positions = torch.arange(16) + 7
    labels[0, :3] = -100
    apply_context_parallel(model, one_rank, layout)
    loss = context_parallel_step(model, tokens, labels, positions=positions, verify=True)
    logits = reference(tokens, position_ids=positions)
    want = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    want.backward()
    torch.testing.assert_close(loss, want.detach(), rtol=1e-12, atol=0)
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-10, atol=1e-12, msg=name)


def test_refuses_transformers_eager_attention(one_rank):
    """transformers' "eager" attention is attention written by hand: refused; its
    `hf_layout` names `self_attn` and `position_ids` (SDPA: equal to one process at CP 2
    and 4 in the twin)."""
    from boost_titan.parallelize import hf_layout
    from tests.helpers.hf_models import build

    model = build("tf-llama", "megatron", layers=1)
    layout = hf_layout(model)
    assert (layout.attention, layout.positions) == (("self_attn",), "position_ids")
    apply_context_parallel(model, one_rank, layout)
    tokens, labels = _batch()
    with pytest.raises(PlanError, match=r"model\.layers\.0\.self_attn's forward called no"):
        context_parallel_step(model, tokens, labels, positions=torch.arange(16).expand(2, -1))
