"""Every rank resumes from the checkpoint rank 0 picks, after reading it safely.

TorchTitan's `CheckpointManager.load` lets each rank look for the newest `step-N` folder
on its own. Ranks that see the folder differently (a shared file system that lags, or
another job writing the same folder) then load different steps and fail, or train on
mixed weights. `agree_on_checkpoint` makes rank 0's choice everyone's: rank 0 picks,
broadcasts the step, every rank reports whether it sees that checkpoint, and the manager
is pinned to the step. A rank that cannot see it ends the job on every rank with the same
one-line error. `check_checkpoint_to_load` then reads the pickles of the checkpoint the
choice will load through the checkpoint allowlist, on every rank alike; `prepare_to_load`
is all of it, with DCP's own reads guarded, as BoostTrainer runs it before TorchTitan loads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist
from torchtitan.tools.logging import logger

from boost_titan.config.errors import ConfigError
from boost_titan.data.loader import guard_titan_dataloader
from boost_titan.parallelize.safe_load import guard_dcp, shown
from boost_titan.runtime.checkpoint_files import (
    DAMAGED,
    RESUME_FIX,
    TITAN_MARKERS,
    check_loadable,
    misnamed_step,
)
from boost_titan.runtime.titan_internals import newest_step, pin_newest_step


@dataclass(frozen=True)
class Choice:
    """What rank 0 saw: its checkpoint folder, whether it exists, and the step to load
    (-1: none)."""

    folder: str
    folder_exists: bool
    step: int


def _loadable(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, marker)) for marker in TITAN_MARKERS)


def pick(checkpointer, load_step: int) -> Choice:
    """The choice TorchTitan's `load(step=load_step)` would make on this rank."""
    folder = checkpointer.folder
    if not os.path.exists(folder):
        return Choice(folder, folder_exists=False, step=-1)
    step = newest_step(checkpointer) if load_step == -1 else load_step
    return Choice(folder, folder_exists=True, step=step)


def disagreement(checkpointer, choice: Choice) -> str | None:
    """Why this rank cannot follow rank 0's `choice`, or None."""
    folder = checkpointer.folder
    if os.path.exists(folder) != choice.folder_exists:
        seen = "does not see" if choice.folder_exists else "sees"
        return f"{seen} the checkpoint folder {folder}"
    if choice.step >= 0 and not _loadable(os.path.join(folder, f"step-{choice.step}")):
        return f"does not see a complete {os.path.join(folder, f'step-{choice.step}')}"
    return None


def agree_on_checkpoint(checkpointer, load_step: int) -> Choice:
    """Pin `checkpointer` to rank 0's choice on every rank (collective; call it on all
    ranks before `load`). Raises ConfigError on every rank if one cannot follow it."""
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
    pin_newest_step(checkpointer, choice.step)
    return choice


def check_checkpoint_to_load(checkpointer, choice: Choice) -> None:
    """What `checkpointer` will load after `choice` (this rank's step-N of rank 0's pick,
    else a DCP `checkpoint.initial_load_path` when the dump folder has no checkpoint folder)
    passes `check_loadable`: a ConfigError before any load starts."""
    if choice.step >= 0:
        path = os.path.join(checkpointer.folder, f"step-{choice.step}")
        check_loadable(path, resuming=True)
    elif not choice.folder_exists and checkpointer.initial_load_path:
        if not checkpointer.initial_load_in_hf:  # an export is safetensors: no pickle
            check_loadable(checkpointer.initial_load_path, resuming=False)


def prepare_to_load(checkpointer, load_step: int) -> Choice:
    """What every rank runs before `checkpointer.load`: DCP's reads through the checkpoint
    allowlist for the whole process (`guard_dcp`, and TorchTitan's dataloader state:
    `guard_titan_dataloader`), rank 0's pick made everyone's
    (`agree_on_checkpoint`), and that checkpoint's pickles read up front
    (`check_checkpoint_to_load`). Collective; raises ConfigError on every rank."""
    guard_dcp()
    guard_titan_dataloader()
    choice = agree_on_checkpoint(checkpointer, load_step)
    check_checkpoint_to_load(checkpointer, choice)
    load_in_one_line(checkpointer, choice)
    return choice


def load_in_one_line(checkpointer, choice: Choice) -> None:
    """Make `checkpointer.load` end a failed read (DCP's CheckpointException, a
    BaseException that TorchTitan's main reports as a traceback, and the trainer would take
    for a failed save) in one ConfigError line naming the checkpoint."""
    from torch.distributed.checkpoint.api import CheckpointException

    load = checkpointer.load
    if choice.step >= 0:
        path, fix = os.path.join(checkpointer.folder, f"step-{choice.step}"), RESUME_FIX
    else:
        path, fix = f"checkpoint.initial_load_path {checkpointer.initial_load_path}", DAMAGED

    def load_or_fail(*args, **kwargs):
        try:
            return load(*args, **kwargs)
        except CheckpointException as e:
            failures = e.failures or {}
            cause = failures[min(failures)][0] if failures else e
            reason = f"{type(cause).__name__}: {shown(' '.join(str(cause).split()))}"
            raise ConfigError(f"cannot load the checkpoint {path} ({reason}); {fix}") from None

    checkpointer.load = load_or_fail
