"""The model's record of a training layout: `evaluate` prices one on GPU profiles
(`step` for time, `memory` for the peak per rank) into a `records.PerfRecord`; `sweep`
evaluates a grid and `add_speedups` compares strategies within it.
"""

from __future__ import annotations

from dataclasses import replace

from boost_titan.boost_llama.shapes import ModelShape, param_count
from boost_titan.config.errors import ConfigError
from boost_titan.perf import activations, block, float8_costs, layout, memory, timing
from boost_titan.perf.gpus import GPUS, gpu_profile
from boost_titan.perf.layout import TrainingLayout
from boost_titan.perf.records import PerfRecord, layout_fields


def memory_per_rank(args: ModelShape, plan: TrainingLayout, dp_shard: int = 1) -> dict[str, int]:
    """Peak bytes on the busiest rank by part (`memory.PARTS`) and their total, as
    `memory` models it, with the state sharded over `dp_shard` FSDP ranks."""
    peak = memory.peak_memory(args, plan, dp_shard=dp_shard)
    return peak.parts | {"total": peak.total}


def evaluate(
    flavor: str,
    args: ModelShape,
    plan: TrainingLayout,
    gpus: list[str],
    *,
    gpu_work_only: bool = False,
    dp_shard: int = 1,
) -> PerfRecord:
    """The full record of one configuration; step times on every profile in `gpus`, the
    first of which `add_speedups` compares on. `gpu_work_only`: the GPU's work alone, no
    host term (for code whose host cost the model does not know). `dp_shard`: FSDP's shard
    degree, which divides the weights, gradients and optimizer state in memory."""
    layout.check(args, plan)
    profiles = {g: gpu_profile(g) for g in gpus}
    if gpu_work_only:
        profiles = {g: replace(p, host_launch_s=0.0) for g, p in profiles.items()}
    for name, profile in profiles.items():
        if plan.tp > profile.gpus_per_node:
            raise ConfigError(
                f"tp {plan.tp} exceeds the {profile.gpus_per_node} GPUs per node of profile "
                f"{name}; tensor parallelism stays inside one node, lower --tp or pick "
                "another --gpu"
            )
        if plan.float8 and not profile.has_float8:
            able = ", ".join(g for g, p in GPUS.items() if p.has_float8)
            raise ConfigError(
                f"GPU profile {name} has no float8 tensor cores (float8 needs "
                f"SM89+); pick a --gpu among {able}"
            )
    t, db = plan.tokens, plan.dtype_bytes
    selections = float8_costs.selection_counts(args, plan, range(args.n_layers))
    fwd, bwd = block.layer_collectives(args, plan)
    step_fwd, step_bwd = block.step_collectives(args, plan)
    flops = block.layer_flops(args, plan)
    times = {g: timing.step_time(args, plan, profile, dp_shard) for g, profile in profiles.items()}
    ring_fwd, ring_bwd = block.ring_bytes(args, plan)
    return PerfRecord(
        flavor=flavor,
        arch=args.arch,
        **layout_fields(plan, PerfRecord),
        collectives_per_layer_fwd=len(fwd),
        collectives_per_layer_bwd=len(bwd),
        comm_bytes_per_layer_fwd=sum(c.bytes(t, db) for c in fwd),
        comm_bytes_per_layer_bwd=sum(c.bytes(t, db) for c in bwd),
        collectives_fwd=[c.to_json(t, db) for c in fwd],
        collectives_bwd=[c.to_json(t, db) for c in bwd],
        step_collectives_fwd=[c.to_json(t, db) for c in step_fwd],
        step_collectives_bwd=[c.to_json(t, db) for c in step_bwd],
        flops_per_layer=flops,
        flops_per_layer_bwd=2 * flops,
        recompute_flops_per_layer=block.recompute_flops(args, plan),
        gemms=[g.to_json(db) for g in block.layer_gemms(args, plan)],
        activation_bytes_per_layer=activations.activation_bytes(args, plan),
        params_total=param_count(args),
        params_per_rank=block.params_per_rank(args, plan),
        memory_bytes_per_rank=memory_per_rank(args, plan, dp_shard),
        predicted_step_s={g: parts["step"] for g, parts in times.items()},
        time_breakdown_s={
            g: {k: parts[k] for k in timing.time_parts(plan)} for g, parts in times.items()
        },
        hidden_comm_s={g: parts["comm_hidden"] for g, parts in times.items()},
        memory_kernels_s={
            g: timing.memory_kernels(args, plan, profile) for g, profile in profiles.items()
        },
        speedup_gpu=gpus[0],
        precision=plan.precision,
        float8_gemms={
            "float8": sum(len(s) * n for s, n in selections.items()),
            "total": len(block.layer_gemms(args, plan)) * args.n_layers,
        }
        if plan.float8
        else {},
        float8_skipped={k: v for k, v in float8_costs.float8_selection(args, plan, 0).items() if v},
        ring_bytes_per_layer_fwd=ring_fwd,
        ring_bytes_per_layer_bwd=ring_bwd,
        saved_activations_per_microbatch=memory.forward_saved_bytes(args, plan),
    )


def add_speedups(records: list[PerfRecord]) -> None:
    """Fill predicted_speedup between records that differ only in strategy (and arch)."""

    def key(r: PerfRecord) -> tuple:
        return (
            r.flavor,
            r.tp,
            r.pp,
            r.cp,
            r.seq_len,
            r.micro_batch,
            r.microbatches,
            r.precision,
            r.ac,
            r.rmsnorm,
            r.group_linears,
            r.speedup_gpu,
        )

    for r in records:
        mine = r.predicted_step_s[r.speedup_gpu]
        r.predicted_speedup = {
            o.strategy: o.predicted_step_s[o.speedup_gpu] / mine
            for o in records
            if key(o) == key(r) and o.strategy != r.strategy
        }


def sweep(
    flavors: list[str], arch: str, strategies: list[str], tps: list[int], gpus: list[str], **plan
) -> list[PerfRecord]:
    """Records for every flavor x tp x strategy (other TrainingLayout fields from `plan`),
    with speedups."""
    records = [
        evaluate(
            f, layout.trained_shape(f, arch, s), TrainingLayout(strategy=s, tp=tp, **plan), gpus
        )
        for f in flavors
        for tp in tps
        for s in strategies
    ]
    add_speedups(records)
    return records
