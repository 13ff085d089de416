"""Which folder a failed asynchronous save was writing. TorchTitan raises an async save's
failure when it next waits for it (at the next save or the end of the run), by then another
step: `SaveWatch.saved(step)`, called after each `checkpointer.save(step)`, remembers the
step whose save left a new future behind (it goes on in the background); nothing of the
checkpointer is replaced."""

from __future__ import annotations

from typing import Any

from boost_titan.runtime.titan_internals import checkpoint_path


def _future(checkpointer: Any) -> Any:
    """The checkpointer's async save in flight (None without one, or with checkpointing off:
    TorchTitan's disabled CheckpointManager has no `save_future`)."""
    return getattr(checkpointer, "save_future", None)


class SaveWatch:
    """The folder of the asynchronous save in flight, read from the checkpointer's
    `save_future` after each save."""

    def __init__(self, checkpointer: Any) -> None:
        self.checkpointer = checkpointer
        self.future = _future(checkpointer)
        self.folder: str | None = None

    def saved(self, step: int) -> None:
        """After `checkpointer.save(step)`: a new future is step's save, still writing."""
        future = _future(self.checkpointer)
        if future is not None and future is not self.future:
            self.future, self.folder = future, checkpoint_path(self.checkpointer, step)

    def failed(self, error: BaseException, current: str) -> str:
        """The folder whose save raised `error`: the async save in flight when `error` is
        its future's, else `current` (the synchronous save that raised it)."""
        future = _future(self.checkpointer)
        if future is None or not future.done() or future.cancelled():
            return current
        if future.exception() is not error:
            return current
        return self.folder or current
