"""Runs that are interrupted, crash or are repeated reproduce an uninterrupted run bit for bit.

2 ranks, BTP (debug.toml), fp32 on CPU, the default corpus. Losses are compared exactly
through rank 0's `losses.jsonl` (full float precision, unlike the log line).

Crash recovery: `MAX_RESTARTS=1 ./run_train.sh` with one rank SIGKILLing itself in the
first attempt (`BOOST_TITAN_FAULT_*`, see `boost_titan.runtime.restarts`); torchrun restarts both
ranks, which resume from the newest complete checkpoint.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from boost_titan.runtime.checkpoint_files import latest_checkpoint
from boost_titan.runtime.run_log import read_log
from tests.helpers import ROOT

STEPS = 10
COMMON = (
    "--training.seq_len",
    "64",
    "--training.local_batch_size",
    "4",
    "--metrics.log_freq",
    "1",
    "--metrics.no_enable_tensorboard",
    "--lr_scheduler.warmup_steps",
    "6",
    "--lr_scheduler.total_steps",
    str(STEPS),
    "--checkpoint.interval",
    "3",
    "--checkpoint.keep_latest_k",
    "0",
    "--debug.seed",
    "7",
    "--debug.deterministic",
)


def _command(dump: Path, steps: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--rdzv_backend=c10d",
        "--rdzv_endpoint=localhost:0",
        "--local-ranks-filter",
        "0",
        "--tee",
        "3",
        *extra,
        "-m",
        "boost_titan.train",
        "--job.config_file",
        str(ROOT / "train_configs/debug.toml"),
        "--job.dump_folder",
        str(dump),
        "--training.steps",
        str(steps),
        *COMMON,
    ]


ENV = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _train(dump: Path, steps: int) -> str:
    result = subprocess.run(
        _command(dump, steps), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


def _logged(dump: Path) -> list[tuple[int, float]]:
    rows, _ = read_log(str(dump / "losses.jsonl"))
    return [(row["step"], row["loss"]) for row in rows]


CPU_NOISE = (
    "HF assets path",  # TorchTitan's tokenizer path, unused with our default tokenizer
    "lspci",  # TorchTitan's GPU probe for the MFU peak
    "fallback to A100",  # its made-up peak; ours is measured
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",  # an NCCL setting TorchTitan overrides
    "Generating train split",  # datasets' progress bars
)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[tuple[int, float]]:
    """The uninterrupted run; its log holds none of CPU_NOISE and its dump folder no empty
    comm_traces/ (the NCCL flight recorder's)."""
    dump = tmp_path_factory.mktemp("reference")
    output = _train(dump, STEPS)
    logged = _logged(dump)
    assert [step for step, _ in logged] == list(range(1, STEPS + 1))
    assert [noise for noise in CPU_NOISE if noise in output] == [], output[-4000:]
    assert "CPU peak for MFU: " in output and not (dump / "comm_traces").exists()
    return logged


def test_same_seed_same_losses(reference, tmp_path):
    """--debug.seed + --debug.deterministic: a second run logs identical losses."""
    _train(tmp_path, STEPS)
    assert _logged(tmp_path) == reference


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


def _attempts(logged: list[tuple[int, float]]) -> list[list[tuple[int, float]]]:
    """losses.jsonl split where the step number goes back (a restart replays steps)."""
    attempts = [[]]
    for entry in logged:
        if attempts[-1] and entry[0] <= attempts[-1][-1][0]:
            attempts.append([])
        attempts[-1].append(entry)
    return attempts


@pytest.mark.parametrize(
    "point, fault_step", [("step", 5), ("save", 6)], ids=["after-step-5", "saving-step-6"]
)
def test_sigkill_one_rank_restart_resumes_exactly(reference, tmp_path, point, fault_step):
    """Rank 1 SIGKILLs itself in the first attempt, after step 5 or while the step-6
    checkpoint is being written (its shards on disk, DCP's .metadata not yet); torchrun
    (--max-restarts 1 via run_train.sh) restarts both ranks, which resume from step-3 (the
    interrupted step-6 folder is skipped) and log the uninterrupted run's losses."""
    env = {k: v for k, v in ENV.items() if k not in ("NGPU", "WORLD_SIZE", "CONFIG_FILE")}
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)  # run_train.sh's own setting
    env.update(
        NGPU="2",
        MAX_RESTARTS="1",
        BOOST_TITAN_FAULT_STEP=str(fault_step),
        BOOST_TITAN_FAULT_RANK="1",
        BOOST_TITAN_FAULT_POINT=point,
    )
    result = subprocess.run(
        [
            "./run_train.sh",
            "--job.dump_folder",
            str(tmp_path),
            "--training.steps",
            str(STEPS),
            *COMMON,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "shared TCPStore" not in output  # run_train.sh gives each attempt a fresh store
    folder = tmp_path / "checkpoint"
    skipped = f"skipping incomplete checkpoint {folder / 'step-6'}: no DCP .metadata"
    assert (skipped in output) == (point == "save"), output[-4000:]
    restart = "torchrun restart 1 of 1 after a worker failure; newest complete checkpoint: "
    assert f"{restart}{folder / 'step-3'}" in output, output[-4000:]
    assert f"Loading the checkpoint from {folder / 'step-3'}." in output
    assert f"Summary: ran {STEPS - 3} steps (4-{STEPS})" in output
    first, resumed = _attempts(_logged(tmp_path))
    assert len(first) >= fault_step - 1 and first == reference[: len(first)]
    assert resumed == reference[3:]
