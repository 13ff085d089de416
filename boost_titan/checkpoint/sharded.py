"""A sharded model saved and loaded with torch.distributed.checkpoint: each rank writes its
own shards, and the folder loads into the same plan at another TP degree (DCP reshards),
its pickles read through `safe_load`'s allowlist (a folder from elsewhere runs no code).
For models sharded by `boost_titan.parallelize` (or any DTensor plan); the trainer's
checkpoints are TorchTitan's CheckpointManager's (`boost_titan.runtime.resume`).
"""

from __future__ import annotations

import os

import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from .dcp_layout import read_checked
from .reads import GuardedPlanner, GuardedReader


def save_sharded(model: nn.Module, folder: str | os.PathLike) -> None:
    """Save a sharded model with torch.distributed.checkpoint (each rank its own shards);
    every rank calls it.

    Args:
        model (nn.Module): the model after `apply_plan`.
        folder (str | os.PathLike): the checkpoint folder.

    Example::

        >>> import tempfile, torch
        >>> import torch.distributed as dist
        >>> from torch.distributed.device_mesh import init_device_mesh
        >>> from boost_titan.examples.own_model import LAYOUT, Decoder
        >>> from boost_titan.checkpoint.sharded import load_sharded, save_sharded
        >>> from boost_titan.parallelize import apply_plan, btp_plan
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> mesh = init_device_mesh("cpu", (1,))  # under torchrun: any TP degree
        >>> plan = btp_plan(LAYOUT, loss_parallel=False)
        >>> saved, fresh = (apply_plan(Decoder(), mesh, plan) for _ in range(2))
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     save_sharded(saved, folder)
        ...     load_sharded(fresh, folder)
        >>> ids = torch.randint(0, 256, (1, 8))
        >>> torch.equal(saved(ids), fresh(ids))
        True
        >>> dist.destroy_process_group()
    """
    dcp.save(get_model_state_dict(model), checkpoint_id=str(folder))


def load_sharded(model: nn.Module, folder: str | os.PathLike) -> None:
    """Load a `save_sharded` checkpoint into a model sharded by the same plan, at any TP
    degree (DCP reshards); every rank calls it. The folder is read up front
    (`dcp_layout.read_checked`): a pickle asking for anything outside `safe_load`'s
    allowlist raises `UnsafeCheckpoint`, a damaged or altered folder (wrong types, files
    outside it or not regular, tensors whose bytes are not their shapes') `BadCheckpoint`,
    each one line naming the file, before anything is loaded; DCP's own reads then go
    through the same allowlist (`GuardedReader` with that `.metadata`, `GuardedPlanner`).

    Args:
        model (nn.Module): the model after `apply_plan`; its weights are replaced.
        folder (str | os.PathLike): the checkpoint folder.

    Example::

        >>> import tempfile, torch
        >>> import torch.distributed as dist
        >>> from torch.distributed.device_mesh import init_device_mesh
        >>> from boost_titan.examples.own_model import LAYOUT, Decoder
        >>> from boost_titan.checkpoint.sharded import load_sharded, save_sharded
        >>> from boost_titan.parallelize import apply_plan, btp_plan
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> mesh = init_device_mesh("cpu", (1,))  # save at TP 2, load at TP 4: the same calls
        >>> model = apply_plan(Decoder(), mesh, btp_plan(LAYOUT, loss_parallel=False))
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     save_sharded(model, folder)
        ...     load_sharded(model, folder)  # resume: the weights (and shapes) as saved
        >>> dist.destroy_process_group()
    """
    metadata = read_checked(str(folder))
    state = get_model_state_dict(model)
    dcp.load(state, storage_reader=GuardedReader(str(folder), metadata), planner=GuardedPlanner())
    set_model_state_dict(model, state)
