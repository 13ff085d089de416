"""A checkpoint of an `hf` run written back as a Hugging Face folder: config.json (with
`to_low_rank`'s ``low_rank`` record for a low-rank arch) and model.safetensors from
`parallelize.save_hf`, and the tokenizer files of the folder the run trained from.
`parallelize.load_hf` (transformers' ``from_pretrained`` plus the pairs) reads it."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from boost_titan.config.errors import ConfigError

from .args import ACTIVATIONS, HfModelArgs, read_config
from .model import convert

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)
"""Copied from the model folder when present."""
RANK_KEY = "model.layers.0.self_attn.q_proj.down.weight"
"""A low-rank checkpoint's first pair: its rows are the rank."""
CROSS_KEY = "model.layers.1.self_attn.q_proj.cross.weight"
"""A LaX checkpoint's first crossing (from the second block on)."""


def export_args(
    state: dict[str, torch.Tensor], folder: str, arch: str | None, lax_base: str | None = None
) -> HfModelArgs:
    """The run's model args from the checkpoint's shapes, the folder, `--arch` (svd and
    cola pairs have the same shapes; crossing shows lax) and `--lax-base` (lax's pairs)."""
    low_rank = RANK_KEY in state
    if arch is None and CROSS_KEY in state:
        arch = "lax"
    if arch is None:
        if low_rank:
            raise ConfigError(
                "the checkpoint's low-rank pairs fit --arch svd or cola (same shapes); pass "
                "the [boost] arch it was trained with"
            )
        arch = "fullrank"
    if arch not in ACTIVATIONS:
        raise ConfigError(
            f"--arch {arch} is not an arch of model.name hf ({', '.join(ACTIVATIONS)})"
        )
    if low_rank != (arch != "fullrank"):
        holds = "low-rank pairs" if low_rank else "full-rank projections"
        raise ConfigError(
            f"--arch {arch} does not fit the checkpoint (it holds {holds}); pass the arch "
            "it was trained with"
        )
    if arch == "lax" and lax_base is None:
        raise ConfigError(
            "the checkpoint's LaX pairs fit --lax-base svd or cola (same shapes); pass the "
            "[boost] lax_base it was trained with"
        )
    rank = int(state[RANK_KEY].shape[0]) if low_rank else 0
    config = read_config(folder)
    return HfModelArgs(
        folder=folder, arch=arch, rank=rank, lax_base=lax_base or "cola", config=config
    )


def export_hf(
    state: dict[str, torch.Tensor],
    out: str,
    folder: str,
    arch: str | None,
    lax_base: str | None = None,
) -> HfModelArgs:
    """Write `state` (a checkpoint's full model weights) as a Hugging Face folder `out`
    (absent or empty; written under a temporary name, then renamed), the model structure
    from `folder` (the run's `model.hf_assets_path`)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from boost_titan.parallelize import save_hf

    args = export_args(state, folder, arch, lax_base)
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    model = convert(AutoModelForCausalLM.from_config(config), args, init="random")
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        first = " ".join(str(e).split())[:300]
        raise ConfigError(
            f"the checkpoint does not hold {folder}'s model as {args.arch}: {first}; pass the "
            "model folder and --arch the run trained with"
        ) from None
    target = Path(out)
    if target.exists() and not (target.is_dir() and not any(target.iterdir())):
        raise ConfigError(
            f"--out {out} already exists and is not an empty folder; choose a new one"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        save_hf(model, tmp)
        for name in TOKENIZER_FILES:
            if os.path.isfile(os.path.join(folder, name)):
                shutil.copyfile(os.path.join(folder, name), tmp / name)
        umask = os.umask(0)
        os.umask(umask)
        for made in tmp.iterdir():  # safetensors and mkdtemp make them private
            made.chmod(0o666 & ~umask)
        tmp.chmod(0o777 & ~umask)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return args


__all__ = ["TOKENIZER_FILES", "export_args", "export_hf"]
