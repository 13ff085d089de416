"""DCP checkpoints on disk: the `step-N` folders of a run, the one definition of the newest
complete step (`newest_step`, and `latest_checkpoint`, its folder), and whether a checkpoint
can be read safely (its `.metadata` and every byte item unpickle through the allowlist of
`boost_titan.checkpoint.safe_load`, and every file the metadata names is there and long
enough), and `read_tensors` (DCP's load through the same allowlist, one-line errors). Read
by the trainer, `check`, `export`, `eval` and `generate`; imports torch only to read a
checkpoint.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings
from typing import TYPE_CHECKING, Any

from boost_titan.config.errors import ConfigError

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata

_STEP_DIR = re.compile(r"step-(\d+)$")
METADATA = ".metadata"
DAMAGED = "the checkpoint is damaged, use another step-N folder"
UNSAFE = "refusing to load it; a checkpoint holds tensors and metadata only"
RESUME_FIX = (
    "move that step-N folder away to resume from the one before it, or pass --checkpoint.load_step"
)
TRAIN_STEP = "train_state.step"
"""The byte item holding the step a checkpoint was saved at."""
SHORT_WRITE = "unexpected pos"
"""How torch.save's zip writer reports a short write (ENOSPC, EFBIG) in DCP's shard files."""


def is_complete_checkpoint(path: str) -> bool:
    """A DCP checkpoint folder whose save finished: DCP writes `.metadata` last."""
    return os.path.isfile(os.path.join(path, METADATA))


def step_folders(folder: str) -> list[tuple[int, str]]:
    """(step, path) of every `step-N` folder under `folder`, complete or not, oldest first."""
    if not os.path.isdir(folder):
        return []
    return sorted(
        (int(m.group(1)), os.path.join(folder, name))
        for name in os.listdir(folder)
        if (m := _STEP_DIR.match(name))
    )


TITAN_STEP = re.compile(r"step-(\d+)")
"""How TorchTitan reads a folder name (`re.search`: `step-0002` and `old-step-2` count as
step 2, and a load of step 2 then reads `step-2`)."""
MARKERS = (METADATA, "model.safetensors.index.json")
"""What makes a `step-N` folder complete: DCP's `.metadata` (written last), or the index of
a checkpoint saved as Hugging Face safetensors."""


def has_marker(path: str) -> bool:
    """Whether the folder `path` holds one of `MARKERS`."""
    return any(os.path.isfile(os.path.join(path, marker)) for marker in MARKERS)


def newest_step(folder: str) -> int:
    """The newest complete step in `folder`, -1 for none: the one definition, read as
    TorchTitan reads folder names (`TITAN_STEP`, `MARKERS`; its `_find_load_step` agrees,
    `tests/unit/test_titan_internals.py`). Resuming, `check`, the trainer's messages and
    `export` all ask this."""
    if not os.path.isdir(folder):
        return -1
    steps = [
        int(m.group(1))
        for name in os.listdir(folder)
        if (m := TITAN_STEP.search(name)) and has_marker(os.path.join(folder, name))
    ]
    return max(steps, default=-1)


def folder_step(path: str) -> int | None:
    """The step of a folder named as TorchTitan names them (`step-N`), else None."""
    m = _STEP_DIR.match(os.path.basename(os.path.normpath(path)))
    return int(m.group(1)) if m and m.group(1) == str(int(m.group(1))) else None


def misnamed_step(folder: str, step: int) -> str | None:
    """Why `step` cannot be loaded from `folder` though a folder there counts as that step
    (`step-0002`, `step-2.bak`: a load then reads `step-2`, absent), or None."""
    if not os.path.isdir(folder) or is_complete_checkpoint(os.path.join(folder, f"step-{step}")):
        return None
    names = sorted(
        name
        for name in os.listdir(folder)
        if (m := TITAN_STEP.search(name)) and int(m.group(1)) == step
    )
    if not names:
        return None
    return (
        f"{os.path.join(folder, names[0])} counts as step {step} for TorchTitan, which then "
        f"loads {os.path.join(folder, f'step-{step}')}, a complete checkpoint that is not "
        f"there; rename {names[0]} to step-{step} or move it out of {folder}"
    )


def latest_checkpoint(folder: str) -> str | None:
    """The folder of `newest_step(folder)` when it is a complete DCP checkpoint (what a
    rerun resumes from), else None."""
    step = newest_step(folder)
    path = os.path.join(folder, f"step-{step}")
    return path if step >= 0 and is_complete_checkpoint(path) else None


def read_metadata(path: str, where: str, fix: str = DAMAGED) -> Metadata:
    """The DCP metadata of the checkpoint folder `path`, unpickled through the allowlist and
    with DCP's types (`dcp_layout.check_types`). A file that asks for anything else, or does
    not unpickle into DCP metadata (garbage, truncated, foreign, a FIFO, outside the
    folder), is a one-line ConfigError that starts with `where` (e.g.
    "checkpoint.initial_load_path X") and ends with `fix` (UNSAFE for the former)."""
    from boost_titan.checkpoint import dcp_layout, safe_load

    try:
        dcp_layout.check_file(path, safe_load.METADATA)
        metadata = safe_load.read_metadata(path)
        dcp_layout.check_types(metadata)
    except safe_load.UnsafeCheckpoint as e:
        raise ConfigError(f"{where}: {e}: {UNSAFE}") from None
    except dcp_layout.BadCheckpoint as e:
        raise ConfigError(f"{where}: {e}; {fix}") from None
    except Exception as e:  # unpickling garbage fails in many ways
        reason = (
            safe_load.shown(str(e)) if isinstance(e, pickle.UnpicklingError) else type(e).__name__
        )
        raise ConfigError(f"{where}: cannot read its .metadata ({reason}); {fix}") from None
    return metadata


def check_storage_files(path: str, metadata: Metadata, where: str, fix: str = DAMAGED) -> None:
    """Every file the metadata names is a regular file inside `path` that holds the bytes
    it points to, and each tensor chunk's bytes are its shape's (`dcp_layout.check_layout`)."""
    from boost_titan.checkpoint import dcp_layout

    try:
        dcp_layout.check_layout(path, metadata)
    except dcp_layout.BadCheckpoint as e:
        raise ConfigError(f"{where}: {e}; {fix}") from None


def check_byte_items(
    path: str, metadata: Metadata, where: str, fix: str = DAMAGED, step: int | None = None
) -> None:
    """Every byte item (and the pickle in every bytes value of one) unpickles through the
    allowlist, and `train_state.step` is a step count (`step`, when given: the folder's)."""
    from boost_titan.checkpoint import safe_load

    try:
        values = safe_load.vet_byte_items(path, metadata)
    except safe_load.UnsafeCheckpoint as e:
        raise ConfigError(f"{where}: {e}: {UNSAFE}") from None
    except Exception as e:  # a damaged archive or pickle fails in many ways
        raise ConfigError(f"{where}: cannot read its non-tensor items ({e}); {fix}") from None
    if TRAIN_STEP not in values:
        return
    saved = values[TRAIN_STEP]
    if type(saved) is not int or saved < 0 or step not in (None, saved):
        expected = "a step count" if step is None else f"{step}, as its folder's name says"
        raise ConfigError(f"{where}: its {TRAIN_STEP} is {saved!r:.40}, not {expected}; {fix}")


def check_readable(path: str, where: str, fix: str = DAMAGED, step: int | None = None) -> Metadata:
    """`read_metadata`, `check_storage_files` and `check_byte_items`: what a load needs
    before it starts (and nothing in it runs code)."""
    metadata = read_metadata(path, where, fix)
    check_storage_files(path, metadata, where, fix)
    check_byte_items(path, metadata, where, fix, step)
    return metadata


def check_loadable(path: str, resuming: bool) -> Metadata:
    """`check_readable`, worded for the checkpoint's role in a training job: the one it
    resumes from (`resuming`: its dump folder's newest, which must be a folder of that
    folder, not a symlink out: `dcp_layout.check_confined`) or its
    `checkpoint.initial_load_path`."""
    if resuming:
        from boost_titan.checkpoint import dcp_layout

        where, step = f"the checkpoint to resume from, {path}", folder_step(path)
        try:
            dcp_layout.check_confined(path)
        except dcp_layout.BadCheckpoint as e:
            raise ConfigError(f"{where}: {e}; {RESUME_FIX}") from None
        return check_readable(path, where, fix=RESUME_FIX, step=step)
    return check_readable(path, where=f"checkpoint.initial_load_path {path}")


def save_failure(failures: dict, path: str, kept: str | None) -> str:
    """One line for a DCP save of `path` that failed on some ranks (`failures`: rank ->
    (exception, traceback), as in DCP's CheckpointException): the first rank's reason, and
    which complete checkpoint a rerun resumes from."""
    rank = min(failures) if failures else None
    reason = "unknown reason"
    if rank is not None:
        error = failures[rank][0]
        if isinstance(error, OSError) and error.strerror:
            reason = error.strerror
        elif SHORT_WRITE in str(error):
            reason = "a write was cut short: disk full or a file-size limit"
        else:
            reason = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
    resume = (
        f"the newest complete checkpoint, {kept}, stays loadable"
        if kept
        else "no complete checkpoint yet"
    )
    return (
        f"saving the checkpoint {path} failed on rank {rank} ({reason}); {resume}: free space "
        f"in (or make writable) {os.path.dirname(path)}, then rerun"
    )


def failed_read(error: BaseException) -> BaseException:
    """The first rank's cause of a failed DCP read (DCP's CheckpointException gathers each
    rank's), else `error` itself."""
    failures = getattr(error, "failures", None)
    return failures[min(failures)][0] if failures else error


def read_tensors(state: dict[str, Any], reader: Any, failure: str, no_dist: bool = True) -> None:
    """`dcp.load` of `state` from the storage `reader` (`reads.GuardedReader` for a DCP
    folder), its byte items through the allowlist (`reads.GuardedPlanner`) and its
    single-process warning silenced; ConfigError `failure` (formatted with the cause's type
    name) when a file is short or damaged."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from .reads import GuardedPlanner

    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, storage_reader=reader, planner=GuardedPlanner(), no_dist=no_dist)
    except (Exception, CheckpointException) as e:  # DCP wraps a short read in several types
        raise ConfigError(failure.format(type(failed_read(e)).__name__)) from None
