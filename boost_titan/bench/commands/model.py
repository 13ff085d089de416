"""`bench model`: the analytic comm/FLOPs/memory/step-time model of a sweep, or of a
training job's TOML (`--config`)."""

from __future__ import annotations

import argparse
import sys

from boost_titan.bench.options import add_layout_args, csv, sweep_from_args
from boost_titan.bench.report import add_json_option, write_json
from boost_titan.config.errors import ConfigError
from boost_titan.perf import predict
from boost_titan.perf.job_plan import job_plan, process_count
from boost_titan.perf.layout import FLOAT8_CASTS
from boost_titan.perf.plots import write_plot
from boost_titan.perf.records import (
    PerfRecord,
    format_breakdown,
    format_memory_kernels,
    format_records,
)

HELP = "analytic comm/FLOPs/memory/step-time model"
CONFIG_OPTIONS = (
    "flavor",
    "arch",
    "strategy",
    "tp",
    "pp",
    "cp",
    "seq_len",
    "micro_batch",
    "microbatches",
    "dtype",
    "ac",
    "rmsnorm",
    "group_linears",
    "overlap_chunks",
    "master_weights",
    "float8",
    "float8_filter",
    "float8_casts",
    "compile",
    "cuda_graphs",
    "loro_exact_every",
)
"""`model` options a `--config` job sets itself."""


def add_args(parser: argparse.ArgumentParser) -> None:
    add_layout_args(parser)
    parser.add_argument(
        "--cp", type=int, default=1, help="context-parallel degree (sequence split over ranks)"
    )
    parser.add_argument(
        "--master-weights",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="bf16 keeps fp32 master weights (off: training.dtype bfloat16)",
    )
    parser.add_argument(
        "--float8",
        metavar="RECIPE",
        help="run the selected GEMMs in float8 with this torchao recipe "
        "(tensorwise, rowwise, rowwise_with_gw_hp)",
    )
    parser.add_argument(
        "--float8-filter",
        type=csv,
        default=[],
        metavar="FQN,...",
        help="TorchTitan's filter_fqns (auto_filter_small_kn: torchao's size filter)",
    )
    parser.add_argument(
        "--float8-casts",
        choices=FLOAT8_CASTS,
        default="eager",
        help="float8 casts as torchao runs them eagerly, or fused by torch.compile",
    )
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="blocks under torch.compile ([compile] enable): fewer kernel launches",
    )
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="[boost] cuda_graphs: one graph launch per micro-batch",
    )
    parser.add_argument(
        "--loro-exact-every",
        type=int,
        default=0,
        metavar="K",
        help="price LORO (arch svd): its exact step every K steps, amortised (default 0: AdamW)",
    )
    parser.add_argument(
        "--config",
        metavar="TOML",
        help="price a training job's TOML as `boost_titan.train` runs it (sets "
        "every model option but --gpu)",
    )
    parser.add_argument(
        "--nproc",
        help="with --config: processes (default: $NGPU, else the fewest the degrees allow)",
    )
    parser.set_defaults(plan_defaults={name: parser.get_default(name) for name in CONFIG_OPTIONS})
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also split each predicted step into gemm / memory-bound / attention / "
        "optimizer / exposed communication / pipeline bubble",
    )
    add_json_option(parser)
    parser.add_argument(
        "--plot", metavar="PATH.png", help="write the two-panel figure of this sweep"
    )


def _config_records(ns: argparse.Namespace) -> list[PerfRecord]:
    """The record of the `--config` job (one-line notices on stderr)."""
    clash = [name for name, default in ns.plan_defaults.items() if getattr(ns, name) != default]
    if clash:
        flag = "--" + clash[0].replace("_", "-")
        raise ConfigError(f"{flag} is set by --config; edit the TOML instead")
    job = job_plan(ns.config, process_count(ns.nproc))
    for notice in job.notices:
        print(notice, file=sys.stderr)
    if ns.json != "-":
        print(job.summary)
    return [predict.evaluate(job.flavor, job.args, job.plan, ns.gpu, dp_shard=job.dp_shard)]


def run(ns: argparse.Namespace) -> int:
    if ns.config:
        records = _config_records(ns)
    elif ns.nproc is not None:
        raise ConfigError("--nproc needs --config TOML")
    else:
        records = predict.sweep(
            **sweep_from_args(ns),
            cp=ns.cp,
            master_weights=ns.master_weights,
            float8=ns.float8,
            float8_filter=tuple(ns.float8_filter),
            float8_casts=ns.float8_casts,
            compiled=ns.compile,
            cuda_graphs=ns.cuda_graphs,
            loro_exact_every=ns.loro_exact_every,
        )
    if ns.json != "-":
        print(format_records(records))
        if ns.breakdown:
            print("\nPredicted step split (seconds, share of the step):")
            print(format_breakdown(records))
            print("\nWhere the memory-bound time goes (the blocks' kernels, forward + backward):")
            print(format_memory_kernels(records))
    write_json([r.to_json() for r in records], ns.json)
    if ns.plot:
        write_plot(records, ns.plot)
    return 0
