"""LORO's dense exact step on this CPU (or a GPU) against the perf model (`perf.loro`).

    python scripts/bench_loro_exact.py [--sizes 1376x512x128,2048x768x256] [--repeats 5]
    python scripts/bench_loro_exact.py --device cuda --sizes 11008x4096x1024   (gpu_check.sh)

For each pair size d_out x d_in x r, on one CPU thread: the measured seconds of
`boost_titan.optim.loro_exact.exact_step` (the fastest of `--repeats`, the least disturbed
by other work on the machine), and two predictions from `perf.loro.pair_flops`: every flop
at this CPU's fp32 GEMM rate (measured on the pair's own GEMM shape), and each class of
flops (GEMM, QR, SVD) at the rate measured for a lone kernel of that class at this size (a
d_out x r QR, the 2r x 2r SVD). The first says how far the step is from GEMM speed, the
second whether the flop count accounts for the step. On a
GPU also the perf model's seconds for the pair on the H100 profile (`perf.loro.dense_seconds`,
FP32 peak 67 TFLOP/s, as an H200's), the figure the 7B prediction rests on.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from boost_titan.optim.loro_exact import exact_step
from boost_titan.perf.gpus import gpu_profile
from boost_titan.perf.loro import dense_seconds, pair_flops

SIZES = "688x256x64,1376x512x128,2048x768x256,5472x2048x512"
"""debug's MLP pair and 60M, 130M and 1B-sized ones (d_out x d_in x r)."""


def _timed(fns: dict[str, Callable[[], object]], repeats: int, device: torch.device) -> dict:
    """The fastest of `repeats` seconds of each of `fns`, run in turn in each round (so
    that other work on the machine slows them alike), after one warm-up round."""

    def once(fn: Callable[[], object]) -> float:
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    for fn in fns.values():
        once(fn)  # warm-up
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            best[name] = min(best[name], once(fn))
    return best


def measure(d_out: int, d_in: int, r: int, repeats: int, device: torch.device) -> dict[str, float]:
    """Seconds of the exact step and FLOP/s of each kernel class at this size."""
    g = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device)

    b, d_b, a, d_a = randn(d_out, r), randn(d_out, r), randn(r, d_in), randn(r, d_in)
    tall, core, small = randn(d_out, 2 * r), randn(2 * r, 2 * r), randn(2 * r, r)
    seconds = _timed(
        {
            "step": lambda: exact_step(b, a, d_b, d_a, 0.01),
            "gemm": lambda: tall @ small,
            "qr": lambda: torch.linalg.qr(b),
            "svd": lambda: torch.linalg.svd(core),
        },
        repeats,
        device,
    )
    flops = {"gemm": 4 * d_out * r * r, "qr": 4 * d_out * r**2 - 4 * r**3 / 3}
    flops["svd"] = 21 * (2 * r) ** 3
    return {"step": seconds["step"]} | {k: f / seconds[k] for k, f in flops.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=SIZES, help=f"d_out x d_in x r, comma list ({SIZES})")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cpu (one thread) or cuda")
    ns = parser.parse_args()
    device = torch.device(ns.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    model = " model h100 s" if device.type == "cuda" else ""
    print(
        "d_out x d_in x r   GFLOP  measured s  at GEMM rate s  by class s  GEMM / QR / SVD "
        f"GFLOP/s{model}"
    )
    for size in ns.sizes.split(","):
        d_out, d_in, r = (int(x) for x in size.split("x"))
        flops = pair_flops(d_out, d_in, r)
        m = measure(d_out, d_in, r, ns.repeats, device)
        at_gemm = sum(flops.values()) / m["gemm"]
        by_class = sum(flops[k] / m[k] for k in flops)
        rates = " / ".join(f"{m[k] / 1e9:.1f}" for k in ("gemm", "qr", "svd"))
        if model:
            rates += f"  {dense_seconds(flops, gpu_profile('h100').peak_flops['fp32']):.3f}"
        print(
            f"{size:>16}  {sum(flops.values()) / 1e9:6.2f}  {m['step']:10.3f}  "
            f"{at_gemm:14.3f}  {by_class:10.3f}  {rates}",
            flush=True,
        )


if __name__ == "__main__":
    main()
