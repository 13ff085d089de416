"""The non-finite guard: a NaN/inf loss or gradient norm never reaches the optimizer.

The trainer checks the step's global loss and gradient norm (known alike on every rank) after
clipping and before `optimizer.step()`. By default the run stops with one line naming the
step, the value and the rank it came from, and saves nothing (the newest checkpoint is the
last good one). With `[boost] skip_nonfinite_steps = N` up to N such steps are skipped
instead (no optimizer step; the LR schedule moves on so that it stays aligned with the step
numbers), each one logged and written to `losses.jsonl`; the next one stops the run. The
count is per invocation: a rerun starts from zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class TrainingDiverged(RuntimeError):
    """The loss or gradient norm became NaN or infinite; the message says where and what was
    kept."""


@dataclass(frozen=True)
class RankView:
    """What one rank saw in a non-finite step: its share of the loss (None: it holds none)
    and whether its gradient shards are all finite."""

    loss: float | None
    grads_finite: bool


def nonfinite(loss: float, grad_norm: float | None) -> str | None:
    """`loss nan` / `grad norm inf` when the step must not update the weights, else None."""
    if not math.isfinite(loss):
        return f"loss became {loss}"
    if grad_norm is not None and not math.isfinite(grad_norm):
        return f"grad norm became {grad_norm}"
    return None


def blame(views: list[RankView]) -> str:
    """`rank 1` (its loss is non-finite), `rank 0 has non-finite gradients`, or
    `every rank's share is finite` when no rank can be named."""
    for rank, view in enumerate(views):
        if view.loss is not None and not math.isfinite(view.loss):
            return f"rank {rank}"
    for rank, view in enumerate(views):
        if not view.grads_finite:
            return f"rank {rank} has non-finite gradients"
    return "every rank's share is finite"


class NonFiniteGuard:
    """Counts skipped steps against `[boost] skip_nonfinite_steps`."""

    def __init__(self, max_skips: int):
        self.max_skips = max_skips
        self.skipped = 0

    def skip(self) -> bool:
        """Whether this non-finite step is skipped (counted); False: stop the run."""
        if self.skipped >= self.max_skips:
            return False
        self.skipped += 1
        return True

    def skip_line(self, step: int, what: str, where: str) -> str:
        return (
            f"skipped step {step}: {what} ({where}); no optimizer step "
            f"({self.skipped} of {self.max_skips} allowed skips used)"
        )

    def stop_message(self, step: int, what: str, where: str, kept: str | None) -> str:
        """The run's last line: what, where, that nothing was saved and how to go on."""
        resume = f"rerun to resume from {kept}" if kept else "rerun (no checkpoint was saved yet)"
        if self.max_skips:
            steps = f"{self.skipped} step{'s' * (self.skipped != 1)}"
            limit = f" ({steps} skipped before, the [boost] skip_nonfinite_steps limit)"
            skip = ""
        else:
            limit, skip = "", " (or skip such steps: --boost.skip_nonfinite_steps N)"
        return (
            f"{what} at step {step} ({where}){limit}; stopped before the optimizer step, "
            f"nothing saved; lower --optimizer.lr or raise --lr_scheduler.warmup_steps{skip}, "
            f"then {resume}"
        )
