"""BoostTrainer: PP gradient scale, NaN stop, run summary (torchrun runs are marked slow)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from boost_titan.runtime.checkpoint_files import latest_checkpoint
from boost_titan.runtime.run_log import RunLog
from boost_titan.runtime.trainer import TokenScaledLoss

ROOT = Path(__file__).resolve().parents[1]
STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*(\S+)\s+grad_norm:\s*(\S+)")


def test_token_scaled_loss_divides_only_while_set():
    loss = TokenScaledLoss(lambda pred, labels: (pred - labels).sum())
    pred, labels = torch.tensor([3.0, 5.0]), torch.tensor([1.0, 1.0])
    assert loss(pred, labels).item() == 6.0
    loss.denominator = torch.tensor(4.0)
    assert loss(pred, labels).item() == 1.5


def test_run_log_summary(tmp_path):
    log = RunLog(path=str(tmp_path / "losses.jsonl"))
    assert log.summary(final_step=20).startswith("no steps run")
    log.start()
    log.record(11, 5.0, 1000)
    log.record(12, 4.0, 1000)
    line = log.summary(final_step=12)
    assert "ran 2 steps (11-12)" in line and "loss 5.0000 (step 11) -> 4.0000 (step 12)" in line
    assert "-1.0000" in line and "tokens/s" in line
    rows = [json.loads(row) for row in (tmp_path / "losses.jsonl").read_text().splitlines()]
    assert rows == [
        {"step": 11, "loss": 5.0, "tokens": 1000},
        {"step": 12, "loss": 4.0, "tokens": 1000},
    ]
    assert log.activations_line() is None and "saved activations" not in line
    log.saved_activations = (11, 3 * 2**20 + 2**18)
    activations = "saved activations: 3.25 MiB per step on rank 0 (step 11)"
    assert log.summary(final_step=12) == f"{line}; {activations}"


def test_latest_checkpoint_skips_incomplete(tmp_path):
    for step, complete in ((5, True), (10, True), (15, False)):
        folder = tmp_path / f"step-{step}"
        folder.mkdir()
        if complete:
            (folder / ".metadata").write_text("")
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "step-10")
    assert latest_checkpoint(str(tmp_path / "missing")) is None


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
        str(ROOT / "train_configs" / "debug.toml"),
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


@pytest.mark.slow
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


@pytest.mark.slow
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
