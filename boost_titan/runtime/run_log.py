"""What one training invocation did: per-step global loss, tokens and time, held-out
validation results, the saved activations of its first step, and its summary.

With a `path`, each step is also appended to a JSON-lines file as {"step", "loss",
"tokens"}, each validation as {"step", "validation_loss", "validation_perplexity",
"validation_tokens"}, and each skipped (non-finite) step as {"step", "skipped",
"skipped_steps"}; `read_log` splits such a file into training and validation rows.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field


def perplexity(loss: float) -> float:
    """exp(loss); inf where it overflows."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def read_log(path: str) -> tuple[list[dict], list[dict]]:
    """(training rows, validation rows) of a `losses.jsonl` file, in file order."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if "loss" in r], [r for r in rows if "validation_loss" in r]


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
    validations: list[tuple[int, float, int]] = field(default_factory=list)
    """(step, held-out loss, tokens) of every validation run."""
    validation_seconds: float = 0.0
    paused: float = 0.0
    """Validation time between the first and the last recorded step (not training time)."""
    _pending_pause: float = 0.0

    def start(self) -> None:
        """Mark the beginning of the first step (idempotent)."""
        if self.started is None:
            self.started = time.perf_counter()

    def record(self, step: int, loss: float, tokens: int, grad_norm: float | None = None) -> None:
        """Add a finished step: its global average loss, the global tokens it consumed and
        (when known) its global gradient norm before clipping."""
        self.losses.append((step, loss))
        self.tokens += tokens
        self.ended = time.perf_counter()
        self.paused += self._pending_pause
        self._pending_pause = 0.0
        row = {"step": step, "loss": loss, "tokens": tokens}
        self._append(row if grad_norm is None else {**row, "grad_norm": grad_norm})

    def record_validation(self, step: int, loss: float, tokens: int, seconds: float) -> None:
        """Add a validation after `step`: its held-out loss, tokens scored and duration."""
        self.validations.append((step, loss, tokens))
        self.validation_seconds += seconds
        self._pending_pause += seconds  # training time only if another step follows
        self._append(
            {
                "step": step,
                "validation_loss": loss,
                "validation_perplexity": perplexity(loss),
                "validation_tokens": tokens,
            }
        )

    def record_skip(self, step: int, line: str, skipped: int) -> None:
        """A step kept from the optimizer (non-finite): the reason, and the skips so far."""
        self._append({"step": step, "skipped": line, "skipped_steps": skipped})

    def _append(self, row: dict) -> None:
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")

    def activations_line(self) -> str | None:
        """`saved activations: 12.34 MiB per step on rank 0 (step 1)`, once measured."""
        if self.saved_activations is None:
            return None
        step, nbytes = self.saved_activations
        return f"saved activations: {nbytes / 2**20:.2f} MiB per step on rank 0 (step {step})"

    @property
    def seconds(self) -> float:
        """Wall time from the first step's start to the last step's end, minus validation."""
        if self.started is None or self.ended is None:
            return 0.0
        return self.ended - self.started - self.paused

    def validation_line(self) -> str | None:
        """`validation loss 6.1 (step 50) -> 5.4 (step 200), perplexity 221.4 (4 runs, 8.1 s)`."""
        if not self.validations:
            return None
        (first_step, first_loss, _), (last_step, last_loss, tokens) = (
            self.validations[0],
            self.validations[-1],
        )
        change = f"{first_loss:.4f} (step {first_step}) -> " * (len(self.validations) > 1)
        runs = len(self.validations)
        return (
            f"validation loss {change}{last_loss:.4f} (step {last_step}), perplexity "
            f"{perplexity(last_loss):,.2f} over {tokens:,} tokens ({runs} run{'s' * (runs > 1)}, "
            f"{self.validation_seconds:.1f} s)"
        )

    def summary(self, final_step: int) -> str:
        """One line: steps run, throughput, first and last loss, validation, saved activations."""
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
        extras = [self.validation_line(), self.activations_line()]
        return "; ".join([line, *(extra for extra in extras if extra is not None)])
