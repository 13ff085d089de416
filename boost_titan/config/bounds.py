"""Sane bounds of a job's numbers, in one table: a value outside them (a NaN learning rate,
2^70 steps, a batch of 10^8 sequences) is a typo or an attack, not a job. `check` and the
trainer refuse it in one line before anything is built. Torch-free.
"""

from __future__ import annotations

import math

from boost_titan.config.errors import ConfigError

STEPS = 10**12
"""More steps than any run takes (a trillion)."""
SEQUENCES = 1 << 20
"""More sequences per micro-batch than any accelerator holds."""
TOKENS = 1 << 24
"""A longer sequence than any model here trains on (16,777,216 tokens)."""

BOUNDS: dict[str, tuple[float, float]] = {
    "training.steps": (0, STEPS),
    "training.local_batch_size": (1, SEQUENCES),
    "training.global_batch_size": (-1, SEQUENCES * 1024),
    "training.seq_len": (1, TOKENS),
    "training.max_norm": (0.0, 1e38),  # a huge norm turns clipping off; float32 holds it
    "optimizer.lr": (0.0, 1e6),
    "optimizer.eps": (0.0, 1.0),
    "optimizer.beta1": (0.0, 1.0),
    "optimizer.beta2": (0.0, 1.0),
    "optimizer.weight_decay": (0.0, 100.0),
    "lr_scheduler.warmup_steps": (0, STEPS),
    "lr_scheduler.min_lr_factor": (0.0, 1.0),
    "validation.local_batch_size": (1, SEQUENCES),
    "validation.seq_len": (1, TOKENS),
    "validation.steps": (-1, STEPS),
    "validation.freq": (1, STEPS),
    "boost.max_seq_len": (0, TOKENS),
    "boost.gradient_accumulation_steps": (0, SEQUENCES),
    "boost.skip_nonfinite_steps": (0, STEPS),
    "boost.data_seed": (0, (1 << 63) - 1),
    "boost.loro_exact_every": (1, STEPS),
    "boost.loro_rewarm_steps": (0, STEPS),
    "boost.loro_approx_scale": (0.0, 1e6),
}
"""Option -> (lowest, highest) value a job may give it, both included. The checks with
their own messages run first (`world.check_batch`: batch sizes >= 1; `check_run_limits`;
[boost] rank in `boost_llama.spec`): these catch what they let through (NaN, infinity,
numbers no run can reach)."""


def _value(job, name: str) -> float:
    section, key = name.split(".")
    return getattr(getattr(job, section), key)


def check_bounds(job) -> None:
    """ConfigError (one line) for the first option of BOUNDS whose value is not a finite
    number within its bounds."""
    for name, (low, high) in BOUNDS.items():
        value = _value(job, name)
        finite = isinstance(value, int) or math.isfinite(value)
        if not (finite and low <= value <= high):
            shown = str(value) if len(str(value)) <= 24 else f"{float(value):.3g}"
            raise ConfigError(
                f"{name} {shown} is outside the sane range {_number(low)}..{_number(high)}; "
                f"give --{name} a value in it"
            )


def _number(bound: float) -> str:
    return f"{bound:,}" if isinstance(bound, int) else f"{bound:g}"
