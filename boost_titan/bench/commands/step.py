"""`bench step`: a few real trainer steps of a job (`bench.measure.step`), reported as
tokens/s, host time and launches per micro-batch, weight casts and, on CUDA, kernels."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from boost_titan.bench.report import add_json_option, write_json

if TYPE_CHECKING:
    from boost_titan.bench.measure.step import StepRun

HELP = (
    "a few real trainer steps of a job (--job.config_file TOML [overrides]): tokens/s, "
    "host time and launches per micro-batch, weight casts (CPU or CUDA)"
)


def add_args(parser: argparse.ArgumentParser, nproc: int | None = 1) -> None:
    """`bench step`'s options; `nproc` None: the count the job's degrees imply. The
    arguments left over go to the trainer (`ns.trainer_args`)."""
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
    add_json_option(parser, help="also write the report as JSON ('-': stdout only)")
    parser.add_argument(
        "--trace", metavar="PATH.json", help="keep the profiled step's Chrome trace (Perfetto)"
    )
    parser.add_argument(
        "--timeout", type=float, default=3600, help="seconds the run may take (default 3600)"
    )
    parser.set_defaults(trainer_args=[])


def run(ns: argparse.Namespace) -> int:
    from boost_titan.bench.measure import step

    report = step.measure(step_run(ns, ns.nproc), ns.trainer_args)
    write_json(report, ns.json)
    if ns.json != "-":
        print(format_report(report))
    return 0


def step_run(ns: argparse.Namespace, nproc: int | None) -> StepRun:
    """The measured run the options ask for, on `nproc` processes."""
    from boost_titan.bench.measure import step

    return step.StepRun(nproc, ns.steps, ns.warmup, ns.trace, ns.timeout)


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
