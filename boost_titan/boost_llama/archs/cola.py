"""CoLA: low-rank projections with SiLU on the latent, ``y = B(silu(A x))``."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Architecture, Shape


@dataclass(frozen=True)
class CoLA(Architecture):
    def activation(self, shape: Shape) -> str:
        return "silu"


ARCH = CoLA("cola", "low-rank pairs B(silu(A x))")
