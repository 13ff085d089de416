"""The end of a process that joined a process group, in an order that cannot fail finished
work; every multi-process command of boost-titan ends through it.

Two hazards turn finished work into a failed exit:

- A rank leaves while a peer still needs it: rank 0 hosts the TCPStore when torchrun does
  not share its own (`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`, which `run_train.sh` sets),
  and a peer that still talks to a gone store or group fails. `end_process_groups`: after
  finished work every rank meets the others at a barrier, destroys every group, then checks
  in on the store, and rank 0 (the store's host) waits until all have checked in. After an
  error there is no meeting (a peer may never get there): each rank only destroys its groups.
- The interpreter's finalization kills a gloo worker thread mid-destructor. A gloo group
  runs each collective on its own worker threads, which drop their reference to the
  collective's tensors just after the caller's `wait()` returns; releasing a tensor that
  has a Python object takes the GIL. Once the main thread has begun finalization, CPython
  ends any other thread that takes the GIL with `pthread_exit`, whose forced unwind through
  that (noexcept) C++ destructor calls `std::terminate`: "terminate called without an
  active exception", SIGABRT, after the work finished (torch checks `Py_IsInitialized`
  there, which stays true while finalizing: pytorch/pytorch#190489). `destroy_process_group`
  does not stop those threads: the group's destructor joins them only when the last
  reference goes, which after DTensor work does not happen before exit (their threads
  outlive `destroy_process_group` and `gc.collect()`). `exit_process` therefore does what
  exit does up to finalization (threads joined, atexit handlers, output flushed) and then
  ends the process with `os._exit`.

`end_process(status)` is both, for the end of a worker process; `run_to_end(main)` wraps
a command's entry point with it.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import NoReturn

import torch.distributed as dist

CLOSED_KEY = "boost_titan/closed"
"""Store counter of the ranks that have destroyed their process groups."""


def end_process_groups(finished: bool, timeout: timedelta = timedelta(seconds=60)) -> None:
    """Destroy every process group of this rank (see the module docstring); a no-op when
    none is initialized."""
    if not dist.is_initialized():
        return
    if not finished:
        dist.destroy_process_group()
        return
    dist.barrier()
    store = dist.distributed_c10d._get_default_store()
    world = dist.get_world_size()
    rank = dist.get_rank()
    dist.destroy_process_group()
    closed = store.add(CLOSED_KEY, 1)
    if rank != 0:
        return
    deadline = time.monotonic() + timeout.total_seconds()
    while closed < world and time.monotonic() < deadline:
        time.sleep(0.05)
        closed = store.add(CLOSED_KEY, 0)


def exit_process(status: int) -> NoReturn:
    """End the process with `status` the way the interpreter would, less its finalization
    (see the module docstring): join the other non-daemon threads, run the atexit handlers
    (logging's flush, multiprocessing's and Inductor's clean-up), flush stdout and stderr,
    then `os._exit`. Only for a process whose work is done."""
    # what the interpreter's exit runs before finalization, while everything is alive:
    threading._shutdown()  # threading's exit hooks (thread pools), then non-daemon joins
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to say
            pass
    os._exit(status)


def end_process(status: int = 0) -> NoReturn:
    """The end of a worker process: its process groups (the ranks meet when `status` is 0),
    then `exit_process(status)`."""
    try:
        end_process_groups(finished=status == 0)
    except Exception:  # a peer gone at the meeting: say so, and still end with a failure
        traceback.print_exc()
        status = status or 1
    exit_process(status)


def run_to_end(main: Callable[[], object]) -> NoReturn:
    """Run a command's `main` and `end_process` with its status: what it returns if that is
    an int (else 0), the code of a SystemExit it raises, or 1 after printing any other
    exception."""
    try:
        returned = main()
        status = returned if isinstance(returned, int) else 0
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        status = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:
        traceback.print_exc()
        status = 1
    end_process(status)
