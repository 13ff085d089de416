"""`bench plot`: regenerate docs/perf_model.png, the model against the published
measurements."""

from __future__ import annotations

import argparse

from boost_titan.perf import paper
from boost_titan.perf.gpus import GPUS
from boost_titan.perf.paper import PAPER_GPU
from boost_titan.perf.plots import write_validation_plot

HELP = "regenerate docs/perf_model.png: model vs published measurements"


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", default=PAPER_GPU, choices=tuple(GPUS))
    parser.add_argument("--out", default="docs/perf_model.png")


def run(ns: argparse.Namespace) -> int:
    write_validation_plot(
        paper.validation_rows(ns.gpu),
        paper.gemm_ablation(ns.gpu),
        paper.comm_ablation(ns.gpu),
        paper.plot_sweep(ns.gpu),
        ns.out,
    )
    print(f"wrote {ns.out}")
    return 0
