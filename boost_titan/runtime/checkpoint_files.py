"""DCP checkpoints on disk: the `step-N` folders of a run, which are complete, and whether
one can be read safely (its `.metadata` and every byte item unpickle through the allowlist
of `boost_titan.parallelize.safe_load`, and every file the metadata names is there and long
enough), and `read_tensors` (DCP's load through the same allowlist, one-line errors). Read
by the trainer, `check`, `export`, `eval` and `generate`; imports torch only to read a
checkpoint.
"""

from __future__ import annotations

import os
import re
import warnings
from typing import TYPE_CHECKING, Any

from boost_titan.config.errors import ConfigError

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata

_STEP_DIR = re.compile(r"step-(\d+)$")
DAMAGED = "the checkpoint is damaged, use another step-N folder"
UNSAFE = "refusing to load it; a checkpoint holds tensors and metadata only"
RESUME_FIX = (
    "move that step-N folder away to resume from the one before it, or pass --checkpoint.load_step"
)
SHORT_WRITE = "unexpected pos"
"""How torch.save's zip writer reports a short write (ENOSPC, EFBIG) in DCP's shard files."""


def is_complete_checkpoint(path: str) -> bool:
    """A DCP checkpoint folder whose save finished: DCP writes `.metadata` last."""
    return os.path.isfile(os.path.join(path, ".metadata"))


def step_folders(folder: str) -> list[tuple[int, str]]:
    """(step, path) of every `step-N` folder under `folder`, complete or not, oldest first."""
    if not os.path.isdir(folder):
        return []
    return sorted(
        (int(m.group(1)), os.path.join(folder, name))
        for name in os.listdir(folder)
        if (m := _STEP_DIR.match(name))
    )


def latest_checkpoint(folder: str) -> str | None:
    """The newest complete `step-N` folder (one with DCP `.metadata`) under `folder`."""
    complete = [path for _, path in step_folders(folder) if is_complete_checkpoint(path)]
    return complete[-1] if complete else None


def read_metadata(path: str, where: str, fix: str = DAMAGED) -> Metadata:
    """The DCP metadata of the checkpoint folder `path`, unpickled through the allowlist. A
    file that asks for anything else, or does not unpickle into DCP metadata (garbage,
    truncated, foreign), is a one-line ConfigError that starts with `where` (e.g.
    "checkpoint.initial_load_path X") and ends with `fix` (UNSAFE for the former)."""
    from torch.distributed.checkpoint.metadata import Metadata

    from boost_titan.parallelize import safe_load

    try:
        metadata = safe_load.read_metadata(path)
    except safe_load.UnsafeCheckpoint as e:
        raise ConfigError(f"{where}: {e}: {UNSAFE}") from None
    except Exception as e:  # unpickling garbage fails in many ways
        reason = type(e).__name__
        raise ConfigError(f"{where}: cannot read its .metadata ({reason}); {fix}") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise ConfigError(f"{where}: its .metadata is not DCP metadata; {fix}")
    return metadata


def check_storage_files(path: str, metadata: Metadata, where: str, fix: str = DAMAGED) -> None:
    """Every file the metadata names exists under `path` and holds the bytes it points to."""
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, end in sorted(needed.items()):
        file = os.path.join(path, name)
        try:
            size = os.path.getsize(file)
        except OSError:
            missing = f"{name} is missing (its .metadata names it)"
            raise ConfigError(f"{where}: {missing}; {fix}") from None
        if size < end:
            raise ConfigError(
                f"{where}: {name} is truncated ({size:,} bytes, its .metadata needs {end:,}); {fix}"
            )


def check_byte_items(path: str, metadata: Metadata, where: str, fix: str = DAMAGED) -> None:
    """Every byte item (and a pickle inside one) unpickles through the allowlist."""
    from boost_titan.parallelize import safe_load

    try:
        safe_load.vet_byte_items(path, metadata)
    except safe_load.UnsafeCheckpoint as e:
        raise ConfigError(f"{where}: {e}: {UNSAFE}") from None
    except Exception as e:  # a damaged archive or pickle fails in many ways
        reason = type(e).__name__
        raise ConfigError(f"{where}: cannot read its non-tensor items ({reason}); {fix}") from None


def check_readable(path: str, where: str, fix: str = DAMAGED) -> Metadata:
    """`read_metadata`, `check_storage_files` and `check_byte_items`: what a load needs
    before it starts (and nothing in it runs code)."""
    metadata = read_metadata(path, where, fix)
    check_storage_files(path, metadata, where, fix)
    check_byte_items(path, metadata, where, fix)
    return metadata


def check_loadable(path: str, resuming: bool) -> Metadata:
    """`check_readable`, worded for the checkpoint's role in a training job: the one it
    resumes from (`resuming`: its dump folder's) or its `checkpoint.initial_load_path`."""
    if resuming:
        return check_readable(path, where=f"the checkpoint to resume from, {path}", fix=RESUME_FIX)
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


def read_tensors(state: dict[str, Any], reader: Any, failure: str, no_dist: bool = True) -> None:
    """`dcp.load` of `state` from the storage `reader`, its pickles through the checkpoint
    allowlist (`safe_load.guard_dcp`) and its single-process warning silenced; ConfigError
    `failure` (formatted with the cause's type name) when a file is short or damaged."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from boost_titan.parallelize.safe_load import guard_dcp

    guard_dcp()
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, storage_reader=reader, no_dist=no_dist)
    except (Exception, CheckpointException) as e:  # DCP wraps a short read in several types
        failures = getattr(e, "failures", None)
        cause = next(iter(failures.values()))[0] if failures else e
        raise ConfigError(failure.format(type(cause).__name__)) from None


class AsyncSaveFolder:
    """Names the folder of a failed async save. TorchTitan raises an async save's failure
    when it next waits for it (at the next save or the end of the run), by then another
    step: this wraps `checkpointer.dcp_save` to remember the folder of the save in flight."""

    def __init__(self, checkpointer: Any) -> None:
        self.checkpointer = checkpointer
        self.folder: str | None = None
        save = checkpointer.dcp_save

        def dcp_save(state_dict: dict, checkpoint_id: str, *args: Any, **kwargs: Any) -> Any:
            result = save(state_dict, checkpoint_id, *args, **kwargs)
            if result is not None:  # a future: the save goes on in the background
                self.folder = checkpoint_id
            return result

        checkpointer.dcp_save = dcp_save

    def failed(self, error: BaseException, current: str) -> str:
        """The folder whose save raised `error`: the async save in flight when `error` is
        its future's, else `current` (the synchronous save that raised it)."""
        future = self.checkpointer.save_future
        if future is None or not future.done() or future.cancelled():
            return current
        if future.exception() is not error:
            return current
        return self.folder or current
