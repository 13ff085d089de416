"""Resuming a training job: every rank loads the checkpoint rank 0 picked, through the
checkpoint allowlist, with nothing of TorchTitan or torch patched.

`prepare_to_load` (collective, before the loop): rank 0's pick made everyone's
(`checkpoint.agree.agree_on_checkpoint`) and that checkpoint read up front
(`check_checkpoint_to_load`: its `.metadata` parsed once, every pickle through the
allowlist). `load_checkpoint` then does what TorchTitan's `CheckpointManager.load` does
for that choice (the states it loads, step 0 as the model alone, the model's flattened
states: `titan_internals.states_to_load` / `finish_load`), with DCP reading through
`GuardedReader` (the `.metadata` already read) and `GuardedPlanner` (every byte item, and
the dataloader state in one, through the allowlist); a failed read is one ConfigError line.
An export in safetensors (`checkpoint.initial_load_in_hf`: no pickle) is TorchTitan's own
load.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torchtitan.tools.logging import logger

from boost_titan.checkpoint.agree import Choice, agree_on_checkpoint, check_checkpoint_to_load
from boost_titan.checkpoint.files import DAMAGED, RESUME_FIX, failed_read
from boost_titan.checkpoint.reads import GuardedPlanner, GuardedReader
from boost_titan.checkpoint.safe_load import read_metadata, shown
from boost_titan.config.errors import ConfigError
from boost_titan.runtime.titan_internals import finish_load, states_to_load

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata


@dataclass(frozen=True)
class Resume:
    """What every rank agreed to load, and its `.metadata` (None: nothing read up front)."""

    choice: Choice
    metadata: Metadata | None


def prepare_to_load(checkpointer: Any, load_step: int) -> Resume:
    """Rank 0's pick made everyone's and that checkpoint read safely up front. Collective;
    raises ConfigError on every rank."""
    choice = agree_on_checkpoint(checkpointer, load_step)
    return Resume(choice, check_checkpoint_to_load(checkpointer, choice))


@torch.no_grad()
def load_checkpoint(checkpointer: Any, resume: Resume) -> bool:
    """Load what `resume` names into the checkpointer's states (collective); False when
    there is nothing to load."""
    choice = resume.choice
    if choice.folder_exists:
        if choice.step < 0:
            return False
        path = os.path.join(checkpointer.folder, f"step-{choice.step}")
        where, fix, model_only = path, RESUME_FIX, choice.step == 0
    elif checkpointer.initial_load_path and not checkpointer.initial_load_in_hf:
        path = checkpointer.initial_load_path
        where, fix = f"checkpoint.initial_load_path {path}", DAMAGED
        model_only = checkpointer.initial_load_model_only
    else:  # nothing, or an export's safetensors from Hugging Face: no pickle to read
        return checkpointer.load(step=choice.step)
    logger.info(f"Loading the checkpoint from {path}.")
    states = states_to_load(checkpointer, model_only)
    read_states(states, path, resume.metadata, where, fix)
    finish_load(checkpointer, states)
    return True


def read_states(
    states: dict[str, Any], path: str, metadata: Metadata | None, where: str, fix: str
) -> None:
    """DCP's load of `states` from `path` through the allowlist (`metadata`: its `.metadata`,
    read here when None); a failed read (DCP's CheckpointException, a BaseException that
    TorchTitan's main reports as a traceback and the trainer would take for a failed save)
    is one ConfigError line naming `where`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        metadata = metadata or read_metadata(path)  # DCP would hide why in a fallback's error
        dcp.load(states, storage_reader=GuardedReader(path, metadata), planner=GuardedPlanner())
    except (Exception, CheckpointException) as e:
        cause = failed_read(e)
        reason = f"{type(cause).__name__}: {shown(' '.join(str(cause).split()))}"
        raise ConfigError(f"cannot load the checkpoint {where} ({reason}); {fix}") from None
