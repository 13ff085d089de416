"""Shapes, flavors and closed-form sizes of the boost LLaMA family, importable without
torch (the performance model and the command lines read them). `args.BoostModelArgs`
adds TorchTitan's model-args protocol on top of `ModelShape`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from boost_titan.config import Arch, LaxBase, check_choice
from boost_titan.config.errors import ConfigError

from .archs import Architecture, architecture

PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")
"""The seven projections of a block, in the order they run."""


@dataclass
class ModelShape:
    """Shape and family of a LLaMA-style decoder whose projections may be low-rank.

    `rank = 0` means d/4 (the BOOST/CoLA default); `vocab_size = 0` means "take it from
    the tokenizer" (set by the TrainSpec before the model is built).
    """

    dim: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int | None = None
    ffn_dim: int = 688
    vocab_size: int = 0
    rank: int = 0
    arch: Arch = "cola"
    """A name of the architecture registry (`archs`)."""
    lax_base: LaxBase = "cola"
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 4096

    # ---- derived sizes -------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def architecture(self) -> Architecture:
        """The registry's object for `arch` (ConfigError for an unknown name)."""
        return architecture(self.arch)

    @property
    def low_rank(self) -> bool:
        return self.architecture.low_rank

    @property
    def effective_rank(self) -> int:
        return self.rank or self.dim // 4

    @property
    def activation(self) -> str:
        """Activation inside each low-rank pair: silu (CoLA) or none (SVD)."""
        return self.architecture.activation(self)

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        """(d_in, d_out) of each of the seven projections of one block."""
        d, kv = self.dim, self.kv_heads * self.head_dim
        return {
            "q": (d, self.n_heads * self.head_dim),
            "k": (d, kv),
            "v": (d, kv),
            "o": (self.n_heads * self.head_dim, d),
            "gate": (d, self.ffn_dim),
            "up": (d, self.ffn_dim),
            "down": (self.ffn_dim, d),
        }

    # ---- validation ----------------------------------------------------------------
    def validate(self) -> None:
        """Raise ConfigError (one line, with the fix) for an unknown family or impossible
        shapes."""
        architecture(self.arch)
        check_choice("lax_base", self.lax_base, LaxBase)
        if self.dim % self.n_heads:
            raise ConfigError(
                f"dim {self.dim} is not divisible by n_heads {self.n_heads}; pick a flavor "
                "whose dim is a multiple of its head count"
            )
        if self.n_heads % self.kv_heads:
            raise ConfigError(
                f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.kv_heads}"
            )
        if self.low_rank and not 0 < self.effective_rank <= self.dim:
            raise ConfigError(
                f"[boost] rank {self.rank} is out of range for dim {self.dim}; "
                f"use 1..{self.dim} (or 0 for the default d/4 = {self.dim // 4})"
            )


# ---- closed-form sizes ------------------------------------------------------------
def projection_params(args: ModelShape, name: str, layer_id: int) -> int:
    """Parameters of one projection: d_in*d_out (full) or r*(d_in+d_out) plus what the
    architecture adds (LaX's crossing)."""
    d_in, d_out = args.projection_shapes()[name]
    arch = args.architecture
    if not arch.low_rank:
        return d_in * d_out
    r = args.effective_rank
    return r * (d_in + d_out) + arch.extra_params(r, layer_id)


def param_count(args: ModelShape) -> int:
    """Closed-form parameter count: embedding + blocks + final norm + lm_head."""
    blocks = sum(
        2 * args.dim + sum(projection_params(args, p, layer) for p in PROJECTIONS)
        for layer in range(args.n_layers)
    )
    return 2 * args.vocab_size * args.dim + blocks + args.dim


# ---- flavors -----------------------------------------------------------------------
PAPER_VOCAB = 32000
"""Vocabulary of the paper-size flavors (LLaMA-2's tokenizer size)."""


def _flavor(dim: int, n_layers: int, n_heads: int, ffn_dim: int, **kw) -> ModelShape:
    return ModelShape(dim=dim, n_layers=n_layers, n_heads=n_heads, ffn_dim=ffn_dim, **kw)


FLAVORS: dict[str, ModelShape] = {
    # tiny, for CPU runs and tests; vocab comes from the tokenizer
    "debug": _flavor(256, 4, 8, 688, max_seq_len=2048),
    # CoLA's reference sizes (d / d_ff / layers / r)
    "60M": _flavor(512, 8, 8, 1376, rank=128, vocab_size=PAPER_VOCAB),
    "130M": _flavor(768, 12, 12, 2048, rank=256, vocab_size=PAPER_VOCAB),
    "350M": _flavor(1024, 24, 16, 2736, rank=256, vocab_size=PAPER_VOCAB),
    # BOOST's model table, r = d/4
    "1B": _flavor(2048, 24, 32, 5472, vocab_size=PAPER_VOCAB),
    "3B": _flavor(3072, 28, 24, 8192, vocab_size=PAPER_VOCAB),
    "7B": _flavor(4096, 32, 32, 11008, vocab_size=PAPER_VOCAB),
    "13B": _flavor(5120, 40, 40, 13824, vocab_size=PAPER_VOCAB),
    "30B": _flavor(8192, 36, 64, 22016, vocab_size=PAPER_VOCAB),
}


def flavor_named(name: str) -> str:
    """The flavor `name` stands for, case aside ("7b" -> "7B"); an unknown name unchanged."""
    return next((f for f in FLAVORS if f.lower() == name.lower()), name)


def flavor_shape(flavor: str, **overrides) -> ModelShape:
    """A fresh copy of a flavor's shape with `overrides` applied."""
    if flavor not in FLAVORS:
        raise ConfigError(f"unknown model.flavor {flavor!r}; choose one of {', '.join(FLAVORS)}")
    return dataclasses.replace(FLAVORS[flavor], **overrides)
