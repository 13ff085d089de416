"""`HfModelArgs`: a Hugging Face folder's config.json with TorchTitan's model-args protocol,
completed by the job (`update_from_config`: the folder, `[boost] arch` and `rank`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from torch import nn
from torchtitan.protocols.model import BaseModelArgs

from boost_titan.config.errors import ConfigError
from boost_titan.config.optimizer import LoroSettings

ACTIVATIONS = {"fullrank": None, "svd": None, "cola": "silu", "lax": None}
"""`[boost] arch` -> the activation of `to_low_rank`'s pairs (fullrank: no conversion; lax:
its `[boost] lax_base`'s, with `to_low_rank`'s crossing); the one list of the archs this
family trains."""

CONFIG, WEIGHTS = "config.json", "model.safetensors"


def read_config(folder: str) -> dict:
    """The folder's config.json as a dict; ConfigError naming the option when it is missing."""
    path = os.path.join(folder, CONFIG)
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"model.hf_assets_path {folder!r}: cannot read {CONFIG} ({type(e).__name__}); "
            "point it at a Hugging Face model folder (config.json, model.safetensors, "
            "tokenizer.json)"
        ) from None
    if not isinstance(config, dict):
        raise ConfigError(f"model.hf_assets_path {folder!r}: {CONFIG} is not a JSON object")
    return config


@dataclass
class HfModelArgs(BaseModelArgs):
    """The model of a Hugging Face folder, converted to `arch` at bottleneck `rank`."""

    folder: str = ""
    arch: str = "cola"
    rank: int = 0
    lax_base: str = "cola"
    config: dict = field(default_factory=dict)

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def n_layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def low_rank(self) -> bool:
        return self.arch != "fullrank"

    @property
    def crossing(self) -> bool:
        """LaX: the pairs cross latents between blocks."""
        return self.arch == "lax"

    @property
    def activation(self) -> str | None:
        return ACTIVATIONS[self.lax_base if self.crossing else self.arch]

    def update_from_config(self, job_config, **kwargs) -> None:
        """Read the folder's config; take arch, lax_base, rank (0: hidden size / 4) and LORO's
        settings from `[boost]`."""
        boost = job_config.boost
        if boost.arch not in ACTIVATIONS:
            raise ConfigError(
                f"[boost] arch {boost.arch!r} is not trained by model.name hf; choose one of "
                f"{', '.join(ACTIVATIONS)}"
            )
        if boost.rank < 0:
            raise ConfigError(f"[boost] rank {boost.rank} is negative; use 0 for hidden size / 4")
        self.folder = job_config.model.hf_assets_path
        self.config = read_config(self.folder)
        self.arch = boost.arch
        self.lax_base = boost.lax_base
        self.rank = boost.rank or max(1, self.hidden_size // 4)
        self.loro = LoroSettings.of(boost)  # for the optimizer (`spec`), not the shape
        limit = self.config.get("max_position_embeddings")
        if limit and job_config.training.seq_len > limit:
            raise ConfigError(
                f"training.seq_len {job_config.training.seq_len} exceeds the model's "
                f"max_position_embeddings {limit} ({self.folder}/{CONFIG}); lower it"
            )

    def get_nparams_and_flops(self, model: nn.Module, seq_len: int) -> tuple[int, int]:
        """Parameter count of `model` and training FLOPs per token (6N + attention)."""
        nparams = sum(p.numel() for p in model.parameters())
        embedding = self.vocab_size * self.hidden_size
        attention = 12 * self.n_layers * self.hidden_size * seq_len
        return nparams, 6 * (nparams - embedding) + attention


__all__ = ["ACTIVATIONS", "CONFIG", "WEIGHTS", "HfModelArgs", "read_config"]
