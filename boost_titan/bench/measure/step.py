"""`bench step`: a few real training steps, measured for host overhead.

    python -m boost_titan.bench step --nproc N [--steps S] [--warmup W] [--json PATH|-] \\
        --job.config_file X.toml [--section.key value ...]

The job is validated first (`config.preflight`, as `check`: one `error:` line, before any worker
starts), then trained for W + S + 1 steps by `bench.measure.step_worker` under torchrun,
into a temporary folder with checkpointing, validation and TensorBoard off. The S steps
after the warm-up are timed (median, min, max); the last step is profiled. Reported:
tokens/s, step time, the time each step waits for data (in `next()` on the data iterator)
and the loader's tokens/s per rank, host time per micro-batch, launches per micro-batch and per step
(CUDA: kernel launches; CPU: dispatched ops), weight casts per step against the number of
parameter tensors, and on CUDA the step's kernels, the GPU-busy fraction and the kernels
that took the most time (`bench.measure.step_trace` says how each is counted).

`bench data` runs the same measurement (by default on train_configs/debug.toml, on the
processes its degrees imply) and reports the data side only, with whether the steps wait
for data under `DATA_WAIT_LIMIT` of their time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from boost_titan.config.errors import ConfigError
from boost_titan.job.launch import torchrun_command, worker_env

WORKER = "boost_titan.bench.measure.step_worker"
TRACE_ENV = "BOOST_TITAN_STEP_TRACE"
"""Where the worker keeps the profiled step's Chrome trace (`--trace`)."""
DATA_WAIT_LIMIT = 0.01
"""Share of the step time a run may spend waiting for data before `bench data` flags it."""
DEBUG_JOB = ("--job.config_file", "train_configs/debug.toml")
"""`bench data`'s job when none is given."""
FORCED = (
    "--checkpoint.no_enable",
    "--validation.no_enable",
    "--metrics.no_enable_tensorboard",
    "--metrics.disable_color_printing",
)
"""Trainer flags every measured run gets: nothing but training steps."""


def add_args(parser: argparse.ArgumentParser, nproc: int | None = 1) -> None:
    """`bench step`'s options; `nproc` None: the count the job's degrees imply."""
    parser.usage = (
        "python -m boost_titan.bench step [--nproc N] [--steps S] [--warmup W] "
        "[--json PATH|-] --job.config_file TOML [--section.key VALUE ...]"
    )
    parser.epilog = (
        "Every other argument goes to the trainer as `python -m boost_titan.train` takes "
        "it: --job.config_file and any --section.key VALUE override."
    )
    default = f"default {nproc}" if nproc else "default: the count the job's degrees imply"
    parser.add_argument("--nproc", type=int, default=nproc, help=f"processes ({default})")
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
    from boost_titan.job.preflight import NothingToTrain, check

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
    rows += data_rows(report)
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


def data_rows(report: dict) -> list[tuple[str, str]]:
    """The data side of a report: each step's wait and the loader's rate on one rank."""
    if "data_wait_ms" not in report:
        return []
    rate = report["loader_tokens_per_s_per_rank"]
    loader = f"{rate:,.0f}" if rate is not None else "unmeasured (no wait)"
    return [
        (
            "data wait / step",
            f"{report['data_wait_ms']:.2f} ms median (max {report['data_wait_ms_max']:.2f}): "
            f"{report['data_wait_share']:.2%} of the step "
            f"(max {report['data_wait_share_max']:.2%})",
        ),
        (
            "loader tokens/s",
            f"{loader} per rank ({report['tokens_per_rank_step']:,} tokens per rank and step "
            "over its time in next())",
        ),
    ]


def format_data_report(report: dict) -> str:
    """`bench data`'s lines: the job, the step, the data side and the verdict."""
    share = report["data_wait_share"]
    under = share < DATA_WAIT_LIMIT
    verdict = (
        f"{'under' if under else 'OVER'} {DATA_WAIT_LIMIT:.0%} of the step time waiting for "
        f"data ({share:.2%}, median of {report['timed_steps']} steps)"
    )
    rows = [
        ("job", report["job"]),
        ("device", f"{report['device']}, {report['world_size']} process(es)"),
        ("step ms", f"{report['step_ms']:.1f} ({report['tokens_per_step']:,} tokens)"),
        *data_rows(report),
        ("verdict", verdict),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def add_data_args(parser: argparse.ArgumentParser) -> None:
    """`bench step`'s options; the job defaults to debug.toml on its own process count."""
    add_args(parser, nproc=None)
    parser.usage = parser.usage.replace("bench step", "bench data").replace(
        "--job.config_file TOML", "[--job.config_file TOML]"
    )


def run_data(ns: argparse.Namespace, trainer_args: list[str]) -> int:
    """`bench data`: the debug run (or the job given), its waits for data."""
    from boost_titan.config.cli import parse_job_config
    from boost_titan.config.world import resolve_world

    if not any(a.split("=")[0] in ("--job.config_file", "--job.config-file") for a in trainer_args):
        trainer_args = [*DEBUG_JOB, *trainer_args]
    if ns.nproc is None:
        ns.nproc, _ = resolve_world(parse_job_config(trainer_args), None)
    report = measure(ns, trainer_args)
    if "data_wait_ms" not in report:
        raise ConfigError("the trainer reported no data waits (an earlier checkout?)")
    return _emit(ns, report, format_data_report)


def run(ns: argparse.Namespace, trainer_args: list[str]) -> int:
    return _emit(ns, measure(ns, trainer_args), format_report)


def _emit(ns: argparse.Namespace, report: dict, text: Callable[[dict], str]) -> int:
    """`--json -`: the report as JSON only; `--json PATH`: written there too; else `text`."""
    if ns.json == "-":
        print(json.dumps(report, indent=1))
        return 0
    if ns.json:
        Path(ns.json).write_text(json.dumps(report, indent=1))
    print(text(report))
    return 0


__all__ = [
    "add_args",
    "add_data_args",
    "format_data_report",
    "format_report",
    "measure",
    "run",
    "run_data",
]
