"""The JSON record of one modelled configuration, and the tables printed from records.

A `PerfRecord` serialises (`dataclasses.asdict`) to a JSON object with these stable fields.
"Per rank" means one GPU of the TP x PP grid; "per layer" one transformer block and one
micro-batch (tokens = micro_batch * seq_len); byte counts use the training dtype.

- flavor, arch, strategy, tp, pp, seq_len, micro_batch, microbatches, dtype, ac, rmsnorm,
  group_linears: the configuration (arch is always "fullrank" for megatron).
- collectives_per_layer_fwd / _bwd: number of collectives one block issues.
- comm_bytes_per_layer_fwd / _bwd: sum of their payloads, bytes per rank.
- collectives_fwd / collectives_bwd: one entry per collective of a block, in issue order
  (backward: reverse layer order; compare as multisets, autograd may reorder):
  {kind: all_reduce | all_gather | reduce_scatter, name, elements_per_token, bytes,
  behind}. elements_per_token and bytes describe the tensor each rank hands to the
  collective; behind lists the GEMMs whose weight grads run while it is in flight.
- step_collectives_fwd / _bwd: the same for the model-level extras (final norm, gather,
  lm_head, loss parallel), once per micro-batch and pipeline, not per layer.
- flops_per_layer: forward FLOPs of a block per rank (GEMMs + attention, see block);
  flops_per_layer_bwd = 2x; recompute_flops_per_layer: extra backward work of `ac`.
- gemms: forward GEMMs of a block per rank: {name, m, n, k, flops, intensity}, the
  product [m, k] x [k, n], intensity = FLOPs per byte of the three operands.
- activation_bytes_per_layer: saved-for-backward bytes of a block per rank.
- params_total: parameters of the whole model; params_per_rank: on the busiest rank.
- memory_bytes_per_rank: the peak by `memory.PARTS`, and its total.
- predicted_step_s: {gpu: seconds per optimizer step}; time_breakdown_s: {gpu: {part: s}}
  with parts gemm, memory (memory-bound kernels), attention, optimizer, comm (exposed
  communication), bubble, host and under LORO exact_step (`perf.loro`), which add up to
  the step; hidden_comm_s: {gpu: s} of
  collectives run behind weight-grad GEMMs (not in the step); memory_kernels_s: {gpu:
  {kernel: s}}, the blocks' memory-bound kernels per step, largest first.
- predicted_speedup: {other strategy: other's step / this step} on `speedup_gpu`
  (> 1 means this strategy is faster), among records of the same configuration.
- precision: GEMM and state dtypes and any float8 recipe, e.g. "bf16, fp32 master, float8
  tensorwise (eager casts)"; float8_gemms: {float8, total} forward GEMMs per rank over all
  blocks ({} with float8 off); float8_skipped: {GEMM of the first block: why it stays in
  high precision}.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from boost_titan.boost_llama.strategies import STRATEGIES
from boost_titan.perf.layout import TrainingLayout

MIB = 2**20


@dataclass
class LayerRecord:
    """Fields shared by modelled (`PerfRecord`) and traced (`TraceRecord`) configurations:
    the configuration, and per layer and rank its collectives, FLOPs and saved bytes."""

    flavor: str
    arch: str
    strategy: str
    tp: int
    pp: int
    seq_len: int
    micro_batch: int
    dtype: str
    ac: str
    rmsnorm: str
    group_linears: bool
    collectives_per_layer_fwd: int
    collectives_per_layer_bwd: int
    comm_bytes_per_layer_fwd: int
    comm_bytes_per_layer_bwd: int
    collectives_fwd: list[dict]
    collectives_bwd: list[dict]
    step_collectives_fwd: list[dict]
    step_collectives_bwd: list[dict]
    flops_per_layer: int
    flops_per_layer_bwd: int
    activation_bytes_per_layer: int
    params_per_rank: int

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class PerfRecord(LayerRecord):
    """Modelled communication, compute, memory and step time of one configuration."""

    microbatches: int
    recompute_flops_per_layer: int
    gemms: list[dict]
    params_total: int
    memory_bytes_per_rank: dict[str, int]
    predicted_step_s: dict[str, float]
    time_breakdown_s: dict[str, dict[str, float]]
    hidden_comm_s: dict[str, float]
    memory_kernels_s: dict[str, dict[str, float]]
    speedup_gpu: str
    precision: str
    float8_gemms: dict[str, int]
    float8_skipped: dict[str, str]
    predicted_speedup: dict[str, float] = field(default_factory=dict)
    cp: int = 1
    ring_bytes_per_layer_fwd: int = 0
    ring_bytes_per_layer_bwd: int = 0
    """Bytes a rank receives through CP's K/V ring per block and micro-batch
    (`block.ring_bytes`)."""
    loro_exact_every: int = 0
    """LORO's exact step every K steps (0: AdamW), priced in `time_breakdown_s` and
    `memory_bytes_per_rank` as `exact_step` (`perf.loro`)."""
    saved_activations_per_microbatch: int = 0
    """Bytes one micro-batch's forward keeps for backward on a rank of the first stage,
    blocks and the model's ends (`memory.forward_saved_bytes`)."""


def layout_fields(layout: TrainingLayout, record: type[LayerRecord] = LayerRecord) -> dict:
    """The fields of `layout` that `record` carries (those both name alike), for
    `record(**layout_fields(...), ...)`: the one place a layout becomes a record's fields."""
    own = {f.name for f in fields(layout)}
    return {f.name: getattr(layout, f.name) for f in fields(record) if f.name in own}


def config_name(flavor: str, tp: int, pp: int) -> str:
    return f"{flavor} TP{tp}" + (f"xPP{pp}" if pp > 1 else "")


@dataclass
class ValidationRow:
    """Published vs modelled seconds per iteration of one BOOST §6 configuration."""

    flavor: str
    tp: int
    pp: int
    micro_batch: int
    microbatches: int
    paper_s: dict[str, float]
    predicted_s: dict[str, float]
    predicted_breakdown_s: dict[str, dict[str, float]]
    """Per strategy, the predicted step's split (see PerfRecord.time_breakdown_s)."""

    @staticmethod
    def _speedups(seconds: dict[str, float]) -> dict[str, float]:
        btp = seconds["btp"]
        return {
            "btp_vs_megatron": seconds["megatron"] / btp,
            "btp_vs_vanilla": seconds["vanilla"] / btp,
        }

    @property
    def paper_speedup(self) -> dict[str, float]:
        return self._speedups(self.paper_s)

    @property
    def predicted_speedup(self) -> dict[str, float]:
        return self._speedups(self.predicted_s)

    def to_json(self) -> dict:
        return asdict(self) | {
            "paper_speedup": self.paper_speedup,
            "predicted_speedup": self.predicted_speedup,
        }


@dataclass
class GemmAblationRow:
    """One low-rank pair's forward GEMMs: modelled vs published utilisation and time."""

    strategy: str
    part: str
    flops: int
    predicted_utilisation: float
    predicted_s: float
    paper_utilisation: float
    paper_s: float


@dataclass
class CommAblationRow:
    """One layer's forward TP collectives: modelled vs published bytes and time."""

    strategy: str
    collectives: int
    predicted_bytes: int
    predicted_s: float
    paper_bytes: float
    paper_s: float


@dataclass
class SwitchRow:
    """BTP's predicted step with a product switch at its default and flipped."""

    config: str
    switch: str
    default_s: float
    flipped_s: float

    @property
    def speedup(self) -> float:
        """How much faster the default is than the flipped setting."""
        return self.flipped_s / self.default_s


@dataclass
class ConstantRow:
    """One constant of the time model: its value and source (a tag of `gpus`)."""

    constant: str
    value: str
    source: str


def _render(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [header, ["-" * w for w in widths], *rows]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in lines
    )


def format_records(records: list[PerfRecord]) -> str:
    """A readable table: one row per record."""
    gpus = list(records[0].predicted_step_s) if records else []
    header = [
        "flavor",
        "arch",
        "strategy",
        "tp",
        "pp",
        "coll f/b",
        "comm MiB f/b",
        "GFLOP fwd",
        "act MiB",
        "params/rank M",
        "mem GiB",
        *[f"step s {g}" for g in gpus],
        "speedup vs",
    ]
    rows = []
    for r in records:
        speedup = ", ".join(f"{k} x{v:.2f}" for k, v in r.predicted_speedup.items())
        rows.append(
            [
                r.flavor,
                r.arch,
                r.strategy,
                str(r.tp) + (f" cp{r.cp}" if r.cp > 1 else ""),
                str(r.pp),
                f"{r.collectives_per_layer_fwd}/{r.collectives_per_layer_bwd}",
                f"{r.comm_bytes_per_layer_fwd / MIB:.1f}/{r.comm_bytes_per_layer_bwd / MIB:.1f}",
                f"{r.flops_per_layer / 1e9:.1f}",
                f"{r.activation_bytes_per_layer / MIB:.1f}",
                f"{r.params_per_rank / 1e6:.1f}",
                f"{r.memory_bytes_per_rank['total'] / 2**30:.1f}",
                *[f"{r.predicted_step_s[g]:.3f}" for g in gpus],
                speedup or "-",
            ]
        )
    return _render(header, rows)


def format_validation(rows: list[ValidationRow], gpu: str) -> str:
    """Paper vs model: seconds per iteration and BTP speedups (model's deviation in %)."""
    header = [
        "config",
        "batch",
        "paper s fr/van/btp",
        f"model s ({gpu}) fr/van/btp",
        "btp/fr paper",
        "btp/fr model",
        "btp/van paper",
        "btp/van model",
    ]
    table = []
    for row in rows:
        ps, ms = row.paper_speedup, row.predicted_speedup
        table.append(
            [
                config_name(row.flavor, row.tp, row.pp),
                f"{row.micro_batch}x{row.microbatches}",
                "/".join(f"{row.paper_s[s]:.2f}" for s in STRATEGIES),
                "/".join(f"{row.predicted_s[s]:.2f}" for s in STRATEGIES),
                *[
                    cell
                    for key in ("btp_vs_megatron", "btp_vs_vanilla")
                    for cell in (f"{ps[key]:.2f}", f"{ms[key]:.2f} ({ms[key] / ps[key] - 1:+.0%})")
                ],
            ]
        )
    return _render(header, table)


def format_gemm_ablation(rows: list[GemmAblationRow]) -> str:
    """GEMM utilisation and time of one low-rank pair, model vs published."""
    header = ["strategy", "pair", "GFLOP", "util model", "util paper", "ms model", "ms paper"]
    return _render(
        header,
        [
            [
                r.strategy,
                r.part,
                f"{r.flops / 1e9:.1f}",
                f"{r.predicted_utilisation:.0%}",
                f"~{r.paper_utilisation:.0%}",
                f"{r.predicted_s * 1e3:.2f}",
                f"~{r.paper_s * 1e3:.2f}",
            ]
            for r in rows
        ],
    )


def format_comm_ablation(rows: list[CommAblationRow]) -> str:
    """One layer's forward TP communication, model vs published."""
    header = [
        "strategy",
        "collectives",
        "MiB model",
        "MiB paper",
        "ms model",
        "ms paper",
        "model vs paper",
    ]
    return _render(
        header,
        [
            [
                r.strategy,
                str(r.collectives),
                f"{r.predicted_bytes / MIB:.1f}",
                f"{r.paper_bytes / MIB:.0f}",
                f"{r.predicted_s * 1e3:.2f}",
                f"~{r.paper_s * 1e3:.2f}",
                f"{r.predicted_s / r.paper_s - 1:+.0%}",
            ]
            for r in rows
        ],
    )


def format_switches(rows: list[SwitchRow]) -> str:
    """BTP's predicted step with each product switch at its default and flipped."""
    header = ["config", "switch", "default s", "flipped s", "predicted speedup"]
    return _render(
        header,
        [
            [r.config, r.switch, f"{r.default_s:.3f}", f"{r.flipped_s:.3f}", f"x{r.speedup:.3f}"]
            for r in rows
        ],
    )


def format_memory_kernels(records: list[PerfRecord], top: int = 4) -> str:
    """The blocks' largest memory-bound kernels per step, with their share of the step."""
    rows = []
    for r in records:
        for gpu, kernels in r.memory_kernels_s.items():
            step = r.predicted_step_s[gpu]
            rows.append(
                [
                    r.flavor,
                    r.strategy,
                    str(r.tp),
                    gpu,
                    ", ".join(
                        f"{name} {s:.3f} ({s / step:.0%})"
                        for name, s in list(kernels.items())[:top]
                    ),
                ]
            )
    return _render(
        ["flavor", "strategy", "tp", "gpu", "largest memory-bound kernels, s per step (share)"],
        rows,
    )


def format_breakdown(records: list[PerfRecord]) -> str:
    """Where each predicted step goes: seconds and share per time class, per GPU profile."""
    parts = list(next(iter(records[0].time_breakdown_s.values()))) if records else []
    header = ["flavor", "strategy", "tp", "pp", "gpu", "step s", *parts, "hidden comm s"]
    rows = []
    for r in records:
        for gpu, split in r.time_breakdown_s.items():
            step = r.predicted_step_s[gpu]
            rows.append(
                [
                    r.flavor,
                    r.strategy,
                    str(r.tp),
                    str(r.pp),
                    gpu,
                    f"{step:.3f}",
                    *[f"{split[p]:.3f} ({split[p] / step:.0%})" for p in parts],
                    f"{r.hidden_comm_s[gpu]:.3f}",
                ]
            )
    return _render(header, rows)


def format_constants(rows: list[ConstantRow]) -> str:
    return _render(["constant", "value", "source"], [[r.constant, r.value, r.source] for r in rows])
