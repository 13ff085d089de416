"""`bench cpu`: wall-clock training steps of each TP strategy on this CPU
(`bench.measure.cpu`, gloo ranks), with their compiled, overlapped and profiled variants."""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from typing import TYPE_CHECKING

from boost_titan.bench.report import add_json_option, write_json

if TYPE_CHECKING:
    from boost_titan.bench.measure.cpu import CpuConfig, CpuRecord

HELP = "time training steps of each TP strategy on CPU (gloo, 1 thread per rank)"
FLAGS = {"n_heads": "--heads", "n_layers": "--layers"}
"""Command-line flags that are not the config field's name."""
SIZES = (
    "dim",
    "rank",
    "n_heads",
    "ffn_dim",
    "n_layers",
    "vocab_size",
    "seq_len",
    "micro_batch",
    "tp",
    "repeats",
    "warmup",
)
"""The integer fields of `CpuConfig` set by an option each, in `--help`'s order."""


def add_args(parser: argparse.ArgumentParser) -> None:
    from boost_titan.bench.measure.cpu import CpuConfig
    from boost_titan.boost_llama.strategies import STRATEGIES

    defaults = CpuConfig()
    for name in SIZES:
        flag = FLAGS.get(name, "--" + name.replace("_", "-"))
        parser.add_argument(flag, dest=name, type=int, default=getattr(defaults, name))
    parser.add_argument(
        "--arch",
        default=defaults.arch,
        choices=("cola", "svd"),
        help="low-rank arch of btp/vanilla; megatron trains the fullrank twin",
    )
    parser.add_argument(
        "--strategy",
        default=",".join(STRATEGIES),
        help="comma list of btp, vanilla, megatron (interleaved)",
    )
    parser.add_argument(
        "--profile",
        dest="profile_steps",
        type=int,
        default=0,
        metavar="N",
        help="after timing, profile N more steps per strategy and split rank "
        "0's step into gemm / attention / comm / other",
    )
    parser.add_argument(
        "--overlap-chunks",
        dest="overlap_chunks",
        type=int,
        default=1,
        metavar="K",
        help="also time each strategy with its all-reduces in K overlapped blocks",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also time each strategy with its blocks under torch.compile (Inductor)",
    )
    add_json_option(parser)


def run(ns: argparse.Namespace) -> int:
    from boost_titan.bench.measure.cpu import CpuConfig, measure

    fields = {k: v for k, v in vars(ns).items() if k in CpuConfig.__dataclass_fields__}
    cfg = replace(CpuConfig(), **fields)
    records = measure(cfg, tuple(s for s in ns.strategy.split(",") if s))
    write_json([r.to_json() for r in records], ns.json)
    if ns.json != "-":
        print(format_records(cfg, records))
    return 0


def format_records(cfg: CpuConfig, records: list[CpuRecord]) -> str:
    """The step times per strategy, then the compiled, overlapped and profiled tables that
    `cfg` asked for."""
    from boost_titan.bench.measure.cpu import PROFILE_KINDS

    lines = [
        f"{'strategy':>8} {'arch':>8} {'median ms':>9} {'min':>7} {'max':>7} "
        f"{'x btp':>6} {'paired':>6}"
    ]
    for r in records:
        ratios = [
            f"{x:.2f}" if x is not None else "-" for x in (r.ratio_to_btp, r.ratio_to_btp_paired)
        ]
        lines.append(
            f"{r.strategy:>8} {r.arch:>8} {r.step_ms_median:>9.1f} {r.step_ms_min:>7.1f} "
            f"{r.step_ms_max:>7.1f} {ratios[0]:>6} {ratios[1]:>6}"
        )
    if cfg.compile:
        lines.append(
            "\ntorch.compile (Inductor, fullgraph, per block), interleaved with the eager steps:"
        )
        lines.append(
            f"{'strategy':>8} {'compile s':>9} {'median ms':>9} {'min':>7} {'max':>7} "
            f"{'x eager':>7}"
        )
        for r in records:
            ms = r.compiled_step_ms
            lines.append(
                f"{r.strategy:>8} {r.compile_s:>9.1f} {statistics.median(ms):>9.1f} "
                f"{min(ms):>7.1f} {max(ms):>7.1f} {r.compiled_to_eager_paired:>7.2f}"
            )
    if cfg.overlap_chunks > 1:
        k = cfg.overlap_chunks
        lines.append(
            f"\nall-reduces in 1 vs {k} overlapped blocks ([boost] overlap_chunks), interleaved:"
        )
        lines.append(
            f"{'strategy':>8} {'1: ms':>8} {f'{k}: ms':>8} {f'x {k}/1':>7} {'1: comm ms':>10} "
            f"{f'{k}: comm ms':>10} {'comm x':>7}"
        )
        for r in records:
            comm = [p["comm"] if p else None for p in (r.profile_ms, r.overlap_profile_ms)]
            cells = [f"{c:>10.1f}" if c is not None else f"{'-':>10}" for c in comm]
            ratio = f"{comm[1] / comm[0]:>7.2f}" if None not in comm else f"{'-':>7}"
            lines.append(
                f"{r.strategy:>8} {r.step_ms_median:>8.1f} "
                f"{statistics.median(r.overlap_step_ms):>8.1f} "
                f"{r.overlap_to_one_paired:>7.2f} {cells[0]} {cells[1]} {ratio}"
            )
    profiled = [r for r in records if r.profile_ms]
    if profiled:
        kinds = ("step", *PROFILE_KINDS, "other")
        lines.append(
            f"\nrank 0 under torch.profiler, ms per step ({cfg.profile_steps} steps each):"
        )
        lines.append(f"{'strategy':>8} " + " ".join(f"{k:>9}" for k in kinds))
        for r in profiled:
            lines.append(f"{r.strategy:>8} " + " ".join(f"{r.profile_ms[k]:>9.1f}" for k in kinds))
    return "\n".join(lines)
