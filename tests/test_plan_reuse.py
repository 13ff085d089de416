"""The BTP plan applied to a torch-native model that is not ours (the README's example)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from distributed import run_on_ranks


class LowRank(nn.Module):
    def __init__(self, d_in: int, d_out: int, rank: int) -> None:
        super().__init__()
        self.down = nn.Linear(d_in, rank, bias=False)
        self.up = nn.Linear(rank, d_out, bias=False)

    def forward(self, x):
        return self.up(F.silu(self.down(x)))


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int, rank: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(dim, eps=1e-6)
        self.fc_in = LowRank(dim, hidden, rank)
        self.fc_out = LowRank(hidden, dim, rank)

    def forward(self, x):
        return x + self.fc_out(F.gelu(self.fc_in(self.norm(x))))


class TinyLM(nn.Module):
    """A low-rank MLP language model written without any knowledge of boost-titan."""

    def __init__(self, vocab=32, dim=32, hidden=64, rank=8, depth=2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, hidden, rank) for _ in range(depth))
        self.norm_f = nn.RMSNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm_f(h))


def tiny_btp_plan():
    from boost_titan.parallelize import ModelLayout, btp_plan

    layout = ModelLayout(
        blocks="blocks.*",
        shared_inputs={"norm": ("fc_in",)},
        own_inputs=("fc_out",),
        embedding="embed",
        final_norm="norm_f",
        head="head",
        fused_norms=False,  # plain nn.RMSNorm: sync norm, one all-reduce per low-rank pair
    )
    return btp_plan(layout, loss_parallel=False)


def _model_and_batch():
    torch.manual_seed(0)
    model = TinyLM()
    tokens = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))
    return model, tokens


def _worker(rank: int, world_size: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    from boost_titan.parallelize import apply_plan

    model, tokens = _model_and_batch()
    apply_plan(model, init_device_mesh("cpu", (world_size,)), tiny_btp_plan())
    logits = model(tokens)
    logits.square().mean().backward()
    grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    return {"logits": logits.detach(), **grads}


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_btp_plan_on_foreign_model(world_size):
    got = run_on_ranks(_worker, world_size)[0]
    model, tokens = _model_and_batch()
    logits = model(tokens)
    logits.square().mean().backward()
    want = {"logits": logits.detach(), **{n: p.grad for n, p in model.named_parameters()}}
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        err = ((got[name] - tensor).abs().max() / tensor.abs().max()).item()
        assert err <= 1e-5, f"{name}: relative error {err:.2e}"


def test_plan_keys_must_match():
    from torch.distributed.device_mesh import DeviceMesh

    from boost_titan.parallelize import apply_plan
    from boost_titan.parallelize.styles import Replicated

    model, _ = _model_and_batch()
    with pytest.raises(ValueError, match="matches no module"):
        apply_plan(model, DeviceMesh.__new__(DeviceMesh), {"nonexistent": Replicated()})
