"""What one training invocation did: per-step global loss, tokens and time, the saved
activations of its first step, and its summary.

With a `path`, each step is also appended to a JSON-lines file: {"step", "loss", "tokens"}.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field


@dataclass
class RunLog:
    """Global loss of every step run by this process, plus global tokens and wall time."""

    path: str | None = None
    losses: list[tuple[int, float]] = field(default_factory=list)
    tokens: int = 0
    started: float | None = None
    ended: float | None = None
    saved_activations: tuple[int, int] | None = None
    """(step, bytes): what the first step run kept for backward at its peak, on rank 0."""

    def start(self) -> None:
        """Mark the beginning of the first step (idempotent)."""
        if self.started is None:
            self.started = time.perf_counter()

    def record(self, step: int, loss: float, tokens: int) -> None:
        """Add a finished step: its global average loss and the global tokens it consumed."""
        self.losses.append((step, loss))
        self.tokens += tokens
        self.ended = time.perf_counter()
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": step, "loss": loss, "tokens": tokens}) + "\n")

    def activations_line(self) -> str | None:
        """`saved activations: 12.34 MiB per step on rank 0 (step 1)`, once measured."""
        if self.saved_activations is None:
            return None
        step, nbytes = self.saved_activations
        return f"saved activations: {nbytes / 2**20:.2f} MiB per step on rank 0 (step {step})"

    @property
    def seconds(self) -> float:
        return 0.0 if self.started is None or self.ended is None else self.ended - self.started

    def summary(self, final_step: int) -> str:
        """One line: steps run, throughput, first and last loss."""
        if not self.losses:
            return (
                f"no steps run: training is already at step {final_step} = training.steps; "
                "raise --training.steps to continue"
            )
        (first_step, first_loss), (last_step, last_loss) = self.losses[0], self.losses[-1]
        rate = self.tokens / self.seconds if self.seconds > 0 else float("nan")
        line = (
            f"ran {len(self.losses)} steps ({first_step}-{last_step}) in {self.seconds:.1f} s, "
            f"{rate:,.0f} tokens/s; loss {first_loss:.4f} (step {first_step}) -> "
            f"{last_loss:.4f} (step {last_step}), change {last_loss - first_loss:+.4f}"
        )
        activations = self.activations_line()
        return line if activations is None else f"{line}; {activations}"
