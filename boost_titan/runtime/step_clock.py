"""What a run's step log line adds to TorchTitan's: the time left and the time spent
waiting for data.

`StepClock` times each step from the start of one `train_step` to the start of the next
(checkpoint saves and validation included, which the median of the recent steps keeps
from swinging the estimate; the process's first step, which compiles and warms up, counts
only while no other step is timed), and the time each step spends in `next()` on the data
iterator (`waiting`). `tail` is the text appended to the step line:
`eta 1h02m (0.52 s/step x 7,150 steps)  data wait 0.4 ms (0.1%)`, which `appended` adds to
the one line TorchTitan's metrics processor logs.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypeVar

RECENT = 20
"""Steps whose median gives the ETA's time per step."""

T = TypeVar("T")


@contextlib.contextmanager
def appended(logger: logging.Logger, text: str) -> Iterator[None]:
    """While inside, every record `logger` emits ends with two spaces and `text`."""

    def add(record: logging.LogRecord) -> bool:
        record.msg, record.args = f"{record.getMessage()}  {text}", ()
        return True

    logger.addFilter(add)
    try:
        yield
    finally:
        logger.removeFilter(add)


def duration(seconds: float) -> str:
    """`45 s`, `12m05s`, `3h07m`, `2d04h`."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


@dataclass
class StepClock:
    """Step times and data waits of this process (module docstring)."""

    total_steps: int
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    """The last finished steps after the first."""
    first: float | None = None
    """Seconds of this process's first step (compilation, warm-up)."""
    step_started: float | None = None
    wait: float = 0.0
    """Seconds this step spent in the data iterator's `next()`."""
    waits: list[float] = field(default_factory=list)
    """Every finished step's wait, in order."""
    busy: float = 0.0
    """Seconds of every finished step, start to start (for the run's share of waiting)."""

    def start(self) -> None:
        """A step begins: the previous one (if any) is over."""
        self.close()
        self.step_started = time.perf_counter()
        self.wait = 0.0

    def close(self) -> None:
        """The current step is over (`start` calls it; call it once after the last step):
        its time and wait join the record."""
        if self.step_started is None:
            return
        seconds = time.perf_counter() - self.step_started
        if self.first is None:
            self.first = seconds
        else:
            self.recent.append(seconds)
        self.busy += seconds
        self.waits.append(self.wait)
        self.step_started = None

    def waiting(self, iterator: Iterator[T]) -> Iterator[T]:
        """`iterator`, with the time each `next()` takes added to this step's wait."""
        while True:
            begun = time.perf_counter()
            try:
                item = next(iterator)
            finally:
                self.wait += time.perf_counter() - begun
            yield item

    def seconds_per_step(self) -> float:
        """The median of the steady steps: the recent ones after the first, and the current
        one so far (the log line comes at its end) unless it is the first; the first step
        alone while it is the only one."""
        current = None if self.step_started is None else time.perf_counter() - self.step_started
        steady = list(self.recent) + ([current] if self.first is not None and current else [])
        if steady:
            return statistics.median(steady)
        return current if current is not None else self.first or 0.0

    def tail(self, step: int) -> str:
        """What the log line of `step` (about to end) gains: ETA and this step's data wait."""
        left = max(0, self.total_steps - step)
        per_step = self.seconds_per_step()
        elapsed = time.perf_counter() - (self.step_started or time.perf_counter())
        share = 100 * self.wait / elapsed if elapsed > 0 else 0.0
        return (
            f"eta {duration(per_step * left)} ({per_step:.3g} s/step x {left:,} steps)  "
            f"data wait {1e3 * self.wait:.1f} ms ({share:.1f}%)"
        )

    def wait_line(self) -> str | None:
        """`waited for data 0.12 s over 10 steps (0.3% of step time)`, once a step ended."""
        if not self.waits or self.busy <= 0:
            return None
        total = sum(self.waits)
        steps = len(self.waits)
        return (
            f"waited for data {total:.2f} s over {steps} step{'s' * (steps > 1)} "
            f"({100 * total / self.busy:.1f}% of step time)"
        )
