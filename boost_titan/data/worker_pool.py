"""Run numbered tasks on forked worker processes, and notice a worker's death.

`multiprocessing.Pool` waits forever for the task of a worker killed by a signal (the
out-of-memory killer's SIGKILL), and its tasks travel pickled. Here each worker is forked
with the task function (nothing pickled: the plan it reads is inherited), receives only
task numbers over its own pipe, one at a time, and returns each result; the parent waits on
the pipes and the processes' sentinels together, so a worker that dies holding a task ends
the run at once with `WorkerDied` naming that task.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

R = TypeVar("R")


class WorkerDied(Exception):
    """A worker process ended while it held task `index`."""

    def __init__(self, index: int, exitcode: int | None) -> None:
        super().__init__(index, exitcode)
        self.index, self.exitcode = index, exitcode

    @property
    def killed(self) -> bool:
        """Whether SIGKILL ended it (what the out-of-memory killer sends)."""
        return self.exitcode == -signal.SIGKILL

    @property
    def how(self) -> str:
        """'was killed by SIGKILL', 'exited with status 3' (words for the message)."""
        if self.exitcode is not None and self.exitcode < 0:
            return f"was killed by {signal.Signals(-self.exitcode).name}"
        return f"exited with status {self.exitcode}"


def _serve(work: Callable[[int], Any], conn: Connection) -> None:
    """A worker's loop: run each task number received until None; send (index, ok, value)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the workers
    while (index := conn.recv()) is not None:
        try:
            conn.send((index, True, work(index)))
        except Exception as e:
            try:
                conn.send((index, False, e))
            except Exception:  # an exception that does not pickle
                conn.send((index, False, RuntimeError(f"{type(e).__name__}: {e}")))


class _Worker:
    def __init__(self, context: Any, work: Callable[[int], Any]) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(work, child), daemon=True)
        self.process.start()
        child.close()
        self.task: int | None = None

    def died(self) -> WorkerDied:
        self.process.join(timeout=5)
        return WorkerDied(self.task, self.process.exitcode)


def run_tasks(work: Callable[[int], R], todo: list[int], workers: int) -> Iterator[tuple[int, R]]:
    """(index, work(index)) for each index of `todo`, in completion order, on `workers`
    forked processes; an exception in a task is raised here; WorkerDied when a worker ends
    holding a task. Leaving the iteration stops the workers."""
    context = multiprocessing.get_context("fork")
    queue = iter(todo)
    pool = [_Worker(context, work) for _ in range(min(workers, len(todo)))]
    by_object: dict[Any, _Worker] = {}
    for worker in pool:
        by_object[worker.conn] = by_object[worker.process.sentinel] = worker
    try:

        def give(worker: _Worker) -> None:
            worker.task = next(queue, None)
            try:
                worker.conn.send(worker.task)
            except OSError:  # the worker died after its last result
                if worker.task is not None:
                    raise worker.died() from None

        for worker in pool:
            give(worker)
        while any(w.task is not None for w in pool):
            busy = [w for w in pool if w.task is not None]
            for ready in wait([o for w in busy for o in (w.conn, w.process.sentinel)]):
                worker = by_object[ready]
                if worker.task is None:
                    continue
                if not worker.conn.poll():
                    raise worker.died()
                try:
                    index, ok, value = worker.conn.recv()
                except EOFError:
                    raise worker.died() from None
                if not ok:
                    raise value
                give(worker)
                yield index, value
    finally:
        for worker in pool:
            if worker.process.is_alive():
                worker.process.terminate()
        for worker in pool:
            worker.process.join()
            worker.conn.close()
