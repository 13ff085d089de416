"""TorchTitan settings its workers assert on, checked before launch in one line each.

TorchTitan 0.2.2 validates these only where it uses them, inside the workers: an
`AssertionError`, `ValueError` or `ZeroDivisionError` traceback from every rank (torchrun's
`ChildFailedError` report), or, for a logger whose package is missing, an ERROR line and a
run without it. `check_titan_settings` refuses each with one `ConfigError` line; `check` and
the trainer call it. Torch-free.
"""

from __future__ import annotations

import importlib.util

from boost_titan.config.errors import ConfigError


def _profiling(job) -> None:
    """`tools.profiling`: `torch.profiler.schedule(wait=profile_freq - (warmup + active),
    warmup, active)` asserts wait >= 0, warmup >= 0 and active > 0; the memory snapshot
    dumps every `profile_freq` steps (`step % profile_freq`)."""
    p = job.profiling
    if p.enable_profiling:
        if p.profiler_active < 1 or p.profiler_warmup < 0:
            raise ConfigError(
                f"profiling.profiler_active {p.profiler_active} must be >= 1 and "
                f"profiling.profiler_warmup {p.profiler_warmup} >= 0 (steps traced per "
                "cycle and steps before them)"
            )
        if p.profile_freq < p.profiler_warmup + p.profiler_active:
            raise ConfigError(
                f"profiling.profile_freq {p.profile_freq} is shorter than one trace cycle: "
                f"profiler_warmup {p.profiler_warmup} + profiler_active {p.profiler_active}; "
                f"raise --profiling.profile_freq to {p.profiler_warmup + p.profiler_active} "
                "or more, or lower --profiling.profiler_warmup"
            )
    if p.enable_memory_snapshot and p.profile_freq < 1:
        raise ConfigError(
            f"profiling.profile_freq {p.profile_freq} must be >= 1 with "
            "profiling.enable_memory_snapshot (a snapshot every profile_freq steps)"
        )


def _metrics(job) -> None:
    """`components.metrics`: `step % log_freq` every step; the W&B logger imports wandb
    and, when that fails, logs an ERROR and trains on without it."""
    m = job.metrics
    if m.log_freq < 1:
        raise ConfigError(f"metrics.log_freq {m.log_freq} must be >= 1 (log every N steps)")
    if m.enable_wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigError(
            "metrics.enable_wandb needs the wandb package, which is not installed: pip "
            "install wandb (then wandb login), or drop --metrics.enable_wandb"
        )


def _checkpoint(job) -> None:
    """`components.checkpoint`: `step % interval` at every step; keep_latest_k 1 is a
    ValueError (the newest may still be in the middle of its save)."""
    c = job.checkpoint
    if not c.enable:
        return
    if c.interval < 1:
        raise ConfigError(f"checkpoint.interval {c.interval} must be >= 1 (save every N steps)")
    if c.keep_latest_k == 1:
        raise ConfigError(
            "checkpoint.keep_latest_k 1 is refused by TorchTitan (the newest checkpoint may "
            "still be saving); keep 2 or more, or 0 to keep all"
        )


def _training(job) -> None:
    """`tools.utils.GarbageCollection` asserts gc_freq > 0."""
    if job.training.gc_freq < 1:
        raise ConfigError(
            f"training.gc_freq {job.training.gc_freq} must be >= 1 (collect garbage every N steps)"
        )


CHECKS = (_profiling, _metrics, _checkpoint, _training)
"""Every check, one per TorchTitan component that asserts on its section."""


def check_titan_settings(job) -> None:
    """ConfigError (one line) for the first TorchTitan setting in `job` its workers would
    assert on (see CHECKS)."""
    for check in CHECKS:
        check(job)
