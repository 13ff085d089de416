"""The torchrun command line of the product's own launches (benchmarks, comparisons, tests);
`run_train.sh` builds the user's own, through `boost_titan.torchrun` (restarts, signals).

`torchrun_command(nproc, module, args)` runs `python -m <module> <args>` on `nproc` local
processes through `torch.distributed.run` with a c10d rendezvous on a free port (so that
launches never collide), printing rank 0's output only. `train_command` is that command for
`boost_titan.train` on a TOML and a dump folder, and `launch_training` runs it (`loss_compare`'s
`bench.measure.loss_curves`, the parity tests). `worker_env()` is the environment those
workers get: one intra-op thread per process unless the caller set OMP_NUM_THREADS, and the
warnings that every CPU run prints silenced. `pipeline_args` are the trainer's options for
two pipeline stages.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from boost_titan.config.errors import ConfigError


def torchrun_command(
    nproc: int,
    module: str,
    args: Sequence[str] = (),
    *,
    rank0_only: bool = True,
    launcher_args: Sequence[str] = (),
) -> list[str]:
    """The command that runs `python -m module *args` on `nproc` local processes;
    `launcher_args` go to torchrun itself (e.g. `--max-restarts 1`)."""
    output = ["--local-ranks-filter", "0", "--tee", "3"] if rank0_only else []
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=localhost:0",
        *output,
        *launcher_args,
        "-m",
        module,
        *args,
    ]


def train_command(
    nproc: int, config: str | Path, dump: str | Path, args: Sequence[str] = (), **options
) -> list[str]:
    """`torchrun_command` of `boost_titan.train` on the TOML `config`, writing into the dump
    folder `dump`; `options` are `torchrun_command`'s keywords."""
    job = ["--job.config_file", str(config), "--job.dump_folder", str(dump), *args]
    return torchrun_command(nproc, "boost_titan.train", job, **options)


def launch_training(
    nproc: int, config: str | Path, dump: str | Path, args: Sequence[str], timeout: float = 3600
) -> str:
    """Train (`train_command`) with one thread per worker and warnings silenced; rank 0's
    output. ConfigError (one line: the run's last line) when the run fails."""
    env = worker_env(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    command = train_command(nproc, config, dump, args)
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode:
        tail = (result.stdout + result.stderr).strip().splitlines()[-1:] or ["no output"]
        raise ConfigError(f"training into {dump} failed (exit {result.returncode}): {tail[0]}")
    return result.stdout + result.stderr


def pipeline_args(schedule: str = "1F1B", microbatch: int = 2) -> tuple[str, ...]:
    """The trainer's options for two pipeline stages under `schedule`."""
    return (
        "--parallelism.pipeline_parallel_degree",
        "2",
        "--parallelism.pipeline_parallel_schedule",
        schedule,
        "--parallelism.pipeline_parallel_microbatch_size",
        str(microbatch),
    )


def worker_env(**extra: str) -> dict[str, str]:
    """This process's environment for the workers, plus `extra` (module docstring)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONWARNINGS", "ignore")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env | extra


__all__ = [
    "launch_training",
    "pipeline_args",
    "torchrun_command",
    "train_command",
    "worker_env",
]
