"""`bench step`'s and `bench data`'s measurement: a few real training steps of a job.

    python -m boost_titan.bench step --nproc N [--steps S] [--warmup W] [--json PATH|-] \\
        --job.config_file X.toml [--section.key value ...]

The job is parsed once and validated (`job.preflight.check_job`, as `check`: one `error:`
line, before any worker starts), then trained for W + S + 1 steps by
`bench.measure.step_worker` under torchrun, into a temporary folder with checkpointing,
validation and TensorBoard off. The S steps after the warm-up are timed (median, min, max);
the last step is profiled. Reported: tokens/s, step time, the time each step waits for data
(in `next()` on the data iterator) and the loader's tokens/s per rank, host time per
micro-batch, launches per micro-batch and per step (CUDA: kernel launches; CPU: dispatched
ops), weight casts per step against the number of parameter tensors, and on CUDA the step's
kernels, the GPU-busy fraction and the kernels that took the most time
(`bench.measure.step_trace` says how each is counted).

`bench data` runs the same measurement (by default on train_configs/debug.toml, on the
processes its degrees imply) and reports the data side only (`bench.commands.step` and
`bench.commands.data` print the reports).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from boost_titan.config.errors import ConfigError
from boost_titan.job.launch import torchrun_command, worker_env

WORKER = "boost_titan.bench.measure.step_worker"
TRACE_ENV = "BOOST_TITAN_STEP_TRACE"
"""Where the worker keeps the profiled step's Chrome trace (`--trace`)."""
FORCED = (
    "--checkpoint.no_enable",
    "--validation.no_enable",
    "--metrics.no_enable_tensorboard",
    "--metrics.disable_color_printing",
)
"""Trainer flags every measured run gets: nothing but training steps."""


@dataclass(frozen=True)
class StepRun:
    """How `measure` runs a job: `nproc` processes (None: the fewest its degrees allow),
    `warmup` untimed then `steps` timed steps, the profiled step's Chrome trace kept at
    `trace` (None: dropped), at most `timeout` seconds."""

    nproc: int | None
    steps: int
    warmup: int
    trace: str | None
    timeout: float


def names_job(trainer_args: list[str]) -> bool:
    """The trainer arguments name a job's TOML (`--job.config_file`)."""
    return any(a.split("=")[0] in ("--job.config_file", "--job.config-file") for a in trainer_args)


def _validate(run: StepRun, trainer_args: list[str]) -> tuple[str, int]:
    """The `check` summary of the job as measured (one parse) and its process count, or
    ConfigError."""
    from boost_titan.config.cli import parse_job_config
    from boost_titan.config.world import resolve_world
    from boost_titan.job.preflight import NothingToTrain, check_job

    if (run.nproc is not None and run.nproc < 1) or run.steps < 1 or run.warmup < 1:
        raise ConfigError("--nproc, --steps and --warmup must be >= 1")
    if not names_job(trainer_args):
        raise ConfigError("bench step needs a job: pass --job.config_file TOML [overrides]")
    try:
        job = parse_job_config(trainer_args)
        nproc, _ = resolve_world(job, run.nproc)
        return check_job(job, nproc), nproc
    except NothingToTrain as e:  # cannot happen in a fresh dump folder; said plainly anyway
        raise ConfigError(str(e)) from None


def measure(run: StepRun, trainer_args: list[str]) -> dict:
    """Run the steps; the worker's report (`step_worker`) plus the job's summary."""
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        total = run.warmup + run.steps + 1
        args = [
            *trainer_args,
            "--job.dump_folder",
            str(Path(tmp) / "out"),
            "--training.steps",
            str(total),
            "--metrics.log_freq",
            str(total),
            *FORCED,
        ]
        summary, nproc = _validate(run, args)
        report_path = Path(tmp) / "report.json"
        env = worker_env(
            BOOST_TITAN_STEP_REPORT=str(report_path),
            BOOST_TITAN_STEP_WARMUP=str(run.warmup),
            TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE="1",
            **({TRACE_ENV: str(Path(run.trace).resolve())} if run.trace else {}),
        )
        command = torchrun_command(nproc, WORKER, args)
        try:
            result = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=run.timeout
            )
        except subprocess.TimeoutExpired:
            raise ConfigError(
                f"the measured run took over {run.timeout:.0f} s; raise --timeout"
            ) from None
        if result.returncode or not report_path.exists():
            lines = (result.stdout + result.stderr).strip().splitlines()
            errors = [line for line in lines if "error" in line.lower()] or lines or ["no output"]
            raise ConfigError(f"the measured run failed (exit {result.returncode}): {errors[-1]}")
        report = json.loads(report_path.read_text())
    return {"job": summary.removeprefix("config ok: "), **report}
