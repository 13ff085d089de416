"""`Architecture`: what one projection family of the boost LLaMA model owns, importable
without torch (the performance model and the command lines read it); the factory imports
torch when it builds a projection."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from torch import nn


class Shape(Protocol):
    """The fields of a model shape an architecture reads (`shapes.ModelShape` has them)."""

    lax_base: str
    effective_rank: int


@dataclass(frozen=True)
class Architecture:
    """One projection family: its name (the `[boost] arch` value), what a projection is
    (`projection`, `init_projection`), its shapes (`extra_params`), its layout and plan
    hooks (`latent_modules`, `carries_latents`, `default_strategy`) and what the
    performance model prices (`low_rank`, `activation`, `extra_params`).

    The base class is a low-rank down/up pair (`parallelize.LowRankLinear`) with no
    activation: SVD-style. A family overrides what differs."""

    name: str
    summary: str
    low_rank: bool = True
    """Projections are down/up pairs (BTP, vanilla); else one full linear (megatron)."""
    carries_latents: bool = False
    """Each block hands its projections' latents to the next block (LaX's crossing)."""
    latent_modules: tuple[str, ...] = ()
    """Children of a pair acting on its latent: replicated by the plans, absent from the
    first block (`ModelLayout.crossing`)."""
    priced: bool = True
    """The performance model prices this family's block (`perf/block.py`: a pair's two
    GEMMs and its activation, or one linear); LaX's crossing it does not."""
    fields: tuple[str, ...] = ()
    """`ModelShape` fields of this family alone (LaX's lax_base): saved in `config.json`,
    asked for when a checkpoint's shapes cannot tell them."""

    @property
    def default_strategy(self) -> str:
        """`[boost] tp_strategy = "auto"`: btp for low-rank pairs, megatron for full linears."""
        return "btp" if self.low_rank else "megatron"

    def activation(self, shape: Shape) -> str:
        """The activation inside each pair: `"silu"` or `"none"`."""
        return "none"

    def crossing(self, layer_id: int) -> bool:
        """Whether block `layer_id`'s pairs cross with the previous block's latents."""
        return False

    def extra_params(self, rank: int, layer_id: int) -> int:
        """Parameters of one projection beyond r * (d_in + d_out) (full rank: unused)."""
        return 0

    def projection(self, d_in: int, d_out: int, shape: Shape, layer_id: int) -> nn.Module:
        """One projection of block `layer_id`: a `LowRankLinear` of the shape's rank."""
        from boost_titan.parallelize.low_rank import LowRankLinear

        activation = self.activation(shape)
        return LowRankLinear(
            d_in,
            d_out,
            shape.effective_rank,
            activation=None if activation == "none" else activation,
            crossing=self.crossing(layer_id),
        )

    def init_projection(self, projection: nn.Module, std: float) -> None:
        """Initialise one projection in place: CoLA's init of a pair (`std`: the full-rank
        init's, unused by pairs)."""
        projection.init_weights()
