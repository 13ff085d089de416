"""Time the exact (fp64) global gradient norm against TorchTitan's (fp32 foreach) on CPU.

    .venv/bin/python scripts/time_grad_norm.py [--repeats 7]

Random fp32 gradients of the debug model's size (3.3M parameters) and of 50M, split into
60 tensors; one thread; median (min, max) milliseconds per norm.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from boost_titan.runtime.grad_norm import total_norm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    ns = parser.parse_args()
    torch.set_num_threads(1)
    runs = {
        "torchtitan (fp32 foreach)": lambda g: torch.nn.utils.get_total_norm(g, foreach=True),
        "exact (fp64)": total_norm,
    }
    for n_params, label in ((3_300_000, "3.3M"), (50_000_000, "50M")):
        grads = [torch.randn(n_params // 60) for _ in range(60)]
        for name, norm in runs.items():
            times = []
            for _ in range(ns.repeats):
                start = time.perf_counter()
                norm(grads)
                times.append((time.perf_counter() - start) * 1e3)
            print(
                f"{label} gradients, {name}: {statistics.median(times):.1f} ms "
                f"(min {min(times):.1f}, max {max(times):.1f})"
            )


if __name__ == "__main__":
    main()
