"""Measure what `perf.block` predicts by running the real model under the real TP plan.

One CPU process plays rank 0 of a TP group (`fake_group`): a fake process group of world
size tp (its collectives return garbage of the right shape) and FakeTensorMode (no real
memory) let a 30B block at TP8 and seq 4096 run forward and backward in about a second. Per
block:
`record_collectives` (recorder + CommDebugMode) records every collective, `FlopCounterMode`
counts FLOPs on the local tensors our styles compute on, and saved-tensor hooks add up
the activations kept for backward, with F.rms_norm saving what CUDA's fused kernel saves
(`fake_group.fused_rms_norm_saves`). A one-block model with loss-parallel cross-entropy
gives the model-level collectives (its calls minus the block's) and, with the block's
parameters, params_per_rank.
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel
from torch.utils.flop_counter import (
    FlopCounterMode,
    flop_registry,
    register_flop_formula,
)

from boost_titan.bench.measure.fake_group import (
    TORCH_DTYPES,
    default_dtype,
    fake_tp_mesh,
    fused_rms_norm_saves,
    layer_input_dim,
    parallel_model,
)
from boost_titan.bench.measure.flops import CPU_SDPA_FLOPS
from boost_titan.boost_llama import BoostModelArgs, BoostTransformer
from boost_titan.config.errors import ConfigError
from boost_titan.parallelize.debug import (
    CollectiveCall,
    CollectiveLog,
    record_collectives,
)
from boost_titan.perf import block, layout, predict
from boost_titan.perf.layout import TrainingLayout
from boost_titan.perf.records import LayerRecord, PerfRecord, layout_fields

FLOP_TOLERANCE = 0.01
ACTIVATION_TOLERANCE = 0.05
"""Largest relative gap between the traced and the modelled activation bytes (issue 13:
5 %); over the sweep of the README the two agree to the byte."""


# ---- setup -------------------------------------------------------------------------------
def register_cpu_sdpa_flops() -> None:
    """FlopCounterMode has no formula for CPU flash attention; give it the CUDA one's."""
    for op, formula in CPU_SDPA_FLOPS.items():
        if op not in flop_registry:
            register_flop_formula(op)(formula)


# ---- measurement -------------------------------------------------------------------------
@dataclass
class LayerTrace:
    """One block, forward and backward, on one rank."""

    forward: CollectiveLog
    backward: CollectiveLog
    flops: int
    flops_bwd: int
    activation_bytes: int


def _local_storages(tensors: Iterable[torch.Tensor]) -> set[int]:
    return {
        (t.to_local() if isinstance(t, DTensor) else t).untyped_storage()._cdata for t in tensors
    }


@contextmanager
def saved_bytes(exclude: set[int]) -> Iterator[dict[int, int]]:
    """Bytes of the distinct storages autograd saves for backward, except `exclude`."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in exclude:
            storages[storage._cdata] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield storages


def trace_layer(model: BoostTransformer, h: torch.Tensor) -> LayerTrace:
    """Run block 0 on the local input `h`, forward then backward from a random grad."""
    register_cpu_sdpa_flops()
    layer = model.layers["0"]
    constants = _local_storages(model.parameters()) | _local_storages(model.buffers())
    with fused_rms_norm_saves():
        with record_collectives() as fwd, FlopCounterMode(display=False) as fwd_flops:
            with saved_bytes(constants) as saved:
                out, _ = layer(h, model.rope)
        with record_collectives() as bwd, FlopCounterMode(display=False) as bwd_flops:
            out.backward(torch.randn_like(out))
    return LayerTrace(
        fwd, bwd, fwd_flops.get_total_flops(), bwd_flops.get_total_flops(), sum(saved.values())
    )


def trace_model(model: BoostTransformer, tokens: torch.Tensor) -> CollectiveLog:
    """All collectives of a forward + loss-parallel cross-entropy + backward step."""
    with record_collectives() as log, warnings.catch_warnings():
        # CommDebugMode's module tracker warns that the embedding's input needs no grad
        warnings.filterwarnings("ignore", "Full backward hook is firing")
        logits = model(tokens)
        with loss_parallel():
            F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten()).backward()
    return log


def without(calls: list[CollectiveCall], remove: list[CollectiveCall]) -> list[CollectiveCall]:
    """`calls` minus the multiset `remove`, which must be contained in it."""
    pending, kept = Counter(remove), []
    for call in calls:
        if pending[call]:
            pending[call] -= 1
        else:
            kept.append(call)
    if +pending:
        raise AssertionError(f"collectives missing from the model's: {dict(+pending)}")
    return kept


# ---- records -----------------------------------------------------------------------------
@dataclass
class TraceRecord(LayerRecord):
    """Measured counterparts of `PerfRecord`'s fields (same names and meanings).

    activation_bytes_per_layer: distinct storages saved for backward by one block on
    rank 0 (weights, buffers excluded; the block input included). flops_per_layer_bwd is
    FlopCounterMode's, which counts CPU flash attention's backward as 2.5x its forward
    (it recomputes QK^T). model_mismatches: None unless compared with the perf model.
    """

    trace_s: float
    model_mismatches: list[str] | None = None
    model_activation_bytes_per_layer: int | None = None
    """The model's `activation_bytes_per_layer` (with --compare)."""


def _entries(calls: list[CollectiveCall], tokens: int) -> list[dict]:
    return [
        {
            "kind": c.kind,
            "elements_per_token": c.elements_per_token(tokens),
            "bytes": c.nbytes,
            "shape": list(c.shape),
            "dtype": str(c.dtype).removeprefix("torch."),
        }
        for c in calls
    ]


def _local_numel(params: Iterable[torch.Tensor]) -> int:
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in params)


def trace(flavor: str, args: BoostModelArgs, plan: TrainingLayout) -> TraceRecord:
    """Measure one configuration (`args.n_layers` only scales params_per_rank)."""
    layout.check(args, plan)
    if plan.pp != 1 or plan.ac != "none":
        raise ConfigError("trace measures one TP group without recomputation: use --pp 1 --ac none")
    if plan.seq_len > args.max_seq_len:
        raise ConfigError(
            f"--seq-len {plan.seq_len} exceeds the {flavor} flavor's maximum "
            f"{args.max_seq_len}; pass --seq-len {args.max_seq_len} or less"
        )
    start = time.perf_counter()
    one_block = BoostModelArgs(**{**asdict(args), "n_layers": 1})
    width = layer_input_dim(args, plan.strategy, plan.tp)
    with fake_tp_mesh(plan.tp) as mesh, default_dtype(TORCH_DTYPES[plan.dtype]), FakeTensorMode():
        model = parallel_model(one_block, plan.strategy, mesh, plan.rmsnorm, plan.group_linears)
        h = torch.randn(plan.micro_batch, plan.seq_len, width, requires_grad=True)
        layer = trace_layer(model, h)
        tokens = torch.randint(0, args.vocab_size, (plan.micro_batch, plan.seq_len))
        step = trace_model(model, tokens)
    block_params = _local_numel(model.layers["0"].parameters())
    other_params = _local_numel(model.parameters()) - block_params
    t = plan.tokens
    fwd, bwd = layer.forward.calls, layer.backward.calls
    return TraceRecord(
        flavor=flavor,
        arch=args.arch,
        **layout_fields(plan),
        collectives_per_layer_fwd=len(fwd),
        collectives_per_layer_bwd=len(bwd),
        comm_bytes_per_layer_fwd=sum(c.nbytes for c in fwd),
        comm_bytes_per_layer_bwd=sum(c.nbytes for c in bwd),
        collectives_fwd=_entries(fwd, t),
        collectives_bwd=_entries(bwd, t),
        step_collectives_fwd=_entries(without(step.forward, fwd), t),
        step_collectives_bwd=_entries(without(step.backward, bwd), t),
        flops_per_layer=layer.flops,
        flops_per_layer_bwd=layer.flops_bwd,
        activation_bytes_per_layer=layer.activation_bytes,
        params_per_rank=args.n_layers * block_params + other_params,
        trace_s=time.perf_counter() - start,
    )


# ---- comparison with the analytic model --------------------------------------------------
def _multiset(entries: list[dict], *keys: str) -> Counter:
    return Counter(tuple(e[k] for k in keys) for e in entries)


def compare(
    measured: TraceRecord, model: PerfRecord, args: BoostModelArgs, plan: TrainingLayout
) -> list[str]:
    """Where trace and model disagree: block collectives (count, kind, size, bytes) and
    params exactly; model-level collectives by kind and size (the model prices their
    fp32 statistics at the training dtype); forward FLOPs within 1%; backward FLOPs within
    1% of the model's 2x forward plus the half forward attention that FlopCounterMode
    adds (flash attention's backward recomputes QK^T); activation bytes within 5%."""
    m, t = asdict(measured), asdict(model)
    problems = [
        f"{name}: trace {m[name]} model {t[name]}"
        for name in (
            "collectives_per_layer_fwd",
            "collectives_per_layer_bwd",
            "comm_bytes_per_layer_fwd",
            "comm_bytes_per_layer_bwd",
            "params_per_rank",
        )
        if m[name] != t[name]
    ]
    fields = {
        "collectives_fwd": ("kind", "elements_per_token", "bytes"),
        "collectives_bwd": ("kind", "elements_per_token", "bytes"),
        "step_collectives_fwd": ("kind", "elements_per_token"),
        "step_collectives_bwd": ("kind", "elements_per_token"),
    }
    for name, keys in fields.items():
        traced, modelled = _multiset(m[name], *keys), _multiset(t[name], *keys)
        if traced != modelled:
            problems.append(
                f"{name}: trace-only {dict(traced - modelled)} model-only {dict(modelled - traced)}"
            )
    recompute = block.attention_flops(args, plan) // 2
    for name, expected in (
        ("flops_per_layer", model.flops_per_layer),
        ("flops_per_layer_bwd", model.flops_per_layer_bwd + recompute),
    ):
        if abs(m[name] - expected) > FLOP_TOLERANCE * expected:
            problems.append(f"{name}: trace {m[name]:.4g} model {expected:.4g}")
    gap = activation_gap(measured.activation_bytes_per_layer, model.activation_bytes_per_layer)
    if abs(gap) > ACTIVATION_TOLERANCE:
        problems.append(
            f"activation_bytes_per_layer: trace {measured.activation_bytes_per_layer} "
            f"model {model.activation_bytes_per_layer} ({gap:+.1%})"
        )
    return problems


def activation_gap(traced: int, modelled: int) -> float:
    """(model - trace) / trace of the activation bytes of one block."""
    return (modelled - traced) / traced


def trace_compared(
    flavor: str, args: BoostModelArgs, plan: TrainingLayout, gpu: str
) -> TraceRecord:
    """`trace` one configuration and compare it with the model's prediction on `gpu`."""
    record = trace(flavor, args, plan)
    modelled = predict.evaluate(flavor, args, plan, [gpu])
    record.model_mismatches = compare(record, modelled, args, plan)
    record.model_activation_bytes_per_layer = modelled.activation_bytes_per_layer
    return record


def trace_sweep(
    flavors: Sequence[str],
    arch: str,
    strategies: Sequence[str],
    tps: Sequence[int],
    gpus: Sequence[str],
    compare: bool = False,
    **fields: Any,
) -> list[TraceRecord]:
    """Trace every flavor x tp x strategy; `fields`: the other `TrainingLayout` fields.
    `compare`: each also against the model's prediction on `gpus[0]`."""
    records = []
    for flavor in flavors:
        for tp in tps:
            for strategy in strategies:
                args = layout.trained_shape(flavor, arch, strategy)
                plan = TrainingLayout(strategy=strategy, tp=tp, **fields)
                records.append(
                    trace_compared(flavor, args, plan, gpus[0])
                    if compare
                    else trace(flavor, args, plan)
                )
    return records


def format_traces(records: list[TraceRecord], timing: bool = True) -> str:
    """One line per record; with --compare, the model's activation MiB (and its gap to
    the trace) and what disagrees with the model. `timing`: the trace's own seconds."""
    mib = 2**20
    seconds = f" {'trace s':>7}" if timing else ""
    lines = [
        f"{'flavor':>6} {'arch':>8} {'strategy':>8} {'tp':>2} {'coll f/b':>8} "
        f"{'comm MiB f/b':>15} {'GFLOP fwd':>9} {'act MiB':>8} {'model act MiB':>15} "
        f"{'params/rank M':>13}{seconds}  model"
    ]
    for r in records:
        verdict = "-" if r.model_mismatches is None else "; ".join(r.model_mismatches) or "agrees"
        act = "-"
        if r.model_activation_bytes_per_layer is not None:
            gap = activation_gap(r.activation_bytes_per_layer, r.model_activation_bytes_per_layer)
            act = f"{r.model_activation_bytes_per_layer / mib:.1f} ({gap:+.1%})"
        lines.append(
            f"{r.flavor:>6} {r.arch:>8} {r.strategy:>8} {r.tp:>2} "
            f"{r.collectives_per_layer_fwd:>3}/{r.collectives_per_layer_bwd:<4} "
            f"{r.comm_bytes_per_layer_fwd / mib:>7.1f}/{r.comm_bytes_per_layer_bwd / mib:<7.1f} "
            f"{r.flops_per_layer / 1e9:>9.1f} {r.activation_bytes_per_layer / mib:>8.1f} {act:>15} "
            f"{r.params_per_rank / 1e6:>13.1f}"
            + (f" {r.trace_s:>7.2f}" if timing else "")
            + f"  {verdict}"
        )
    gaps: dict[str, float] = {}
    for r in records:
        if r.model_activation_bytes_per_layer is not None:
            gap = abs(
                activation_gap(r.activation_bytes_per_layer, r.model_activation_bytes_per_layer)
            )
            gaps[r.strategy] = max(gaps.get(r.strategy, 0.0), gap)
    if gaps:
        worst = ", ".join(f"{k} {v:.2%}" for k, v in gaps.items())
        lines.append(
            f"activation bytes, largest |model - trace| / trace: {worst} "
            f"(limit {ACTIVATION_TOLERANCE:.0%})"
        )
    return "\n".join(lines)
