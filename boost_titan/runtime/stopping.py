"""Stopping early without losing a step: SIGTERM, SIGUSR1 and a wall-clock budget.

Schedulers send SIGTERM before a kill (SLURM and Kubernetes: a grace period later, SIGKILL),
and `sbatch --signal=USR1@<seconds>` sends SIGUSR1 ahead of the time limit. `StopRequest`
turns either signal, and the end of `[boost] time_budget_minutes`, into a flag; the trainer
all-reduces the flags with each step's loss (no extra collective), so every rank finishes the
same step, saves one checkpoint of it and ends with `stopped_line` (exit 0 from the workers,
so torchrun does not restart them; `run_train.sh` then exits with `STOPPED`). Later signals
only set the flag again: they never interrupt the save. Torch-free: the launcher relay reads
`STOP_LINE` and `STOPPED`.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
"""Signals that stop training at the end of the current step with a checkpoint."""
STOPPED = 75
"""Exit status of `run_train.sh` (and the torchrun relay) after such a stop: EX_TEMPFAIL,
"rerun to continue"."""
STOP_LINE = re.compile(r"^stopped by .+ at step \d+; ")
"""The stop line `stopped_line` writes (the relay prints it last)."""
REASONS = ("SIGTERM", "SIGUSR1", "time budget")
"""The causes of a stop, in the order the flags are all-reduced (and reported)."""


class StopRequest:
    """This rank's wish to stop: a signal received, or the time budget spent."""

    def __init__(self, budget_minutes: float = 0.0, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.budget_minutes = budget_minutes
        self.deadline = clock() + 60 * budget_minutes if budget_minutes > 0 else None
        self.signal: str | None = None
        """The first stop signal this rank received (later ones change nothing)."""

    def install(self) -> None:
        """Catch STOP_SIGNALS in this (main) thread from now on."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, self.on_signal)

    def on_signal(self, signum: int, frame: object = None) -> None:
        self.signal = self.signal or signal.Signals(signum).name

    def flags(self) -> list[float]:
        """One 0/1 flag per REASONS entry (this rank's first signal, the budget), to be
        summed over ranks."""
        out_of_time = self.deadline is not None and self.clock() >= self.deadline
        return [float(self.signal == "SIGTERM"), float(self.signal == "SIGUSR1"), out_of_time]

    def reason(self, summed: list[float]) -> str | None:
        """The stop every rank agrees on from the flags summed over ranks (None: go on):
        the signal most ranks got first (SIGTERM on a tie), else the budget."""
        signals = dict(zip(REASONS[:2], summed[:2], strict=True))
        if any(signals.values()):
            return max(signals, key=lambda name: signals[name])
        return self.budget_text() if summed[2] > 0 else None

    def budget_text(self) -> str:
        return f"time budget ({self.budget_minutes:g} min)"


def stopped_line(reason: str, step: int, saved: str | None) -> str:
    """`stopped by SIGTERM at step 25; checkpoint saved; rerun to continue` (the folder is
    named after `saved`)."""
    if saved is None:
        return (
            f"stopped by {reason} at step {step}; no checkpoint (checkpoint.enable is off); "
            "a rerun starts over"
        )
    return f"stopped by {reason} at step {step}; checkpoint saved ({saved}); rerun to continue"
