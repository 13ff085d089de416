"""Training steps measured with the product on a GPU, and the host constant fitted to them.

`H100_ROWS`: one H100 80GB (SXM), 2026-11-27, commit 18fc3d3, `train_configs/1B.toml` (TP1,
bf16 compute with fp32 master weights, seq 4096), 1 process, torch 2.11 + triton 3.6,
tokens/s from TorchTitan's log (the lower end where two runs were taken), as
docs/gpus.md#what-ran-on-a-gpu lists them (`scripts/gpu_check.sh` measures them again). The
code of that commit cast
every weight before every forward and backward and reduced one norm per gradient, which
the model prices with `TrainingLayout.legacy_launches`.

`HOST_FIT` is the row `GpuProfile.host_launch_s` is fitted to (`fit_host_launch`); every other
row is held out and only compared (`host_rows`, printed by `bench validate`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from boost_titan.boost_llama.archs import architecture
from boost_titan.perf import layout, timing
from boost_titan.perf.gpus import GpuProfile, gpu_profile
from boost_titan.perf.layout import TrainingLayout
from boost_titan.perf.records import _render

FLAVOR, SEQ_LEN = "1B", 4096


@dataclass(frozen=True)
class MeasuredRow:
    """One measured configuration of the 1B flavor at TP1."""

    name: str
    arch: str
    micro_batch: int
    microbatches: int
    compiled: bool
    tokens_per_s: float

    @property
    def strategy(self) -> str:
        return architecture(self.arch).default_strategy

    @property
    def step_s(self) -> float:
        return self.micro_batch * self.microbatches * SEQ_LEN / self.tokens_per_s

    def plan(self, **changes) -> TrainingLayout:
        """The row's layout as the model prices it (`changes`: e.g. the product's launches)."""
        fields = dict(
            strategy=self.strategy,
            tp=1,
            seq_len=SEQ_LEN,
            micro_batch=self.micro_batch,
            microbatches=self.microbatches,
            compiled=self.compiled,
            legacy_launches=True,
            interleaved_rope=True,
        )
        return TrainingLayout(**(fields | changes))


H100_ROWS = (
    MeasuredRow("CoLA eager", "cola", 1, 4, False, 18_165),
    MeasuredRow("CoLA compiled", "cola", 1, 4, True, 23_677),
    MeasuredRow("full rank compiled", "fullrank", 1, 4, True, 28_946),
    MeasuredRow("CoLA compiled", "cola", 4, 1, True, 65_861),
    MeasuredRow("full rank compiled", "fullrank", 4, 1, True, 48_016),
)
HOST_FIT = H100_ROWS[0]
"""The row the host constant is fitted to: eager CoLA, the most launches per step."""


def predicted_step(row: MeasuredRow, gpu: GpuProfile, **changes) -> float:
    args = layout.trained_shape(FLAVOR, row.arch, row.strategy)
    return timing.step_time(args, row.plan(**changes), gpu)["step"]


def fit_host_launch(gpu: str = "h100", row: MeasuredRow = HOST_FIT) -> float:
    """The host seconds per launch at which the model predicts `row`'s step exactly
    (bisection; the prediction grows with the constant)."""
    profile = gpu_profile(gpu)
    low, high = 0.0, 1e-3
    for _ in range(60):
        mid = (low + high) / 2
        step = predicted_step(row, dataclasses.replace(profile, host_launch_s=mid))
        low, high = (mid, high) if step < row.step_s else (low, mid)
    return (low + high) / 2


@dataclass(frozen=True)
class HostRow:
    """A measured row next to the model's prediction (today's launches and the product's)."""

    row: MeasuredRow
    predicted_s: float
    product_s: float
    graphs_s: float
    fitted: bool

    @property
    def error(self) -> float:
        return self.predicted_s / self.row.step_s - 1


def host_rows(gpu: str = "h100") -> list[HostRow]:
    """Every H100 row: measured, predicted for the code it ran, and predicted for this
    code eager / with CUDA graphs."""
    profile = gpu_profile(gpu)
    return [
        HostRow(
            row,
            predicted_step(row, profile),
            predicted_step(row, profile, legacy_launches=False, interleaved_rope=False),
            predicted_step(
                row, profile, legacy_launches=False, interleaved_rope=False, cuda_graphs=True
            ),
            row == HOST_FIT,
        )
        for row in H100_ROWS
    ]


def format_host_rows(rows: list[HostRow]) -> str:
    """Measured vs predicted tokens/s, and what the model predicts for this code."""
    header = [
        "run (1B, TP1)",
        "batch",
        "measured tok/s",
        "predicted",
        "error",
        "role",
        "this code",
        "this code + CUDA graphs",
    ]
    body = []
    for r in rows:
        tokens = r.row.micro_batch * r.row.microbatches * SEQ_LEN
        body.append(
            [
                r.row.name,
                f"{r.row.micro_batch}x{r.row.microbatches}",
                f"{r.row.tokens_per_s:,.0f}",
                f"{tokens / r.predicted_s:,.0f}",
                f"{r.row.step_s / r.predicted_s - 1:+.0%}",
                "fitted" if r.fitted else "held out",
                f"{tokens / r.product_s:,.0f}",
                f"{tokens / r.graphs_s:,.0f}",
            ]
        )
    return _render(header, body)


__all__ = [
    "H100_ROWS",
    "HOST_FIT",
    "HostRow",
    "MeasuredRow",
    "fit_host_launch",
    "format_host_rows",
    "host_rows",
]
