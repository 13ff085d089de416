"""`bench compile`: torch.compile against eager for every strategy x AC mode x TP degree,
on a cold and a warm compile cache (`bench.measure.compiled`, gloo ranks)."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from boost_titan.bench.report import add_json_option, write_json
from boost_titan.boost_llama.strategies import STRATEGIES
from boost_titan.config import AC_MODES
from boost_titan.config.errors import ConfigError

HELP = (
    "torch.compile vs eager per strategy x AC mode x TP: graph breaks, "
    "errors, collectives, compile time (CPU, gloo)"
)


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--arch",
        default="cola",
        choices=("cola", "svd", "lax"),
        help="low-rank arch of btp/vanilla; megatron trains the fullrank twin",
    )
    parser.add_argument(
        "--strategy", default=",".join(STRATEGIES), help="comma list of " + ", ".join(STRATEGIES)
    )
    parser.add_argument(
        "--ac", default=",".join(AC_MODES), help="comma list of " + ", ".join(AC_MODES)
    )
    parser.add_argument("--tp", default="1,2,4", help="comma list of TP degrees")
    parser.add_argument(
        "--backend",
        default="inductor",
        choices=("inductor", "aot_eager"),
        help="inductor (TorchTitan's; cached, so the warm pass reads the cache) or "
        "aot_eager (tracing only, nothing cached)",
    )
    parser.add_argument(
        "--cache-dir",
        metavar="PATH",
        help="compile cache folder of both passes (default: a new temporary one)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed steps of each, interleaved")
    add_json_option(parser, help="also write the rows as JSON", metavar="PATH")


def run(ns: argparse.Namespace) -> int:
    """Exit 1 unless every cell passes `CompileRow.ok`."""
    from boost_titan.bench.measure.compiled import MatrixConfig, cells_of, format_rows, matrix

    try:
        tps = [int(t) for t in ns.tp.split(",") if t]
    except ValueError:
        raise ConfigError(f"--tp takes comma-separated integers, got {ns.tp!r}") from None
    if ns.repeats < 1:
        raise ConfigError("--repeats must be >= 1")
    cells = cells_of([s for s in ns.strategy.split(",") if s], [a for a in ns.ac.split(",") if a])
    cfg = MatrixConfig(arch=ns.arch, backend=ns.backend, repeats=ns.repeats)
    rows = matrix(cfg, tps, cells, ns.cache_dir)
    print(format_rows(rows))
    write_json([asdict(r) for r in rows], ns.json)
    ok = all(r.ok() for r in rows)
    warm = "; with Inductor the warm pass read the cache" if cfg.backend == "inductor" else ""
    print(
        f"\n{'every cell' if ok else 'NOT every cell'} compiles without a graph break, "
        f"equals eager within 1e-5 on a cold and a warm cache and issues eager's collectives "
        f"or fewer{warm}"
    )
    return 0 if ok else 1
