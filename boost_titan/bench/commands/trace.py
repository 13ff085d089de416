"""`bench trace`: one block of each configuration measured under the real TP plan on a
fake process group (`bench.measure.trace`), optionally checked against the model."""

from __future__ import annotations

import argparse

from boost_titan.bench.options import add_layout_args, sweep_from_args
from boost_titan.bench.report import add_json_option, write_json

HELP = "measure one block under the real TP plan (fake process group, CPU)"


def add_args(parser: argparse.ArgumentParser) -> None:
    add_layout_args(parser)
    parser.add_argument(
        "--compare",
        action="store_true",
        help="check against the analytic model; exit 1 on any mismatch",
    )
    add_json_option(parser)


def run(ns: argparse.Namespace) -> int:
    """Exit 1 when a traced configuration disagrees with the model (`--compare`)."""
    from boost_titan.bench.measure import trace

    records = trace.trace_sweep(**sweep_from_args(ns), compare=ns.compare)
    if ns.json != "-":
        print(trace.format_traces(records))
    write_json([r.to_json() for r in records], ns.json)
    return 1 if any(r.model_mismatches for r in records) else 0
