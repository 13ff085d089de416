"""What one rank runs in a training step, as plain records: GEMMs, collectives and
memory-bound kernels. `block` lists them for a configuration, `costs` prices them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Gemm:
    """A per-rank product [m, k] x [k, n]."""

    name: str
    m: int
    n: int
    k: int

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def bytes(self, dtype_bytes: int, input_bytes: int | None = None) -> int:
        """Operand traffic: both inputs (at `input_bytes`, default `dtype_bytes`) and the
        output."""
        inputs = dtype_bytes if input_bytes is None else input_bytes
        return (self.m * self.k + self.k * self.n) * inputs + self.m * self.n * dtype_bytes

    def intensity(self, dtype_bytes: int) -> float:
        return self.flops / self.bytes(dtype_bytes)

    def backward(self) -> tuple[Gemm, Gemm]:
        """dX = dY W^T ([m, n] x [n, k]) and dW = X^T dY ([k, m] x [m, n])."""
        dx = Gemm(f"{self.name}.dX", self.m, self.k, self.n)
        return dx, Gemm(f"{self.name}.dW", self.k, self.n, self.m)

    def to_json(self, dtype_bytes: int) -> dict:
        return dataclasses.asdict(self) | {
            "flops": self.flops,
            "intensity": self.intensity(dtype_bytes),
        }


@dataclass(frozen=True)
class Collective:
    """One collective of the TP group; sizes are those of each rank's input tensor.

    `behind`: names of the forward GEMMs whose weight-grad GEMMs run while this (backward)
    collective is in flight; empty when nothing hides it.
    """

    kind: str
    name: str
    elements_per_token: int
    behind: tuple[str, ...] = ()

    def bytes(self, tokens: int, dtype_bytes: int) -> int:
        return tokens * self.elements_per_token * dtype_bytes

    def to_json(self, tokens: int, dtype_bytes: int) -> dict:
        entry = {
            "kind": self.kind,
            "name": self.name,
            "elements_per_token": self.elements_per_token,
        }
        return entry | {"bytes": self.bytes(tokens, dtype_bytes), "behind": list(self.behind)}


@dataclass(frozen=True)
class Stream:
    """A memory-bound kernel (element-wise, normalisation, copy): the bytes it reads plus
    writes per token (or per micro-batch, for weight-sized kernels) and its launches."""

    name: str
    bytes: float
    launches: int = 1


@dataclass(frozen=True)
class Widths:
    """Per-rank widths (elements per token) of the tensors one block works on."""

    residual: int
    """The residual stream and the norms' inputs/outputs (d, or d/tp under BTP)."""
    q: int
    """Queries (and the attention output); keys and values are `kv` wide each."""
    kv: int
    ffn: int
    """Gate, up and their product."""
    latent: int
    """Latent width of each low-rank pair (0: full-rank)."""
    grouped: bool
    """A norm's consumers run their first GEMMs as one, writing one tensor."""
    silu_latents: bool
    """CoLA: a SiLU on every latent."""
    silu_gate: bool
    """A SiLU on the MLP gate (full-rank and SVD; CoLA's gate already ends in one)."""
    shared_silu: bool
    """The norm groups apply their consumers' latent SiLU once each, on the group output
    (a TP plan whose group output holds the latents); else one SiLU per latent."""
    interleaved_rope: bool = False
    """RoPE priced as its former stride-2 decomposition (`TrainingLayout.interleaved_rope`)."""
