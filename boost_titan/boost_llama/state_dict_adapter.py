"""TorchTitan's state-dict adapter for `boost_llama` exports (`export_format`).

`python -m boost_titan.export` writes an export from a DCP checkpoint. The trainer starts from
one with `--checkpoint.initial_load_path DIR --checkpoint.initial_load_in_hf`:
`BoostStateDictAdapter` (registered on the TrainSpec) maps keys one to one and checks the
export against the job's model before DCP's HuggingFaceStorageReader loads (and shards)
the weights.
"""

from __future__ import annotations

import os
from typing import Any

from torch.distributed.checkpoint import HuggingFaceStorageReader
from torchtitan.protocols.state_dict_adapter import BaseStateDictAdapter

from boost_titan.checkpoint.files import is_complete_checkpoint
from boost_titan.config.errors import ConfigError

from .args import BoostModelArgs
from .export_format import (
    CONFIG,
    WEIGHTS,
    first_shape_mismatch,
    model_fields,
    model_shapes,
    read_config,
)
from .shapes import FLAVORS, ModelShape

# ---- loading an export in the trainer ----------------------------------------------------
_FIX = {
    "arch": "--boost.arch {}",
    "lax_base": "--boost.lax_base {}",
    "rank": "--boost.rank {}",
    "vocab_size": "a tokenizer of {} tokens (model.hf_assets_path) or a flavor with that vocab",
}


def _compared(args: ModelShape) -> dict[str, Any]:
    """The `config.json` fields an export must share with the job's model (any
    max_seq_len serves)."""
    fields = model_fields(args)
    del fields["max_seq_len"]
    return fields


def _fix(name: str, exported: ModelShape) -> str:
    """The training option that makes the job's `name` match the export."""
    if name in _FIX:
        return _FIX[name].format(getattr(exported, name))
    sizes = ("dim", "n_layers", "n_heads", "ffn_dim", "norm_eps", "rope_theta")
    same = [
        f for f, a in FLAVORS.items() if all(getattr(a, n) == getattr(exported, n) for n in sizes)
    ]
    return f"--model.flavor {same[0]}" if same else "a model.flavor of the export's sizes"


def check_export_files(path: str, option: str = "checkpoint.initial_load_path") -> None:
    """An export folder (`checkpoint.initial_load_path` with `initial_load_in_hf`, or the
    `option` named in errors) must hold model.safetensors and config.json."""
    where = f"{option} {path}"
    make = f"python -m boost_titan.export --checkpoint <step-N folder> --out {path}"
    if not os.path.isdir(path):
        raise ConfigError(f"{where} is not a folder; point it at a folder written by {make}")
    if is_complete_checkpoint(path):
        raise ConfigError(
            f"{where} is a DCP checkpoint, not an export; drop --checkpoint.initial_load_in_hf"
        )
    for name in (WEIGHTS, CONFIG):
        if not os.path.isfile(os.path.join(path, name)):
            raise ConfigError(
                f"{where} has no {name} (not a complete export); write it with {make}"
            )


def check_export(path: str, args: ModelShape, option: str = "checkpoint.initial_load_path") -> None:
    """Raise ConfigError unless the export at `path` holds exactly the model `args` builds
    (errors name `path` as the value of `option`)."""
    from safetensors import safe_open

    check_export_files(path, option)
    where = f"{option} {path}"
    exported = read_config(path, where)
    ours = _compared(args)
    for name, value in _compared(exported).items():
        if ours.get(name) != value:
            raise ConfigError(
                f"{where} holds a model with {name} {value} ({CONFIG}) but the job's model has "
                f"{name} {ours.get(name)}; train with {_fix(name, exported)}, or export a "
                "matching checkpoint"
            )
    try:
        with safe_open(os.path.join(path, WEIGHTS), framework="pt") as f:
            stored = {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    except Exception as e:  # SafetensorError on a truncated or foreign file
        raise ConfigError(f"{where}: {WEIGHTS} is unreadable ({e}); export again") from None
    expected = model_shapes(args)
    key = first_shape_mismatch(expected, stored)
    if key is not None:
        raise ConfigError(
            f"{where}: {WEIGHTS} has {key} {stored.get(key, 'missing')} but the model "
            f"expects {expected.get(key, 'no such weight')}; export again"
        )


class BoostStateDictAdapter(BaseStateDictAdapter):
    """TorchTitan's hook for `initial_load_in_hf`: an export's keys are our FQNs, so both
    directions are the identity; the storage reader first checks the export against the
    job's model (one-line ConfigError)."""

    def __init__(self, model_args: BoostModelArgs, hf_assets_path: str | None) -> None:
        self.model_args = model_args
        self.hf_assets_path = hf_assets_path  # the tokenizer folder, not weights
        self.fqn_to_index_mapping = None  # one file

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        return dict(state_dict)

    def from_hf(self, hf_state_dict: dict[str, Any]) -> dict[str, Any]:
        return dict(hf_state_dict)

    def get_hf_storage_reader(
        self, path: str, from_quantized: bool = False
    ) -> HuggingFaceStorageReader:
        if from_quantized:
            raise ConfigError(
                "checkpoint.initial_load_in_hf_quantized is not supported by boost_llama "
                "exports; turn it off"
            )
        check_export(path, self.model_args)
        return HuggingFaceStorageReader(path)
