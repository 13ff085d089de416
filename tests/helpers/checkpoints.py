"""Checkpoints made in this process: DCP folders of a fresh model (`save_checkpoint`) or of
the debug.toml job's model (`save_model_checkpoint`), and reading them back bit for bit."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from boost_titan.boost_llama import BoostModelArgs, BoostTransformer, flavor_args
from tests.helpers import DEBUG_TOML

ARCHS = {  # each arch's [boost] settings
    "fullrank": {"arch": "fullrank"},
    "svd": {"arch": "svd"},
    "cola": {"arch": "cola"},
    "lax": {"arch": "lax", "lax_base": "svd"},
}


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (unlike torch.equal: NaN payloads and -0.0 count)."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


def debug_args(arch: str, vocab_size: int = 512, **overrides) -> BoostModelArgs:
    """The debug flavor of `arch` (a key of ARCHS), with `overrides`."""
    return flavor_args("debug", vocab_size=vocab_size, **ARCHS[arch], **overrides)


def save_checkpoint(
    folder: Path, args: BoostModelArgs, full: bool = True, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """A DCP checkpoint of a freshly initialised model; returns its model weights."""
    torch.manual_seed(0)
    model = BoostTransformer(args)
    model.init_weights()
    weights = {k: v.detach().to(dtype or v.dtype).clone() for k, v in model.state_dict().items()}
    state: dict = dict(weights)
    if full:  # what TorchTitan adds next to the model in a full checkpoint
        moments = {
            k: {"exp_avg": torch.ones_like(v), "step": torch.tensor(3.0)}
            for k, v in weights.items()
        }
        state["optimizer"] = {"state": moments}
        state["lr_scheduler"] = {"last_epoch": 3}
        state["train_state"] = {"step": 3, "ntokens_seen": 96}
        state["dataloader"] = {"dp_rank_0": b"position"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    return weights


def checkpoint_weights(folder: Path, tmp: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors read by DCP's own converter (not by boost_titan.export)."""
    dcp_to_torch_save(str(folder), str(tmp / "whole.pt"))
    whole = torch.load(tmp / "whole.pt", weights_only=False)
    return {k: v for k, v in whole.items() if isinstance(v, torch.Tensor)}


def save_model_checkpoint(folder: Path, value: float = 1.0, *args: str) -> Path:
    """A DCP checkpoint (`.metadata` + one shard) of the debug.toml job's model (with the
    overrides `args`), every weight filled with `value`."""
    from boost_titan.boost_llama.export_format import model_shapes
    from boost_titan.boost_llama.spec import model_args_for
    from boost_titan.config.cli import parse_job_config

    job = parse_job_config(["--job.config_file", str(DEBUG_TOML), *args])
    state = {
        key: torch.full(shape, value) for key, shape in model_shapes(model_args_for(job)).items()
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    return folder
