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
  {kind: all_reduce | all_gather | reduce_scatter, name, elements_per_token, bytes}.
  elements_per_token and bytes describe the tensor each rank hands to the collective.
- step_collectives_fwd / _bwd: the same for the model-level extras (final norm, gather,
  lm_head, loss parallel), once per micro-batch and pipeline, not per layer.
- flops_per_layer: forward FLOPs of a block per rank (GEMMs + attention, see perfmodel);
  flops_per_layer_bwd = 2x; recompute_flops_per_layer: extra backward work of `ac`.
- gemms: forward GEMMs of a block per rank: {name, m, n, k, flops, intensity}, the
  product [m, k] x [k, n], intensity = FLOPs per byte of the three operands.
- activation_bytes_per_layer: saved-for-backward bytes of a block per rank.
- params_total: parameters of the whole model; params_per_rank: on the busiest rank.
- memory_bytes_per_rank: {params, grads, optimizer, activations, total}.
- predicted_step_s: {gpu: seconds per optimizer step}; time_breakdown_s: {gpu: {part: s}}.
- predicted_speedup: {other strategy: other's step / this step} on `speedup_gpu`
  (> 1 means this strategy is faster), among records of the same configuration.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from boost_titan.boost_llama.strategies import STRATEGIES

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
    speedup_gpu: str
    predicted_speedup: dict[str, float] = field(default_factory=dict)


@dataclass
class ValidationRow:
    """Published vs modelled seconds per iteration of one BOOST §6 configuration."""

    flavor: str
    tp: int
    pp: int
    paper_s: dict[str, float]
    predicted_s: dict[str, float]

    @staticmethod
    def _speedups(seconds: dict[str, float]) -> dict[str, float]:
        btp = seconds["btp"]
        return {"btp_vs_megatron": seconds["megatron"] / btp, "btp_vs_vanilla": seconds["vanilla"] / btp}

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


def _render(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [header, ["-" * w for w in widths], *rows]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines)


def format_records(records: list[PerfRecord]) -> str:
    """A readable table: one row per record."""
    gpus = list(records[0].predicted_step_s) if records else []
    header = [
        "flavor", "arch", "strategy", "tp", "pp", "coll f/b", "comm MiB f/b",
        "GFLOP fwd", "act MiB", "params/rank M", "mem GiB",
        *[f"step s {g}" for g in gpus], "speedup vs",
    ]
    rows = []
    for r in records:
        speedup = ", ".join(f"{k} x{v:.2f}" for k, v in r.predicted_speedup.items())
        rows.append([
            r.flavor, r.arch, r.strategy, str(r.tp), str(r.pp),
            f"{r.collectives_per_layer_fwd}/{r.collectives_per_layer_bwd}",
            f"{r.comm_bytes_per_layer_fwd / MIB:.1f}/{r.comm_bytes_per_layer_bwd / MIB:.1f}",
            f"{r.flops_per_layer / 1e9:.1f}",
            f"{r.activation_bytes_per_layer / MIB:.1f}",
            f"{r.params_per_rank / 1e6:.1f}",
            f"{r.memory_bytes_per_rank['total'] / 2**30:.1f}",
            *[f"{r.predicted_step_s[g]:.3f}" for g in gpus],
            speedup or "-",
        ])
    return _render(header, rows)


def format_validation(rows: list[ValidationRow], gpu: str) -> str:
    """Paper vs model: seconds per iteration and BTP speedups, one row per configuration."""
    header = [
        "config", "paper s fr/van/btp", f"model s ({gpu}) fr/van/btp",
        "btp/fr paper", "btp/fr model", "btp/van paper", "btp/van model",
    ]
    order = STRATEGIES
    table = []
    for row in rows:
        ps, ms = row.paper_speedup, row.predicted_speedup
        table.append([
            f"{row.flavor} TP{row.tp}" + (f"xPP{row.pp}" if row.pp > 1 else ""),
            "/".join(f"{row.paper_s[s]:.2f}" for s in order),
            "/".join(f"{row.predicted_s[s]:.2f}" for s in order),
            f"{ps['btp_vs_megatron']:.2f}", f"{ms['btp_vs_megatron']:.2f}",
            f"{ps['btp_vs_vanilla']:.2f}", f"{ms['btp_vs_vanilla']:.2f}",
        ])
    return _render(header, table)
