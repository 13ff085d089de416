"""Runs that are interrupted or repeated reproduce an uninterrupted run bit for bit.

2 ranks, BTP (debug.toml), fp32 on CPU, the default corpus. Losses are compared exactly
through rank 0's `losses.jsonl` (full float precision, unlike the log line).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from boost_titan.run_log import latest_checkpoint

ROOT = Path(__file__).resolve().parents[1]
STEPS = 10
COMMON = (
    "--training.seq_len", "64", "--training.local_batch_size", "4",
    "--metrics.log_freq", "1", "--metrics.no_enable_tensorboard",
    "--lr_scheduler.warmup_steps", "6", "--lr_scheduler.total_steps", str(STEPS),
    "--checkpoint.interval", "3",
    "--checkpoint.keep_latest_k", "0", "--debug.seed", "7", "--debug.deterministic",
)  # fmt: skip


def _command(dump: Path, steps: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
        "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "--local-ranks-filter", "0",
        "--tee", "3", *extra, "-m", "boost_titan.train",
        "--job.config_file", str(ROOT / "train_configs/debug.toml"),
        "--job.dump_folder", str(dump), "--training.steps", str(steps), *COMMON,
    ]  # fmt: skip


ENV = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _train(dump: Path, steps: int) -> str:
    result = subprocess.run(
        _command(dump, steps), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


def _logged(dump: Path) -> list[tuple[int, float]]:
    lines = (dump / "losses.jsonl").read_text().splitlines()
    return [(entry["step"], entry["loss"]) for entry in map(json.loads, lines)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[tuple[int, float]]:
    dump = tmp_path_factory.mktemp("reference")
    _train(dump, STEPS)
    logged = _logged(dump)
    assert [step for step, _ in logged] == list(range(1, STEPS + 1))
    return logged


@pytest.mark.slow
def test_same_seed_same_losses(reference, tmp_path):
    """--debug.seed + --debug.deterministic: a second run logs identical losses."""
    _train(tmp_path, STEPS)
    assert _logged(tmp_path) == reference


@pytest.mark.slow
def test_resume_in_warmup_is_exact(reference, tmp_path):
    """Stop after step 4 (warmup is 6 steps), rerun to STEPS: every loss is identical, and
    a newer half-written checkpoint is not taken as the latest.

    The checkpoint holds model, optimizer, LR scheduler and dataloader position; the LR
    schedule spans `lr_scheduler.total_steps`, not the interrupted run's `training.steps`."""
    _train(tmp_path, 4)
    assert latest_checkpoint(str(tmp_path / "checkpoint")).endswith("step-4")
    # what a crash while writing step 9 leaves behind: shards without DCP's .metadata
    partial = tmp_path / "checkpoint" / "step-9"
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"\0" * 64)
    output = _train(tmp_path, STEPS)
    assert "Summary: ran 6 steps (5-10)" in output
    assert _logged(tmp_path) == reference
