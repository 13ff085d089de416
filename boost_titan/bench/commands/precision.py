"""`bench precision`: the paper's configurations predicted in fp32, bf16 and float8, or
each training job's layout, precision and predicted step (`--config`)."""

from __future__ import annotations

import argparse

from boost_titan.bench.options import csv
from boost_titan.perf import precision_table

HELP = "predicted step of the paper's configurations in fp32, bf16 and float8"


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=csv,
        metavar="TOML,...",
        help="instead: each training job's layout, precision and predicted step",
    )


def run(ns: argparse.Namespace) -> int:
    if ns.config:
        print(precision_table.format_jobs(ns.config))
    else:
        print(precision_table.format_precision_rows(precision_table.precision_rows()))
    return 0
