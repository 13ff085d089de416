"""BoostTrainer under torchrun: PP=2 logs the loss and grad norm of one process, and a NaN
loss stops the run and keeps the last good checkpoint (`tests/unit/test_trainer.py`: its
one-process pieces)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from boost_titan.runtime.checkpoint_files import latest_checkpoint
from tests.helpers import DEBUG_TOML, ROOT

STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*(\S+)\s+grad_norm:\s*(\S+)")


def torchrun(nproc: int, *args: str, log_rank: int = 0) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("NGPU", "WORLD_SIZE")}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint=localhost:0",
        "--role",
        "rank",
        "--local-ranks-filter",
        str(log_rank),
        "--tee",
        "3",
        "-m",
        "boost_titan.train",
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
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_pp_gradients_match_single_process(tmp_path):
    """Same seed checkpoint: PP=2 logs the loss and grad norm of one process (unscaled)."""
    seed = torchrun(
        1, "--job.dump_folder", str(tmp_path / "seed"), "--checkpoint.create_seed_checkpoint"
    )
    assert seed.returncode == 0, seed.stdout[-3000:] + seed.stderr[-3000:]
    load = [
        "--checkpoint.initial_load_path",
        str(tmp_path / "seed" / "checkpoint" / "step-0"),
        "--training.steps",
        "2",
    ]
    single = torchrun(1, "--job.dump_folder", str(tmp_path / "one"), *load)
    piped = torchrun(
        2,
        "--job.dump_folder",
        str(tmp_path / "pp"),
        "--parallelism.pipeline_parallel_degree",
        "2",
        *load,
        log_rank=1,
    )
    for run in (single, piped):
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    expected = [(s, float(loss), float(g)) for s, loss, g in STEP.findall(single.stdout)]
    got = [(s, float(loss), float(g)) for s, loss, g in STEP.findall(piped.stdout)]
    assert len(expected) == len(got) == 2, (expected, got)
    for (_, loss_1, grad_1), (_, loss_pp, grad_pp) in zip(expected, got, strict=True):
        assert loss_pp == pytest.approx(loss_1, abs=5e-4)
        assert grad_pp == pytest.approx(grad_1, rel=1e-3)


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
