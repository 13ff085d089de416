"""LORO on sharded factors (`boost_titan.optim.loro_sharded`) on 4 gloo ranks: BTP's Shard(0)
B and Shard(1) A over TP 2 (two TP groups) and TP 4, and FSDP2's dim-0 shards on top of TP 2
(a dp_shard x tp mesh), five steps with two exact steps, random gradients: every parameter
equals the one-process LORO step on full tensors bit for bit (the owner's dense step runs the
same code on the same gathered tensors as the reference, in the same one-threaded process)."""

from __future__ import annotations

import torch
from torch import nn

from boost_titan.optim import LORO
from tests.helpers.distributed import randomize, run_on_ranks

SHAPES = [(16, 4, 16), (24, 4, 16), (16, 4, 24)]
"""Three pairs (d_out, r, d_in): the owners go round the mesh."""
HIDDEN, STEPS, EXACT_EVERY = 16, 5, 2


class Pairs(nn.Module):
    """Low-rank pairs and a norm weight (a parameter of no pair)."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs = nn.ModuleList(
            nn.ModuleDict(
                {"down": nn.Linear(d_in, r, bias=False), "up": nn.Linear(r, d_out, bias=False)}
            )
            for d_out, r, d_in in SHAPES
        )
        self.norm = nn.Parameter(torch.ones(HIDDEN))


def _loro(model: Pairs) -> LORO:
    pairs = [(p["up"].weight, p["down"].weight) for p in model.pairs]
    return LORO(
        model.parameters(),
        pairs=pairs,
        hidden_size=HIDDEN,
        lr=0.05,
        weight_decay=0.1,
        exact_every=EXACT_EVERY,
        rewarm_steps=2,
    )


def _shard(model: Pairs, layout: str) -> None:
    """BTP over the TP mesh (B Shard(0), A Shard(1), the norm replicated), then FSDP2 over
    dp_shard for "dp2-tp2"; "tp2" is the tp mesh of a 2 x 2 mesh (two TP groups of 2)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    if layout == "tp4":
        tp = init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))
    else:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
        tp = mesh["tp"]
    for pair in model.pairs:
        for name, placement in (("up", Shard(0)), ("down", Shard(1))):
            linear = pair[name]
            linear.weight = nn.Parameter(distribute_tensor(linear.weight.data, tp, [placement]))
    model.norm = nn.Parameter(distribute_tensor(model.norm.data, tp, [Replicate()]))
    if layout == "dp2-tp2":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=mesh["dp_shard"])


def _sharded_vs_one_process(layout: str) -> dict:
    from torch.distributed.tensor import DTensor, distribute_tensor

    torch.manual_seed(0)
    model = Pairs()
    randomize(model)
    reference = Pairs()
    reference.load_state_dict(model.state_dict())
    _shard(model, layout)
    placements = {n: p.placements for n, p in model.named_parameters()}
    optimizers = (_loro(model), _loro(reference))
    names = [n for n, _ in model.named_parameters()]
    for step in range(STEPS):
        g = torch.Generator().manual_seed(100 + step)
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            grad = torch.randn(q.shape, generator=g)
            q.grad = grad.clone()
            p.grad = distribute_tensor(grad, p.device_mesh, p.placements, src_data_rank=None)
        for optimizer in optimizers:
            optimizer.step()
    sharded = {n: p.full_tensor() for n, p in model.named_parameters()}
    full = dict(reference.named_parameters())
    return {
        "meshes": {p.device_mesh.shape for p in model.parameters() if isinstance(p, DTensor)},
        "kept": all(model.get_parameter(n).placements == placements[n] for n in names),
        "equal": {n: torch.equal(sharded[n], full[n]) for n in names},
        "gap": max((sharded[n] - full[n]).abs().max().item() for n in names),
    }


LAYOUTS = {"tp2": (2,), "tp4": (4,), "dp2-tp2": (2, 2)}
"""Each layout and the mesh shape its factors end on."""


def _layouts(rank: int, world_size: int) -> dict[str, dict]:
    return {layout: _sharded_vs_one_process(layout) for layout in LAYOUTS}


def test_sharded_loro_equals_one_process_bit_for_bit():
    """One launch of 4 ranks for the three layouts (the suite's time)."""
    for results in run_on_ranks(_layouts, 4):
        for layout, result in results.items():
            assert result["kept"], f"{layout}: a parameter's placements changed"
            assert all(result["equal"].values()), (layout, result["equal"], result["gap"])
            assert result["meshes"] == {LAYOUTS[layout]}
