"""`python -m boost_titan.bench SUBCOMMAND ...`: the benchmark command line.

Subcommands live in SUBCOMMANDS (name -> Subcommand(help, add_args, run)); a new one adds
an entry. `add_layout_args` / `sweep_from_args` give every subcommand the same model and
parallelism options. Only the chosen subcommand's options are built, and the harnesses of
`measure` (`trace`, `cpu`, `compile`) import torch only when chosen, so `--help` and the
analytic `model` start at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import NamedTuple

from boost_titan.boost_llama.strategies import STRATEGIES
from boost_titan.config import AC_MODES, ARCHS, OVERLAP_CHUNKS, RMSNORM_MODES
from boost_titan.config.cli import OneLineParser
from boost_titan.config.errors import ConfigError
from boost_titan.perf import measured, paper, precision_table, predict, records
from boost_titan.perf.gpus import GPUS
from boost_titan.perf.job import job_plan, process_count
from boost_titan.perf.layout import DTYPE_ALIASES, DTYPE_BYTES, FLOAT8_CASTS
from boost_titan.perf.paper import PAPER_GPU
from boost_titan.perf.plots import write_plot, write_validation_plot
from boost_titan.perf.records import format_breakdown, format_memory_kernels, format_records


class Subcommand(NamedTuple):
    help: str
    add_args: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _csv(text: str) -> list[str]:
    return [item for item in text.split(",") if item]


def _int_csv(text: str) -> list[int]:
    try:
        return [int(item) for item in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _dtype(text: str) -> str:
    """bf16 / fp32, or TorchTitan's bfloat16 / float32."""
    name = DTYPE_ALIASES.get(text, text)
    if name not in DTYPE_BYTES:
        spellings = [*DTYPE_BYTES, *DTYPE_ALIASES]
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(spellings)}")
    return name


def add_layout_args(parser: argparse.ArgumentParser) -> None:
    """Model, parallelism and batch options shared by the subcommands."""
    parser.add_argument("--flavor", type=_csv, default=["7B"], help="flavor or comma list (sweep)")
    parser.add_argument(
        "--arch", default="cola", choices=ARCHS, help="low-rank arch; megatron always runs fullrank"
    )
    parser.add_argument(
        "--strategy",
        type=_csv,
        default=list(STRATEGIES),
        help="comma list of megatron, vanilla, btp",
    )
    parser.add_argument(
        "--tp", type=_int_csv, default=[4], help="tensor-parallel degree or comma list (sweep)"
    )
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages (across nodes)")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch")
    parser.add_argument(
        "--microbatches", type=int, default=4, help="micro-batches per step (accumulation / 1F1B)"
    )
    parser.add_argument(
        "--dtype",
        default="bf16",
        type=_dtype,
        help="bf16 or fp32 (TorchTitan's bfloat16 / float32 also work)",
    )
    parser.add_argument("--ac", default="none", choices=AC_MODES, help="activation checkpointing")
    parser.add_argument("--rmsnorm", default="online", choices=RMSNORM_MODES, help="btp's RMSNorm")
    parser.add_argument(
        "--group-linears",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="group the q/k/v and gate/up down-projections",
    )
    parser.add_argument(
        "--overlap-chunks",
        type=int,
        default=1,
        choices=OVERLAP_CHUNKS,
        help="[boost] overlap_chunks: forward all-reduces in that many overlapped blocks",
    )
    parser.add_argument(
        "--gpu",
        type=_csv,
        default=["a100", "h100"],
        help=f"comma list of {', '.join(GPUS)}; speedups use the first",
    )


def sweep_from_args(ns: argparse.Namespace) -> dict:
    """Keyword arguments of `predict.sweep` from the parsed options."""
    return dict(
        flavors=ns.flavor,
        arch=ns.arch,
        strategies=ns.strategy,
        tps=ns.tp,
        gpus=ns.gpu,
        pp=ns.pp,
        seq_len=ns.seq_len,
        micro_batch=ns.micro_batch,
        microbatches=ns.microbatches,
        dtype=ns.dtype,
        ac=ns.ac,
        rmsnorm=ns.rmsnorm,
        group_linears=ns.group_linears,
        overlap_chunks=ns.overlap_chunks,
    )


def _emit_json(payload: list[dict], target: str | None) -> None:
    if target == "-":
        print(json.dumps(payload, indent=1))
    elif target:
        with open(target, "w") as f:
            json.dump(payload, f, indent=1)


# ---- model -----------------------------------------------------------------------------
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
)
"""`model` options a `--config` job sets itself."""


def _add_model_args(parser: argparse.ArgumentParser) -> None:
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
        type=_csv,
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
    parser.add_argument(
        "--json", metavar="PATH|-", help="write the records as a JSON list ('-': stdout only)"
    )
    parser.add_argument(
        "--plot", metavar="PATH.png", help="write the two-panel figure of this sweep"
    )


def _config_records(ns: argparse.Namespace) -> list:
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


def _run_model(ns: argparse.Namespace) -> int:
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
        )
    if ns.json != "-":
        print(format_records(records))
        if ns.breakdown:
            print("\nPredicted step split (seconds, share of the step):")
            print(format_breakdown(records))
            print("\nWhere the memory-bound time goes (the blocks' kernels, forward + backward):")
            print(format_memory_kernels(records))
    _emit_json([r.to_json() for r in records], ns.json)
    if ns.plot:
        write_plot(records, ns.plot)
    return 0


# ---- precision -------------------------------------------------------------------------
def _add_precision_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=_csv,
        metavar="TOML,...",
        help="instead: each training job's layout, precision and predicted step",
    )


def _run_precision(ns: argparse.Namespace) -> int:
    if ns.config:
        print(precision_table.format_jobs(ns.config))
    else:
        print(precision_table.format_precision_rows(precision_table.precision_rows()))
    return 0


# ---- validate --------------------------------------------------------------------------
def _add_validate_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpu",
        default=PAPER_GPU,
        choices=tuple(GPUS),
        help=f"GPU profile (default {PAPER_GPU}: the paper's 4-GPU A100 nodes)",
    )
    parser.add_argument("--ac", default="none", choices=AC_MODES)
    parser.add_argument(
        "--json",
        metavar="PATH|-",
        help="write every row as a JSON list, each tagged with its table",
    )


def _run_validate(ns: argparse.Namespace) -> int:
    v = paper.validation(ns.gpu, ns.ac)
    if ns.json != "-":
        print(f"Constants of GPU profile {ns.gpu} (sources: boost_titan/perf/gpus.py)")
        print(records.format_constants(v.constants))
        print(
            f"\nSeconds per iteration, paper vs model (CoLA, seq 4096, {ns.gpu}; "
            f"model within +-{paper.TOLERANCE:.0%} of both published speedups: "
            f"{v.within} of {len(v.rows)} rows)"
        )
        print(records.format_validation(v.rows, ns.gpu))
        for (flavor, ratio), reason in paper.KNOWN_GAPS.items():
            print(f"known gap, {flavor} {ratio}: {reason}")
        print("\nGEMM ablation: one low-rank pair's forward GEMMs, 7B, batch 4 x 4096, TP4")
        print(records.format_gemm_ablation(v.gemm))
        print(
            "\nCommunication ablation: one layer's forward TP collectives, 7B, batch 4 x 4096, TP4"
        )
        print(records.format_comm_ablation(v.comm))
        print("\nThe product's switches: BTP's predicted step, default vs flipped")
        print(records.format_switches(v.switches))
        print(
            "\nThe host term: 1B on one H100, measured with commit 18fc3d3 (casts every "
            "micro-batch) vs predicted;\n'this code' is the model's prediction for the "
            f"product now ({measured.HOST_FIT.name} {measured.HOST_FIT.micro_batch}x"
            f"{measured.HOST_FIT.microbatches} fits host_launch_s = "
            f"{measured.fit_host_launch() * 1e6:.1f} us)"
        )
        print(measured.format_host_rows(v.hosts))
    _emit_json(v.to_json(), ns.json)
    return 0


# ---- plot ------------------------------------------------------------------------------
def _add_plot_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", default=PAPER_GPU, choices=tuple(GPUS))
    parser.add_argument("--out", default="docs/perf_model.png")


def _run_plot(ns: argparse.Namespace) -> int:
    write_validation_plot(
        paper.validation_rows(ns.gpu),
        paper.gemm_ablation(ns.gpu),
        paper.comm_ablation(ns.gpu),
        paper.plot_sweep(ns.gpu),
        ns.out,
    )
    print(f"wrote {ns.out}")
    return 0


# ---- trace -----------------------------------------------------------------------------
def _add_trace_args(parser: argparse.ArgumentParser) -> None:
    from boost_titan.bench.measure import trace

    add_layout_args(parser)
    trace.add_args(parser)


def _run_trace(ns: argparse.Namespace) -> int:
    from boost_titan.bench.measure import trace

    return trace.run(ns, sweep_from_args(ns))


# ---- memory ----------------------------------------------------------------------------
def _add_memory_args(parser: argparse.ArgumentParser) -> None:
    from boost_titan.bench.measure import memtrack

    add_layout_args(parser)
    memtrack.add_args(parser)


def _run_memory(ns: argparse.Namespace) -> int:
    from boost_titan.bench.measure import memtrack

    return memtrack.run(ns, sweep_from_args(ns))


# ---- cpu -------------------------------------------------------------------------------
def _add_cpu_args(parser: argparse.ArgumentParser) -> None:
    from boost_titan.bench.measure import cpu

    cpu.add_args(parser)


def _run_cpu(ns: argparse.Namespace) -> int:
    from boost_titan.bench.measure import cpu

    return cpu.run(ns)


# ---- compile ---------------------------------------------------------------------------
def _add_compile_args(parser: argparse.ArgumentParser) -> None:
    from boost_titan.bench.measure import compiled

    compiled.add_args(parser)


def _run_compile(ns: argparse.Namespace) -> int:
    from boost_titan.bench.measure import compiled

    return compiled.run(ns)


# ---- step ------------------------------------------------------------------------------
def _add_step_args(parser: argparse.ArgumentParser) -> None:
    from boost_titan.bench.measure import step

    step.add_args(parser)


def _run_step(ns: argparse.Namespace) -> int:
    from boost_titan.bench.measure import step

    return step.run(ns, ns.extra)


# ---- data ------------------------------------------------------------------------------
def _add_data_args(parser: argparse.ArgumentParser) -> None:
    from boost_titan.bench.measure import step

    step.add_data_args(parser)


def _run_data(ns: argparse.Namespace) -> int:
    from boost_titan.bench.measure import step

    return step.run_data(ns, ns.extra)


SUBCOMMANDS: dict[str, Subcommand] = {
    "model": Subcommand("analytic comm/FLOPs/memory/step-time model", _add_model_args, _run_model),
    "precision": Subcommand(
        "predicted step of the paper's configurations in fp32, bf16 and float8",
        _add_precision_args,
        _run_precision,
    ),
    "validate": Subcommand(
        "model vs the BOOST authors' published iteration times and ablations",
        _add_validate_args,
        _run_validate,
    ),
    "plot": Subcommand(
        "regenerate docs/perf_model.png: model vs published measurements", _add_plot_args, _run_plot
    ),
    "trace": Subcommand(
        "measure one block under the real TP plan (fake process group, CPU)",
        _add_trace_args,
        _run_trace,
    ),
    "memory": Subcommand(
        "peak memory per GPU and stage (model), or --check: vs torch's MemTracker",
        _add_memory_args,
        _run_memory,
    ),
    "cpu": Subcommand(
        "time training steps of each TP strategy on CPU (gloo, 1 thread per rank)",
        _add_cpu_args,
        _run_cpu,
    ),
    "compile": Subcommand(
        "torch.compile vs eager per strategy x AC mode x TP: graph breaks, "
        "errors, collectives, compile time (CPU, gloo)",
        _add_compile_args,
        _run_compile,
    ),
    "step": Subcommand(
        "a few real trainer steps of a job (--job.config_file TOML [overrides]): tokens/s, "
        "host time and launches per micro-batch, weight casts (CPU or CUDA)",
        _add_step_args,
        _run_step,
    ),
    "data": Subcommand(
        "the debug run (or a job's) timed for data: each step's wait in next() on the data "
        "iterator, and the loader's tokens/s per rank",
        _add_data_args,
        _run_data,
    ),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = OneLineParser(prog="python -m boost_titan.bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    for name, command in SUBCOMMANDS.items():
        subparser = sub.add_parser(name, help=command.help)
        if name == chosen:
            command.add_args(subparser)
    ns, extra = parser.parse_known_args(argv)
    if extra and not getattr(ns, "trainer_args", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    ns.extra = extra
    try:
        return SUBCOMMANDS[ns.command].run(ns)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
