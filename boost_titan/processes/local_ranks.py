"""Run a function on N gloo processes of this host (CPU ranks), each ending in order.

`run_on_ranks(fn, world_size, **kwargs)` spawns `world_size` processes; each joins one gloo
group of all of them (127.0.0.1, a port the OS picked, one intra-op thread), calls
`fn(rank=rank, world_size=world_size, **kwargs)`, saves what it returns and ends with
`teardown.end_process` (the ranks meet, the groups are destroyed, no interpreter
finalization). It returns the results in rank order, or raises like
`torch.multiprocessing.spawn` when a rank fails (that rank's traceback in the message).
`fn` must be a module-level function (it is pickled).

Ranks start as fresh interpreters (`start_method="spawn"`, the default: each imports torch
and `fn`'s module again, ~20 s of CPU for 4 ranks that import TorchTitan), or forked from
one server process that imported torch and `fn`'s module once (`"forkserver"`, what the
test suite uses: the same launch in ~2 s once the server runs). Forked ranks get the
caller's environment at the call, but modules the server imported read theirs when it
started (the first forkserver call of the process), so a caller that sets variables read at
import time (compile caches, say) wants "spawn".
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import tempfile
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .teardown import end_process, end_process_groups


def free_port() -> int:
    """A port on 127.0.0.1 that no socket holds now (the OS picks it): the rendezvous of
    one local gloo group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(
    rank: int, world_size: int, port: int, out: str, env: dict, fn: Callable, kwargs: dict
) -> None:
    os.environ.clear()  # a forked rank: the caller's environment, not the server's
    os.environ.update(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        result = fn(rank=rank, world_size=world_size, **kwargs)
        torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    except BaseException:
        end_process_groups(finished=False)
        raise  # spawn's wrapper hands the traceback to the parent and exits 1
    end_process(0)


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *,
    start_method: Literal["spawn", "forkserver"] = "spawn",
    **kwargs: Any,
) -> list[Any]:
    """`fn(rank=, world_size=, **kwargs)` on `world_size` gloo ranks started by
    `start_method`; their return values in rank order (see the module docstring)."""
    if start_method == "forkserver":  # takes effect when the process's server starts
        multiprocessing.set_forkserver_preload(["torch", fn.__module__])
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(
            _rank,
            args=(world_size, free_port(), out, dict(os.environ), fn, kwargs),
            nprocs=world_size,
            join=True,
            start_method=start_method,
        )
        # written by the ranks just spawned, in this process's own temporary folder
        return [
            torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False)
            for r in range(world_size)
        ]
