"""`bench memory`: the model's peak memory per GPU and pipeline stage, split by part, or
`--check`: the model against torch's MemTracker on the real model and plan
(`bench.measure.memtrack`)."""

from __future__ import annotations

import argparse

from boost_titan.bench.options import add_layout_args, sweep_from_args
from boost_titan.perf import layout
from boost_titan.perf.layout import TrainingLayout

HELP = "peak memory per GPU and stage (model), or --check: vs torch's MemTracker"
SPLIT_FIELDS = ("seq_len", "micro_batch", "microbatches", "dtype", "ac", "rmsnorm")
"""The layout options the memory split reads (besides strategy, tp and pp)."""


def add_args(parser: argparse.ArgumentParser) -> None:
    add_layout_args(parser)
    parser.add_argument(
        "--check",
        action="store_true",
        help="instead: the model vs torch's MemTracker on the real model and plan (1B TP1, "
        "3B TP2, 7B TP4, 13B TP4 x PP2 both ends on fake tensors; debug on real ones), "
        "every AC mode; exit 1 beyond +-10%%",
    )
    parser.add_argument("--quick", action="store_true", help="with --check: one small case")


def run(ns: argparse.Namespace) -> int:
    """The split of each flavor x tp x strategy, or --check (exit 1 beyond its tolerance)."""
    from boost_titan.bench.measure import memtrack

    if ns.check:
        rows = memtrack.check_rows(memtrack.QUICK_CASES if ns.quick else memtrack.CHECK_CASES)
        print(memtrack.format_check(rows))
        return 1 if any(abs(r.error) > memtrack.TOLERANCE for r in rows) else 0
    sweep = sweep_from_args(ns)
    for flavor in sweep["flavors"]:
        for tp in sweep["tps"]:
            for strategy in sweep["strategies"]:
                args = layout.trained_shape(flavor, sweep["arch"], strategy)
                plan = TrainingLayout(
                    strategy, tp=tp, pp=sweep["pp"], **{k: sweep[k] for k in SPLIT_FIELDS}
                )
                layout.check(args, plan)
                print(f"{flavor} {args.arch} {strategy} tp {tp} pp {plan.pp}, ac {plan.ac}:")
                print(memtrack.format_split(args, plan))
    return 0
