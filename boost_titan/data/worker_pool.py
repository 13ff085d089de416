"""Run numbered tasks on forked worker processes, and notice a worker's death.

`multiprocessing.Pool` waits forever for the task of a worker killed by a signal (the
out-of-memory killer's SIGKILL), and its tasks travel pickled. Here each worker is forked
with the task function (nothing pickled: the data it reads is inherited) and receives only
task numbers over its own pipe, in batches (tiny tasks go many to a message, so a worker
does not wait on the parent between them: with 1 ms tasks on busy cores, one task per
message made two workers slower than one). A worker publishes the task it runs in shared
memory; the parent waits on the pipes and the processes' sentinels together, so a worker
that dies ends the run at once with `WorkerDied` naming that task.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections import deque
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

R = TypeVar("R")
QUEUED = 2
"""Batches a worker holds at once: the one it runs and the next, already in its pipe, so it
never waits for the parent between two batches."""


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


def _serve(work: Callable[[int], Any], conn: Connection, running: Any) -> None:
    """A worker's loop: run each batch received until None; send (ok, results or error)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the workers
    while (batch := conn.recv()) is not None:
        try:
            results = []
            for index in batch:
                running.value = index
                results.append(work(index))
            conn.send((True, results))
        except Exception as e:
            try:
                conn.send((False, e))
            except Exception:  # an exception that does not pickle
                conn.send((False, RuntimeError(f"{type(e).__name__}: {e}")))


class _Worker:
    def __init__(self, context: Any, work: Callable[[int], Any]) -> None:
        self.conn, child = context.Pipe()
        self.running = context.Value("q", -1, lock=False)
        """The task it runs (set by the worker)."""
        self.process = context.Process(target=_serve, args=(work, child, self.running), daemon=True)
        self.process.start()
        child.close()
        self.batches: deque[list[int]] = deque()
        """The batches sent and not returned, in order: the first is the one running."""
        self.ended = False
        """Whether it was sent None (no more batches)."""

    def died(self) -> WorkerDied:
        self.process.join(timeout=5)
        index = self.running.value if self.running.value >= 0 else self.batches[0][0]
        return WorkerDied(index, self.process.exitcode)


def run_tasks(
    work: Callable[[int], R], batches: list[list[int]], workers: int
) -> Iterator[tuple[int, R]]:
    """(index, work(index)) for each index of `batches` (the tasks sent together), batch
    by batch in completion order, on `workers` forked processes; an exception in a task is
    raised here; WorkerDied when a worker ends holding a batch. Leaving the iteration stops
    the workers."""
    context = multiprocessing.get_context("fork")
    queue = iter(batches)
    pool = [_Worker(context, work) for _ in range(min(workers, len(batches)))]
    by_object: dict[Any, _Worker] = {}
    for worker in pool:
        by_object[worker.conn] = by_object[worker.process.sentinel] = worker
    try:

        def give(worker: _Worker) -> None:
            """Fill the worker's queue to QUEUED batches, then None (its end) once
            `batches` is out."""
            while not worker.ended and len(worker.batches) < QUEUED:
                batch = next(queue, None)
                worker.ended = batch is None
                if batch is not None:
                    worker.batches.append(batch)
                try:
                    worker.conn.send(batch)
                except OSError:  # the worker is dead
                    if worker.batches:
                        raise worker.died() from None

        for worker in pool:
            give(worker)
        while busy := [w for w in pool if w.batches]:
            for ready in wait([o for w in busy for o in (w.conn, w.process.sentinel)]):
                worker = by_object[ready]
                if not worker.batches:
                    continue
                if not worker.conn.poll():
                    raise worker.died()
                try:
                    ok, value = worker.conn.recv()
                except (EOFError, OSError):  # (a socket pair resets: its batch unread)
                    raise worker.died() from None
                if not ok:
                    raise value
                batch = worker.batches.popleft()
                give(worker)
                yield from zip(batch, value, strict=True)
    finally:
        for worker in pool:
            if worker.process.is_alive():
                worker.process.terminate()
        for worker in pool:
            worker.process.join()
            worker.conn.close()
