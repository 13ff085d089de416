"""The one torchrun command line of the product's own launches (benchmarks, comparisons, tests).

`torchrun_command(nproc, module, args)` runs `python -m <module> <args>` on `nproc` local
processes through `torch.distributed.run` with a c10d rendezvous on a free port (so that
launches never collide), printing rank 0's output only. `worker_env()` is the environment
those workers get: one intra-op thread per process unless the caller set
OMP_NUM_THREADS, and the warnings that every CPU run prints silenced.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def torchrun_command(
    nproc: int, module: str, args: Sequence[str] = (), *, rank0_only: bool = True
) -> list[str]:
    """The command that runs `python -m module *args` on `nproc` local processes."""
    output = ["--local-ranks-filter", "0", "--tee", "3"] if rank0_only else []
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=localhost:0",
        *output,
        "-m",
        module,
        *args,
    ]


def worker_env(**extra: str) -> dict[str, str]:
    """This process's environment for the workers, plus `extra` (module docstring)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONWARNINGS", "ignore")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env | extra


__all__ = ["torchrun_command", "worker_env"]
