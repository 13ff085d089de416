"""Stopping early without losing a step: SIGTERM, SIGUSR1 and a wall-clock budget.

Schedulers send SIGTERM before a kill (SLURM and Kubernetes: a grace period later, SIGKILL),
and `sbatch --signal=USR1@<seconds>` sends SIGUSR1 ahead of the time limit. `StopRequest`
turns either signal, and the end of `[boost] time_budget_minutes`, into a flag; the trainer
all-reduces the flags with each step's loss (no extra collective), so every rank finishes the
same step, saves one checkpoint of it and ends with `stopped_line` and exit status `STOPPED`
from every worker, however they were launched. A stop asked for during the last step ends
with `finished_line` and exit 0 (the run is complete). Later signals only set the flag
again: they never interrupt the save.

torchrun restarts a group whose worker exits non-zero while `--max-restarts` allows it.
`python -m boost_titan.torchrun` (what `run_train.sh` and the SLURM script launch) never
restarts a stopped group and exits `STOPPED` itself. Under a stock torchrun each stopped
worker leaves its stop line in torchrun's error file (the root cause of torchrun's report),
and a restarted worker that finds it there (`stopped_before`) ends at once with `STOPPED`
instead of training on: the restarts run out in seconds, and torchrun exits 1.
Torch-free: the launchers read `STOP_LINE`, `FINISHED_LINE` and `STOPPED`.
"""

from __future__ import annotations

import json
import os
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
FINISHED_LINE = re.compile(r"^.+ during the last step, \d+; training is complete")
"""The line `finished_line` writes (the relay prints it last and exits 0)."""
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


def finished_line(reason: str, step: int, saved: str | None) -> str:
    """`SIGTERM during the last step, 10; training is complete, checkpoint saved (...)`."""
    kept = f"checkpoint saved ({saved})" if saved else "no checkpoint (checkpoint.enable is off)"
    return f"{reason} during the last step, {step}; training is complete, {kept}"


class StoppedEarly(Exception):
    """Training stopped before `training.steps`; the message is the stop line. The
    worker's entry turns it into exit status STOPPED (`record_stop`)."""


def record_stop(line: str) -> None:
    """Leave `line` in this worker's torchrun error file (TORCHELASTIC_ERROR_FILE, if any):
    torchrun's report shows it as the root cause, and `stopped_before` finds it."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    message = {
        "message": line,
        "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()))},
    }
    with open(path, "w") as f:
        json.dump({"message": message}, f)


def stopped_before() -> str | None:
    """The stop line of this worker's previous torchrun attempt, when torchrun restarted a
    group that had stopped; None otherwise. torchrun keeps each attempt's error files in
    `<log_dir>/<run_id>/attempt_<n>/<local_rank>/error.json`."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
    path = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
    rank_dir = os.path.dirname(path)
    attempt_dir = os.path.dirname(rank_dir)
    if attempt < 1 or os.path.basename(attempt_dir) != f"attempt_{attempt}":
        return None
    previous = os.path.join(
        os.path.dirname(attempt_dir),
        f"attempt_{attempt - 1}",
        os.path.basename(rank_dir),
        os.path.basename(path),
    )
    try:
        with open(previous) as f:
            line = json.load(f)["message"]["message"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return line if isinstance(line, str) and STOP_LINE.match(line) else None


def end_if_stopped_before() -> None:
    """End this worker with STOPPED, before it trains, when torchrun restarted a group that
    had stopped (`stopped_before`); the next attempt finds the same line."""
    line = stopped_before()
    if line is None:
        return
    record_stop(line)
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"torchrun restarted a stopped run; not training: {line}", flush=True)
    raise SystemExit(STOPPED)
