"""`BoostModelArgs`: a `ModelShape` (`shapes`) that speaks TorchTitan's model-args protocol."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import nn
from torchtitan.protocols.model import BaseModelArgs

from boost_titan.config.errors import ConfigError
from boost_titan.config.optimizer import LoroSettings

from .shapes import FLAVORS, ModelShape, flavor_shape


@dataclass
class BoostModelArgs(ModelShape, BaseModelArgs):
    """A `ModelShape` that TorchTitan builds the model from: the job's `[boost]` section
    and tokenizer complete it (`update_from_config`)."""

    # ---- TorchTitan protocol -------------------------------------------------------
    def update_from_config(self, job_config, **kwargs) -> None:
        """Take arch/rank/max_seq_len (and LORO's settings) from `[boost]`, size the vocab
        for the tokenizer (`model_vocab_size`) and check seq_len against the model."""
        from boost_titan.data import model_vocab_size, tokenizer_vocab_size

        tokenizer_vocab = tokenizer_vocab_size(job_config)
        self.vocab_size = model_vocab_size(
            tokenizer_vocab, self.vocab_size, job_config.model.flavor
        )
        boost = job_config.boost
        self.arch = boost.arch
        self.lax_base = boost.lax_base
        if boost.rank < 0:
            raise ConfigError(
                f"[boost] rank {boost.rank} is negative; use 0 for the flavor default"
            )
        if boost.rank:
            self.rank = boost.rank
        if boost.max_seq_len < 0:
            raise ConfigError(
                f"[boost] max_seq_len {boost.max_seq_len} is negative; use 0 for the flavor's"
            )
        self.max_seq_len = boost.max_seq_len or self.max_seq_len
        self.loro = LoroSettings.of(boost)  # for the optimizer (`spec`), not the shape
        seq_len = job_config.training.seq_len
        if seq_len > self.max_seq_len:
            raise ConfigError(
                f"training.seq_len {seq_len} exceeds the model's maximum {self.max_seq_len} "
                f"({job_config.model.flavor}); raise --boost.max_seq_len to {seq_len} or "
                "lower --training.seq_len"
            )
        self.validate()

    def get_nparams_and_flops(self, model: nn.Module, seq_len: int) -> tuple[int, int]:
        """Parameter count of `model` and training FLOPs per token (6N + attention)."""
        nparams = sum(p.numel() for p in model.parameters())
        embedding = self.vocab_size * self.dim
        attention = 12 * self.n_layers * self.dim * seq_len
        return nparams, 6 * (nparams - embedding) + attention


def flavor_args(flavor: str, **overrides) -> BoostModelArgs:
    """A fresh `BoostModelArgs` of a flavor's shape with `overrides` applied."""
    shape = flavor_shape(flavor)
    fields = {f.name: getattr(shape, f.name) for f in dataclasses.fields(ModelShape)}
    return BoostModelArgs(**{**fields, **overrides})


__all__ = ["FLAVORS", "BoostModelArgs", "flavor_args"]
