"""`bench step`: a few real training steps, measured for host overhead.

    python -m boost_titan.bench step --nproc N [--steps S] [--warmup W] [--json PATH|-] \\
        --job.config_file X.toml [--section.key value ...]

The job is validated first (`config.preflight`, as `check`: one `error:` line, before any worker
starts), then trained for W + S + 1 steps by `bench.measure.step_worker` under torchrun,
into a temporary folder with checkpointing, validation and TensorBoard off. The S steps
after the warm-up are timed (median, min, max); the last step is profiled. Reported:
tokens/s, step time, host time per micro-batch, launches per micro-batch and per step
(CUDA: kernel launches; CPU: dispatched ops), weight casts per step against the number of
parameter tensors, and on CUDA the step's kernels, the GPU-busy fraction and the kernels
that took the most time (`bench.measure.step_trace` says how each is counted).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from boost_titan.config.errors import ConfigError
from boost_titan.runtime.launch import torchrun_command, worker_env

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


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.usage = (
        "python -m boost_titan.bench step [--nproc N] [--steps S] [--warmup W] "
        "[--json PATH|-] --job.config_file TOML [--section.key VALUE ...]"
    )
    parser.epilog = (
        "Every other argument goes to the trainer as `python -m boost_titan.train` takes "
        "it: --job.config_file and any --section.key VALUE override."
    )
    parser.add_argument("--nproc", type=int, default=1, help="processes (default 1)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps (default 5)")
    parser.add_argument(
        "--warmup", type=int, default=2, help="untimed steps first (default 2; compiles)"
    )
    parser.add_argument(
        "--json", metavar="PATH|-", help="also write the report as JSON ('-': stdout only)"
    )
    parser.add_argument(
        "--trace", metavar="PATH.json", help="keep the profiled step's Chrome trace (Perfetto)"
    )
    parser.add_argument(
        "--timeout", type=float, default=3600, help="seconds the run may take (default 3600)"
    )
    parser.set_defaults(trainer_args=True)


def _validate(ns: argparse.Namespace, trainer_args: list[str]) -> str:
    """The `check` summary of the job as measured, or ConfigError."""
    from boost_titan.runtime.preflight import NothingToTrain, check

    if ns.nproc < 1 or ns.steps < 1 or ns.warmup < 1:
        raise ConfigError("--nproc, --steps and --warmup must be >= 1")
    if not any(a.split("=")[0] in ("--job.config_file", "--job.config-file") for a in trainer_args):
        raise ConfigError("bench step needs a job: pass --job.config_file TOML [overrides]")
    try:
        return check(["--nproc", str(ns.nproc), *trainer_args])
    except NothingToTrain as e:  # cannot happen in a fresh dump folder; said plainly anyway
        raise ConfigError(str(e)) from None


def measure(ns: argparse.Namespace, trainer_args: list[str]) -> dict:
    """Run the steps; the worker's report (`step_worker`) plus the job's summary."""
    with tempfile.TemporaryDirectory(prefix="bench-step-") as tmp:
        total = ns.warmup + ns.steps + 1
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
        summary = _validate(ns, args)
        report_path = Path(tmp) / "report.json"
        env = worker_env(
            BOOST_TITAN_STEP_REPORT=str(report_path),
            BOOST_TITAN_STEP_WARMUP=str(ns.warmup),
            TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE="1",
            **({TRACE_ENV: str(Path(ns.trace).resolve())} if ns.trace else {}),
        )
        command = torchrun_command(ns.nproc, WORKER, args)
        try:
            result = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=ns.timeout
            )
        except subprocess.TimeoutExpired:
            raise ConfigError(
                f"the measured run took over {ns.timeout:.0f} s; raise --timeout"
            ) from None
        if result.returncode or not report_path.exists():
            lines = (result.stdout + result.stderr).strip().splitlines()
            errors = [line for line in lines if "error" in line.lower()] or lines or ["no output"]
            raise ConfigError(f"the measured run failed (exit {result.returncode}): {errors[-1]}")
        report = json.loads(report_path.read_text())
    return {"job": summary.removeprefix("config ok: "), **report}


def format_report(report: dict) -> str:
    """The report as a few aligned lines."""
    cuda = report["kernels_per_step"] is not None
    unit = "kernel launches" if cuda else "dispatched ops"
    rows = [
        ("job", report["job"]),
        (
            "device",
            f"{report['device']}, {report['world_size']} process(es), {report['precision']}",
        ),
        (
            "step",
            f"{report['microbatches']} micro-batches, {report['tokens_per_step']} tokens, "
            f"compile {'on' if report['compile'] else 'off'}",
        ),
        ("tokens/s", f"{report['tokens_per_s']:,.0f}"),
        (
            "step ms",
            f"{report['step_ms']:.1f} (min {report['step_ms_min']:.1f}, max "
            f"{report['step_ms_max']:.1f}; {report['timed_steps']} steps)",
        ),
        (
            "host ms / micro-batch",
            f"{report['host_ms_per_microbatch']:.2f} (min "
            f"{report['host_ms_per_microbatch_min']:.2f}, max "
            f"{report['host_ms_per_microbatch_max']:.2f})",
        ),
        (
            "launches",
            f"{report['launches_per_microbatch']:,.0f} per micro-batch, "
            f"{report['launches_per_step']:,} per step ({unit})",
        ),
        (
            "weight casts / step",
            f"{report['casts_per_step']:,} ({report['param_tensors']:,} parameter tensors)",
        ),
    ]
    if cuda:
        rows.append(
            (
                "GPU",
                f"{report['kernels_per_step']:,} kernels, busy {report['gpu_busy']:.0%} of "
                f"the profiled step ({report['profiled_step_ms']:.1f} ms)",
            )
        )
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    title = "top kernels (total ms, count)" if cuda else "top ops (count)"
    lines.append(f"{title}:")
    for item in report["top"]:
        ms = f"{item['ms']:>9.3f} ms " if "ms" in item else ""
        lines.append(f"  {ms}{item['count']:>6}  {item['name'][:100]}")
    return "\n".join(lines)


def run(ns: argparse.Namespace, trainer_args: list[str]) -> int:
    report = measure(ns, trainer_args)
    if ns.json == "-":
        print(json.dumps(report, indent=1))
        return 0
    if ns.json:
        Path(ns.json).write_text(json.dumps(report, indent=1))
    print(format_report(report))
    return 0


__all__ = ["add_args", "format_report", "measure", "run"]
