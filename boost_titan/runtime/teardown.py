"""The end of a worker's distributed life, in an order that cannot fail a finished run.

A rank that leaves the interpreter with live gloo process groups while a peer still holds
their connections can die with SIGABRT ("terminate called without an active exception",
reproduced with two gloo ranks: about half of the runs where one rank exits without
`destroy_process_group` while the other is still up), and a rank whose TCPStore host is
gone can fail while it tears down; either turns a complete run into exit status 1.
TorchTitan's `main` destroys the groups on success only, after rank 0 has slept 2 seconds
"for other ranks to complete", and the rank-0 worker hosts the store when torchrun does not
share its own (`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`, which `run_train.sh` sets).

`end_process_groups`: after a finished run every rank meets the others at a barrier,
destroys every group, then checks in on the store, and rank 0 (the store's host) waits
until all have checked in before it may exit. After an error there is no meeting (a peer
may never get there): each rank only destroys its groups.
"""

from __future__ import annotations

import time
from datetime import timedelta

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
