"""The CPU cost of LORO's exact step on one pair (`optim.loro_exact.exact_step`), for the
docs' figures and the perf model's pricing of the step amortised over `exact_every`."""

from __future__ import annotations

import time

import torch

from boost_titan.optim.loro_exact import exact_step


def exact_step_seconds(
    d_out: int, d_in: int, rank: int, *, repeats: int = 3, dtype: torch.dtype = torch.float32
) -> float:
    """The fastest of `repeats` timed exact steps on one random pair (B: d_out x rank,
    A: rank x d_in) in this process, after one untimed step (threads as torch has them)."""
    g = torch.Generator().manual_seed(0)
    shapes = [(d_out, rank), (rank, d_in), (d_out, rank), (rank, d_in)]
    b, a, d_b, d_a = (torch.randn(s, generator=g, dtype=dtype) for s in shapes)
    exact_step(b, a, d_b, d_a, 1e-3)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        exact_step(b, a, d_b, d_a, 1e-3)
        best = min(best, time.perf_counter() - start)
    return best
