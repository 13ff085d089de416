"""BoostTrainer under torchrun: a NaN loss stops the run and keeps the last good checkpoint
(`tests/unit/test_trainer.py`: its one-process pieces; PP's loss and grad norm against one
process: `test_training_parity.py`)."""

from __future__ import annotations

import os
import re
import subprocess

from boost_titan.checkpoint.files import latest_checkpoint
from boost_titan.job.launch import torchrun_command
from tests.helpers import DEBUG_TOML, ROOT


def torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("NGPU", "WORLD_SIZE")}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    job = [
        "--job.config_file",
        str(DEBUG_TOML),
        "--parallelism.tensor_parallel_degree",
        "1",
        "--metrics.disable_color_printing",
        "--metrics.log_freq",
        "1",
        "--training.local_batch_size",
        "4",
        *args,
    ]
    command = torchrun_command(nproc, "boost_titan.train", job, launcher_args=("--role", "rank"))
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
    run = torchrun(
        2,
        "--job.dump_folder",
        str(tmp_path),
        "--parallelism.data_parallel_shard_degree",
        "2",
        "--optimizer.lr",
        "1e6",
        "--lr_scheduler.warmup_steps",
        "0",
        "--training.max_norm",
        "1e9",
        "--training.steps",
        "10",
        "--checkpoint.interval",
        "1",
    )
    output = run.stdout + run.stderr
    assert run.returncode != 0
    errors = [line for line in output.splitlines() if "error: loss became" in line]
    assert len(errors) == 1, output[-3000:]
    bad_step = int(re.search(r"at step (\d+)", errors[0]).group(1))
    assert bad_step >= 2
    kept = latest_checkpoint(str(tmp_path / "checkpoint"))
    assert kept is not None and kept.endswith(f"step-{bad_step - 1}")
    assert kept in errors[0]
