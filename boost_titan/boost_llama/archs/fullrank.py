"""Full rank: every projection one plain linear, the baseline the low-rank families are
compared with (Megatron TP)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .base import Architecture, Shape

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class FullRank(Architecture):
    def projection(self, d_in: int, d_out: int, shape: Shape, layer_id: int) -> nn.Module:
        from torch import nn

        return nn.Linear(d_in, d_out, bias=False)

    def init_projection(self, projection: nn.Module, std: float) -> None:
        """Truncated normal(std) within 3 std, as TorchTitan's Llama."""
        from torch import nn

        nn.init.trunc_normal_(projection.weight, std=std, a=-3 * std, b=3 * std)


ARCH = FullRank("fullrank", "full-rank linears", low_rank=False)
