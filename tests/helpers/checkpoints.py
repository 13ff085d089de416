"""Checkpoints made in this process: DCP folders of a fresh model (`save_checkpoint`) or of
the debug.toml job's model (`save_model_checkpoint`), reading them back bit for bit, and
planting payloads in them (`plant_metadata`, `plant_byte_item`)."""

from __future__ import annotations

import builtins
import dataclasses
import io
import os
import pickle
import subprocess
import warnings
from pathlib import Path
from typing import Any

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


def titan_state(step: int = 3) -> dict:
    """The non-tensor items TorchTitan saves next to the weights: train state, LR scheduler,
    and the dataloader's position as `pickle.dumps` bytes (TorchTitan's format)."""
    return {
        "lr_scheduler": {"last_epoch": step, "base_lrs": [3e-3], "lr_lambdas": [{}]},
        "train_state": {"step": step, "ntokens_seen": 32 * step},
        "dataloader": {"dp_rank_0": pickle.dumps({"_num_yielded": step}), "world_size": 1},
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
        state |= titan_state()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    return weights


def checkpoint_weights(folder: Path, tmp: Path) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors read by DCP's own converter (not by boost_titan.export)."""
    dcp_to_torch_save(str(folder), str(tmp / "whole.pt"))
    whole = torch.load(tmp / "whole.pt", weights_only=False)
    return {k: v for k, v in whole.items() if isinstance(v, torch.Tensor)}


def save_model_checkpoint(
    folder: Path, value: float = 1.0, *args: str, with_state: bool = False
) -> Path:
    """A DCP checkpoint (`.metadata` + one shard) of the debug.toml job's model (with the
    overrides `args`), every weight filled with `value` (`with_state`: and `titan_state`)."""
    from boost_titan.boost_llama.export_format import model_shapes
    from boost_titan.boost_llama.spec import job_args
    from boost_titan.config.cli import parse_job_config

    job = parse_job_config(["--job.config_file", str(DEBUG_TOML), *args])
    state: dict = {
        key: torch.full(shape, value) for key, shape in model_shapes(job_args(job)).items()
    }
    if with_state:
        state |= titan_state()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    return folder


# ---- planted payloads ----------------------------------------------------------------------
class Payload:
    """Pickles as a call of `function(*args)`: what a malicious checkpoint plants."""

    def __init__(self, function: Any, *args: Any) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple:
        return self.function, self.args


def payload(kind: str, marker: Path) -> Payload:
    """A pickle that creates `marker` when unpickled: through os.system ("os"), subprocess
    ("subprocess") or builtins.eval ("eval")."""
    if kind == "os":
        return Payload(os.system, f"touch {marker}")
    if kind == "subprocess":
        return Payload(subprocess.call, ["touch", str(marker)])
    return Payload(builtins.eval, f"open({str(marker)!r}, 'w').close()")


PAYLOAD_NAMES = {"os": "posix.system", "subprocess": "subprocess.call", "eval": "builtins.eval"}
"""What each payload asks for, as the refusal names it (os.system is posix's)."""


def plant_metadata(folder: Path, kind: str, marker: Path) -> None:
    """Replace the checkpoint's `.metadata` with a pickle of the payload."""
    (folder / ".metadata").write_bytes(pickle.dumps(payload(kind, marker)))


def plant_byte_item(folder: Path, key: str, kind: str, marker: Path, nested: bool = False) -> None:
    """Point the checkpoint's byte item `key` at a torch.save of the payload appended to its
    shard file (`nested`: of the payload's pickle as bytes, as TorchTitan stores the
    dataloader state); the metadata is rewritten to match, the rest stays as written."""
    path = folder / ".metadata"
    metadata = pickle.loads(path.read_bytes())  # the test's own checkpoint: trusted
    index = next(i for i in metadata.storage_data if i.fqn == key)
    info = metadata.storage_data[index]
    planted = payload(kind, marker)
    buffer = io.BytesIO()
    torch.save(pickle.dumps(planted) if nested else planted, buffer)
    shard = folder / info.relative_path
    offset = shard.stat().st_size
    with shard.open("ab") as f:
        f.write(buffer.getvalue())
    metadata.storage_data[index] = dataclasses.replace(
        info, offset=offset, length=len(buffer.getvalue())
    )
    path.write_bytes(pickle.dumps(metadata))
