"""`bench data`: `bench step`'s measurement of the debug run (or of the job given), reported
for data only: each step's wait in next() on the data iterator, the loader's tokens/s per
rank, and whether the steps waited under `DATA_WAIT_LIMIT` of their time."""

from __future__ import annotations

import argparse

from boost_titan.bench.commands.step import add_args as add_step_args
from boost_titan.bench.commands.step import data_rows, step_run
from boost_titan.bench.report import write_json
from boost_titan.config.errors import ConfigError

HELP = (
    "the debug run (or a job's) timed for data: each step's wait in next() on the data "
    "iterator, and the loader's tokens/s per rank"
)
DATA_WAIT_LIMIT = 0.01
"""Share of the step time a run may spend waiting for data before `bench data` flags it."""
DEBUG_JOB = ("--job.config_file", "train_configs/debug.toml")
"""`bench data`'s job when none is given."""


def add_args(parser: argparse.ArgumentParser) -> None:
    """`bench step`'s options; the job defaults to debug.toml on its own process count."""
    add_step_args(parser, nproc=None)
    parser.usage = parser.usage.replace("bench step", "bench data").replace(
        "--job.config_file TOML", "[--job.config_file TOML]"
    )


def run(ns: argparse.Namespace) -> int:
    """The debug run (or the job given), its waits for data."""
    from boost_titan.bench.measure import step

    trainer_args = ns.trainer_args
    if not step.names_job(trainer_args):
        trainer_args = [*DEBUG_JOB, *trainer_args]
    report = step.measure(step_run(ns, ns.nproc), trainer_args)
    if "data_wait_ms" not in report:
        raise ConfigError("the trainer reported no data waits (an earlier checkout?)")
    write_json(report, ns.json)
    if ns.json != "-":
        print(format_data_report(report))
    return 0


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
