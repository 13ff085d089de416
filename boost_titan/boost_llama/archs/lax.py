"""LaX: low-rank pairs (of `[boost] lax_base`: svd or cola) whose latent also sees the
same projection's latent of the previous block, ``h = act(LayerNorm(A x + G h_prev))``."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Architecture, Shape


@dataclass(frozen=True)
class LaX(Architecture):
    def activation(self, shape: Shape) -> str:
        return "silu" if shape.lax_base == "cola" else "none"

    def crossing(self, layer_id: int) -> bool:
        return layer_id > 0

    def extra_params(self, rank: int, layer_id: int) -> int:
        """G (r x r) and the latent LayerNorm's weight and bias, from the second block on."""
        return rank * rank + 2 * rank if self.crossing(layer_id) else 0


ARCH = LaX(
    "lax",
    "low-rank pairs crossing latents between blocks",
    carries_latents=True,
    latent_modules=("cross", "latent_norm"),
    fields=("lax_base",),
    priced=False,
)
