"""Measured activation memory and recompute FLOPs of one layer per AC mode, on CPU
(`bench.measure.activations.measure_layer`: fake tensors, a fake TP group).

    python -m boost_titan.activation_memory --flavor 1B --seq-len 2048 [--tp 4] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from boost_titan.bench.measure.activations import (
    LOW_RANK_STRATEGIES,
    LayerMeasurement,
    check_layer_args,
    measure_layer,
)
from boost_titan.bench.measure.fake_group import TORCH_DTYPES
from boost_titan.boost_llama import FLAVORS, flavor_args
from boost_titan.boost_llama.archs import ARCHITECTURES
from boost_titan.config import AC_MODES
from boost_titan.config.errors import ConfigError


def _rows(results: list[LayerMeasurement]) -> list[dict[str, Any]]:
    by_mode = {r.mode: r for r in results}
    plain = by_mode.get("none")
    rows = []
    for r in results:
        recompute = r.backward_flops - plain.backward_flops if plain else None
        rows.append(
            {
                **dataclasses.asdict(r),
                "bytes_per_token": r.bytes_per_token,
                "saved_vs_none": r.saved_bytes / plain.saved_bytes if plain else None,
                "recompute_flops": recompute,
            }
        )
    return rows


def _table(rows: list[dict[str, Any]], title: str) -> str:
    header = (
        f"{'mode':10s} {'MiB/layer':>10s} {'B/token':>9s} {'vs none':>8s} "
        f"{'fwd GFLOP':>10s} {'recompute GFLOP':>16s}  bwd collectives"
    )
    lines = [title, header]
    for r in rows:
        share = r["saved_vs_none"]
        ratio = f"{100 * share:7.1f}%" if share is not None else f"{'-':>8s}"
        recompute = r["recompute_flops"]
        recompute = f"{recompute / 1e9:16.1f}" if recompute is not None else f"{'-':>16s}"
        comm = ", ".join(f"{k} x{v}" for k, v in sorted(r["backward_collectives"].items())) or "-"
        lines.append(
            f"{r['mode']:10s} {r['saved_bytes'] / 2**20:10.1f} {r['bytes_per_token']:9.0f} "
            f"{ratio} {r['forward_flops'] / 1e9:10.1f} {recompute}  {comm}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m boost_titan.activation_memory",
        description="Saved activation bytes and recompute FLOPs of one layer per AC mode "
        "(fake tensors; per TP rank).",
    )
    parser.add_argument("--flavor", default="1B", choices=list(FLAVORS))
    low_rank = [name for name, a in ARCHITECTURES.items() if a.low_rank]
    parser.add_argument("--arch", default="cola", choices=low_rank)
    parser.add_argument("--strategy", default="btp", choices=LOW_RANK_STRATEGIES)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1, help="micro-batch size")
    parser.add_argument("--dtype", default="bf16", choices=list(TORCH_DTYPES))
    parser.add_argument("--modes", nargs="+", default=list(AC_MODES), choices=AC_MODES)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ns = parser.parse_args(argv)
    args = flavor_args(ns.flavor, arch=ns.arch)
    try:
        check_layer_args(args, tp=ns.tp, seq_len=ns.seq_len, strategy=ns.strategy)
        results = [
            measure_layer(
                args,
                mode,
                seq_len=ns.seq_len,
                batch=ns.batch,
                tp=ns.tp,
                strategy=ns.strategy,
                dtype=TORCH_DTYPES[ns.dtype],
            )
            for mode in ns.modes
        ]
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = _rows(results)
    setup = {
        "flavor": ns.flavor,
        "arch": ns.arch,
        "strategy": ns.strategy,
        "tp": ns.tp,
        "seq_len": ns.seq_len,
        "batch": ns.batch,
        "dtype": ns.dtype,
    }
    if ns.json:
        print(json.dumps({**setup, "layers": rows}, indent=2))
    else:
        title = ", ".join(f"{k} {v}" for k, v in setup.items()) + " (one layer, per TP rank)"
        print(_table(rows, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
