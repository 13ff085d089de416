"""Every rank resumes from the checkpoint rank 0 picks, after reading it safely.

Left to itself, each rank would look for the newest `step-N` folder on its own. Ranks that
see the folder differently (a shared file system that lags, or another job writing the same
folder) then load different steps and fail, or train on mixed weights.
`agree_on_checkpoint` makes rank 0's choice everyone's: rank 0 picks
(`files.newest_step`), broadcasts the step, and every rank reports whether it sees that
checkpoint; a rank that cannot see it ends the job on every rank with the same one-line
error. `check_checkpoint_to_load` then reads the checkpoint the choice will load (its
`.metadata`, once, and every pickle) through the allowlist, on every rank alike. The
checkpointer is read (`folder`, `initial_load_path`, `initial_load_in_hf`), never changed;
`runtime.resume` loads the choice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.checkpoint.metadata import Metadata
from torchtitan.tools.logging import logger

from boost_titan.checkpoint.files import check_loadable, has_marker, misnamed_step, newest_step
from boost_titan.config.errors import ConfigError


@dataclass(frozen=True)
class Choice:
    """What rank 0 saw: its checkpoint folder, whether it exists, and the step to load
    (-1: none)."""

    folder: str
    folder_exists: bool
    step: int


def pick(checkpointer, load_step: int) -> Choice:
    """What this rank would load: `load_step`, or the newest complete step (-1: none)."""
    folder = checkpointer.folder
    if not os.path.exists(folder):
        return Choice(folder, folder_exists=False, step=-1)
    step = newest_step(folder) if load_step == -1 else load_step
    return Choice(folder, folder_exists=True, step=step)


def disagreement(checkpointer, choice: Choice) -> str | None:
    """Why this rank cannot follow rank 0's `choice`, or None."""
    folder = checkpointer.folder
    if os.path.exists(folder) != choice.folder_exists:
        seen = "does not see" if choice.folder_exists else "sees"
        return f"{seen} the checkpoint folder {folder}"
    if choice.step >= 0 and not has_marker(os.path.join(folder, f"step-{choice.step}")):
        return f"does not see a complete {os.path.join(folder, f'step-{choice.step}')}"
    return None


def agree_on_checkpoint(checkpointer, load_step: int) -> Choice:
    """Rank 0's choice, on every rank (collective). Raises ConfigError on every rank if one
    cannot follow it."""
    rank = dist.get_rank()
    shared = [pick(checkpointer, load_step) if rank == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    choice: Choice = shared[0]
    views: list = [None] * dist.get_world_size()
    own_newest = pick(checkpointer, -1).step
    dist.all_gather_object(views, (disagreement(checkpointer, choice), own_newest))
    misnamed = choice.step >= 0 and misnamed_step(checkpointer.folder, choice.step)
    if misnamed:  # every rank sees it alike: a folder name, not a file system that lags
        raise ConfigError(misnamed)
    problems = [f"rank {r} {problem}" for r, (problem, _) in enumerate(views) if problem]
    if problems:
        plan = (
            f"rank 0 resumes from {os.path.join(choice.folder, f'step-{choice.step}')}"
            if choice.step >= 0
            else f"rank 0 finds no checkpoint in {choice.folder}"
        )
        raise ConfigError(
            f"{'; '.join(problems)} ({plan}); put job.dump_folder on a file system that every "
            "rank sees alike, and let one job at a time write to it"
        )
    newer = [(r, step) for r, (_, step) in enumerate(views) if step > choice.step]
    newer = newer if load_step == -1 else []  # a chosen load_step is nobody's newest
    if rank == 0 and newer:
        seen = ", ".join(f"rank {r} step-{step}" for r, step in newer)
        logger.warning(
            f"ranks see newer checkpoints than rank 0's step-{choice.step} ({seen}); every "
            "rank loads rank 0's choice"
        )
    return choice


def check_checkpoint_to_load(checkpointer, choice: Choice) -> Metadata | None:
    """What `checkpointer` will load after `choice` (this rank's step-N of rank 0's pick,
    else a DCP `checkpoint.initial_load_path` when the dump folder has no checkpoint folder)
    passes `check_loadable`: a ConfigError before any load starts. Returns its `.metadata`
    (None when nothing, or an export in safetensors, will be loaded)."""
    if choice.step >= 0:
        path = os.path.join(checkpointer.folder, f"step-{choice.step}")
        return check_loadable(path, resuming=True)
    if not choice.folder_exists and checkpointer.initial_load_path:
        if not checkpointer.initial_load_in_hf:  # an export is safetensors: no pickle
            return check_loadable(checkpointer.initial_load_path, resuming=False)
    return None
