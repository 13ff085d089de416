"""Runs that are interrupted, crash or are repeated reproduce an uninterrupted run bit for bit.

2 ranks, BTP (debug.toml), fp32 on CPU, the default corpus. Losses are compared exactly
through rank 0's `losses.jsonl` (full float precision, unlike the log line).

Stops and resumes, one chain of six launches in one dump folder
(`test_stops_chain_into_the_uninterrupted_run`): SIGUSR1, SIGTERM twice, the time budget
(under torchrun's restarts), a NaN loss, a full disk, then the end with a SIGTERM during
the last step; together they log exactly the `reference` run's losses.

Crash recovery: `MAX_RESTARTS=1 ./run_train.sh` with one rank SIGKILLing itself in the
first attempt (`BOOST_TITAN_FAULT_*`, see `boost_titan.runtime.restarts`); torchrun restarts both
ranks, which resume from the newest complete checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest

from boost_titan.checkpoint.files import (
    check_readable,
    is_complete_checkpoint,
    latest_checkpoint,
)
from boost_titan.job.launch import train_command
from boost_titan.runtime.run_log import read_log
from boost_titan.runtime.stopping import STOPPED, finished_line, stopped_line
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


def _command(dump: Path, steps: int, launcher_args: tuple[str, ...] = ()) -> list[str]:
    args = ["--training.steps", str(steps), *COMMON]
    config = ROOT / "train_configs/debug.toml"
    return train_command(2, config, dump, args, launcher_args=launcher_args)


ENV = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _train(
    dump: Path,
    steps: int,
    *extra: str,
    env=None,
    status: int = 0,
    max_file_bytes: int = 0,
    launcher_args: tuple[str, ...] = (),
) -> str:
    """Bare torchrun (`launcher_args`: its own) to `steps`, which must exit with `status`;
    `max_file_bytes`: the launch's file-size limit (`ulimit -f`), none if 0."""
    command = _command(dump, steps, launcher_args) + list(extra)
    limit = (resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))
    result = subprocess.run(
        command,
        cwd=ROOT,
        env=env or ENV,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=(lambda: resource.setrlimit(*limit)) if max_file_bytes else None,
    )
    output = result.stdout + result.stderr
    assert result.returncode == status, output[-4000:]
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


def _run_train_env(**extra: str) -> dict[str, str]:
    """ENV for `./run_train.sh` on 2 processes (its own TCPStore setting)."""
    env = {k: v for k, v in ENV.items() if k not in ("NGPU", "WORLD_SIZE", "CONFIG_FILE")}
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    return env | {"NGPU": "2"} | extra


def _signalled(
    dump: Path, sig: signal.Signals, after: int, times: int, *extra: str, env=None, status=STOPPED
) -> str:
    """`./run_train.sh` to STEPS in its own process group, which gets `sig` `times` times
    (0.3 s apart) as a scheduler sends it, once `losses.jsonl` shows step `after`; exits
    `status`. (`times` 0: the run signals itself, `env`'s BOOST_TITAN_FAULT_POINT=sigterm.)"""
    command = ["./run_train.sh", "--job.dump_folder", str(dump), "--training.steps", str(STEPS)]
    job = subprocess.Popen(
        [*command, *COMMON, *extra],
        cwd=ROOT,
        env=env or _run_train_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    log, deadline = dump / "losses.jsonl", time.monotonic() + 600
    while times and job.poll() is None and time.monotonic() < deadline:
        rows = log.read_text().splitlines() if log.exists() else []
        if rows and json.loads(rows[-1])["step"] >= after:
            break
        time.sleep(0.05)
    for _ in range(times):
        os.killpg(job.pid, sig)
        time.sleep(0.3)
    output = job.communicate(timeout=600)[0]
    assert job.returncode == status, output[-4000:]
    return output


def _stopped_at(output: str, reason: str, dump: Path) -> int:
    """The step of the run's stop line (its last line), which names the saved checkpoint."""
    last = output.splitlines()[-1]
    step = int(re.fullmatch(rf"stopped by {reason} at step (\d+); .*", last).group(1))
    assert last == stopped_line(reason, step, str(dump / "checkpoint" / f"step-{step}"))
    assert latest_checkpoint(str(dump / "checkpoint")).endswith(f"step-{step}")
    assert "Traceback" not in output, output[-4000:]
    return step


def test_stops_chain_into_the_uninterrupted_run(reference, tmp_path):
    """Six launches in one dump folder log exactly the reference run's losses (fp32,
    deterministic; the same seed gives the same losses, and every resume is exact):

    1. `run_train.sh` gets SIGUSR1 twice after a random step k (warmup is 6 steps): it
       finishes the step in progress, saves it and exits STOPPED with the stop line (the
       second signal breaks neither the save nor torchrun's shutdown);
    2. a half-written newer `step-9` (shards without DCP's .metadata) is planted; the
       rerun, with async checkpoints, resumes from the stop's step and gets SIGTERM twice;
    3. bare (stock) torchrun with `--max-restarts 1` and a time budget that is spent
       before the first step: one step, a checkpoint, the workers exit STOPPED; torchrun
       restarts them, they end at once (the stop line in torchrun's error file) and torchrun
       exits 1, its report naming the stop;
    4. bare torchrun with a NaN loss on rank 0 in its first two steps and
       `--boost.skip_nonfinite_steps 1`: the first is skipped (logged, a `losses.jsonl`
       row), at the second the workers exit 3 with one line naming the step, the value and
       the rank; nothing saved, the newest checkpoint is still 3's;
    5. bare torchrun under a 1 MiB file-size limit (`ulimit -f`), saving every step with
       async checkpoints: its first step's save fails in the background, which surfaces at
       the second step's save; one line names the first step's folder, and 3's checkpoint
       stays newest and readable;
    6. the rest, to STEPS (step 5's two steps are run again), through `run_train.sh`,
       whose process group gets SIGTERM during the last step (rank 1 sends it: fault point
       `sigterm`): the last checkpoint, one line saying training is complete, exit 0."""
    folder = tmp_path / "checkpoint"
    k = random.randint(1, 3)
    output = _signalled(tmp_path, signal.SIGUSR1, k, 2)
    first = _stopped_at(output, "SIGUSR1", tmp_path)
    assert first > k, f"signalled after step {k}"
    partial = folder / "step-9"
    partial.mkdir()
    (partial / "__0_0.distcp").write_bytes(b"\0" * 64)
    output = _signalled(tmp_path, signal.SIGTERM, first + 1, 2, "--checkpoint.async_mode", "async")
    assert f"Loading the checkpoint from {folder / f'step-{first}'}." in output
    second = _stopped_at(output, "SIGTERM", tmp_path)
    assert second < 9 and not is_complete_checkpoint(str(partial))
    restart = ("--max-restarts", "1")
    fresh_store = ENV | {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # what restarts need
    output = _train(
        tmp_path,
        STEPS,
        "--boost.time_budget_minutes",
        "0.001",
        env=fresh_store,
        status=1,
        launcher_args=restart,
    )
    budget = f"stopped by time budget (0.001 min) at step {second + 1}; checkpoint saved"
    assert budget in output and output.count("Summary: ran ") == 1, output[-4000:]
    assert f"Summary: ran 1 steps ({second + 1}-{second + 1})" in output
    # stock torchrun restarted the stopped group once; it ended at once with STOPPED, and
    # torchrun's report names the stop as the root cause
    assert f"torchrun restarted a stopped run; not training: {budget}" in output
    assert re.search(rf"exitcode\s*: {STOPPED} .*\n.*\n\s*traceback : {re.escape(budget)}", output)
    # second or second + 1 is no multiple of the interval: one stop had to save by itself
    assert latest_checkpoint(str(folder)).endswith(f"step-{second + 1}")
    fault = {"BOOST_TITAN_FAULT_STEP": f"{second + 2},{second + 3}", "BOOST_TITAN_FAULT_RANK": "0"}
    nan_env = ENV | fault | {"BOOST_TITAN_FAULT_POINT": "nan"}  # rank 1's TP replica: not summed
    skip_one = ("--boost.skip_nonfinite_steps", "1", "--checkpoint.interval", "100")
    output = _train(tmp_path, STEPS, *skip_one, env=nan_env, status=1)  # torchrun's; workers' 3
    skipped = f"skipped step {second + 2}: loss became nan (rank 0); no optimizer step (1 of 1"
    assert skipped in output, output[-4000:]
    rows = [json.loads(row) for row in (tmp_path / "losses.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == second + 2 and rows[-1]["skipped_steps"] == 1
    errors = [line.split("]:", 1)[-1] for line in output.splitlines() if "error: " in line]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: loss became nan at step {second + 3} (rank 0) (1 step skipped before, the "
        "[boost] skip_nonfinite_steps limit); stopped before the optimizer step, nothing saved"
    ), output[-4000:]
    kept = latest_checkpoint(str(folder))
    assert kept.endswith(f"step-{second + 1}") and errors[0].endswith(f"resume from {kept}")
    for unsaved in (folder / f"step-{second + 2}", folder / f"step-{second + 3}"):
        # nothing written, except the half-written step-9 planted in link 2
        assert not unsaved.exists() or (
            unsaved == partial and not is_complete_checkpoint(str(unsaved))
        )
    every_step_async = ("--checkpoint.interval", "1", "--checkpoint.async_mode", "async")
    output = _train(tmp_path, STEPS, *every_step_async, status=1, max_file_bytes=2**20)
    step = folder / f"step-{second + 2}"  # raised at step second + 3's save
    errors = [line.split("]:", 1)[-1] for line in output.splitlines() if "error: " in line]
    assert set(errors) == {
        f"error: saving the checkpoint {step} failed on rank 0 (a write was cut short: disk "
        f"full or a file-size limit); the newest complete checkpoint, {kept}, stays loadable: "
        f"free space in (or make writable) {folder}, then rerun"
    }, output[-4000:]
    # the workers print no traceback (torchrun's own ChildFailedError report is unprefixed)
    assert not [
        line for line in output.splitlines() if line.startswith("[") and "Traceback" in line
    ]
    assert latest_checkpoint(str(folder)) == kept and not is_complete_checkpoint(str(step))
    check_readable(kept, "the kept checkpoint")
    fault = {"BOOST_TITAN_FAULT_STEP": str(STEPS), "BOOST_TITAN_FAULT_RANK": "1"}
    last_step = _run_train_env(**fault, BOOST_TITAN_FAULT_POINT="sigterm")
    output = _signalled(tmp_path, signal.SIGTERM, STEPS, 0, env=last_step, status=0)
    assert f"Summary: ran {STEPS - second - 1} steps ({second + 2}-{STEPS})" in output
    saved = folder / f"step-{STEPS}"
    assert output.splitlines()[-1] == finished_line("SIGTERM", STEPS, str(saved))
    assert "Traceback" not in output and is_complete_checkpoint(str(saved)), output[-4000:]
    before_disk_full, after = _attempts(_logged(tmp_path))  # steps second + 2, 3 twice
    assert before_disk_full == reference[: second + 3] and after == reference[second + 1 :]


def _attempts(logged: list[tuple[int, float]]) -> list[list[tuple[int, float]]]:
    """losses.jsonl split where the step number goes back (a restart replays steps)."""
    attempts = [[]]
    for entry in logged:
        if attempts[-1] and entry[0] <= attempts[-1][-1][0]:
            attempts.append([])
        attempts[-1].append(entry)
    return attempts


def test_sigkill_during_an_async_save_restarts_and_resumes_exactly(reference, tmp_path):
    """Rank 1 SIGKILLs itself in the first attempt while the step-6 checkpoint is being
    written by an async save (`checkpoint.async_mode = "async"`: its shards on disk, DCP's
    .metadata not yet); torchrun (--max-restarts 1 via run_train.sh) restarts both ranks,
    which resume from step-3 (the interrupted step-6 folder is skipped) and log the
    uninterrupted run's losses. (A SIGKILL after step 5 with synchronous saves, the same
    restart without an interrupted save, runs in `scripts/restart_loop.sh`.)"""
    env = _run_train_env(
        MAX_RESTARTS="1",
        BOOST_TITAN_FAULT_STEP="6",
        BOOST_TITAN_FAULT_RANK="1",
        BOOST_TITAN_FAULT_POINT="save",
    )
    result = subprocess.run(
        [
            "./run_train.sh",
            "--job.dump_folder",
            str(tmp_path),
            "--training.steps",
            str(STEPS),
            *COMMON,
            "--checkpoint.async_mode",
            "async",
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
    assert skipped in output, output[-4000:]
    restart = "torchrun restart 1 of 1 after a worker failure; newest complete checkpoint: "
    assert f"{restart}{folder / 'step-3'}" in output, output[-4000:]
    assert f"Loading the checkpoint from {folder / 'step-3'}." in output
    assert f"Summary: ran {STEPS - 3} steps (4-{STEPS})" in output
    first, resumed = _attempts(_logged(tmp_path))
    assert len(first) >= 5 and first == reference[: len(first)]
    assert resumed == reference[3:]
