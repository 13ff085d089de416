"""`bench validate`: the model against the BOOST authors' published iteration times and
ablations, the product's switches and the measured host term."""

from __future__ import annotations

import argparse

from boost_titan.bench.report import add_json_option, write_json
from boost_titan.config import AC_MODES
from boost_titan.perf import measured, paper, records
from boost_titan.perf.gpus import GPUS
from boost_titan.perf.paper import PAPER_GPU

HELP = "model vs the BOOST authors' published iteration times and ablations"


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpu",
        default=PAPER_GPU,
        choices=tuple(GPUS),
        help=f"GPU profile (default {PAPER_GPU}: the paper's 4-GPU A100 nodes)",
    )
    parser.add_argument("--ac", default="none", choices=AC_MODES)
    add_json_option(parser, help="write every row as a JSON list, each tagged with its table")


def run(ns: argparse.Namespace) -> int:
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
    write_json(v.to_json(), ns.json)
    return 0
