"""A toy architecture registered from outside the package: low-rank pairs with tanh on
the latent, its own module and init (nothing of it is in boost_titan). Importing this
module registers it, the one registry call adding a family takes."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from boost_titan.boost_llama.archs import Architecture, register


class TanhPair(nn.Module):
    """``up(tanh(down(x)))``: `down` and `up` are the children BTP shards."""

    def __init__(self, d_in: int, d_out: int, rank: int) -> None:
        super().__init__()
        self.down = nn.Linear(d_in, rank, bias=False)
        self.up = nn.Linear(rank, d_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(torch.tanh(self.down(x)))


@dataclass(frozen=True)
class Toy(Architecture):
    def activation(self, shape) -> str:
        return "tanh"

    def projection(self, d_in: int, d_out: int, shape, layer_id: int) -> nn.Module:
        return TanhPair(d_in, d_out, shape.effective_rank)

    def init_projection(self, projection: nn.Module, std: float) -> None:
        for linear in (projection.down, projection.up):
            nn.init.normal_(linear.weight, std=std)


TOY = register(Toy("toy", "low-rank pairs with tanh on the latent", priced=False))
