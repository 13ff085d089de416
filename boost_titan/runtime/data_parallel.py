"""Data parallelism and mixed precision, the last step of a TrainSpec's parallelize function
(`boost_llama.parallelize.parallelize_boost`; any model whose blocks it is given). Which layout
takes which path (the one table of it), and the micro-batch protocol the trainer then reads
from the built model (`runtime.microbatches.protocol_for`; nothing is attached to the model):

| layout | data parallelism, mixed precision | micro-batch protocol |
|---|---|---|
| dp_shard or cp > 1 | FSDP2 (HSDP with dp_replicate > 1) | `FsdpSwitches` |
| bf16 compute, nothing else below | compute copies | `HeldCopies` |
| bf16 compute, dp_replicate > 1 | HSDP with a 1-rank shard dim | `FsdpSwitches` |
| bf16 compute, CPU offload | FSDP2 on a 1-rank mesh | `FsdpSwitches` |
| bf16 compute, CUDA graphs on CUDA | FSDP2 (1-rank mesh unless sharded) | none kept |
| bf16 compute, a PP stage | FSDP2 on a 1-rank mesh | none |
| fp32, or bf16 weights (`training.dtype`) | DDP with dp_replicate > 1, else none | none |

Pipeline stages get no protocol: torch's `PipelineStage` defers resharding and reduction to
a stage's last backward itself. CUDA graphs replay the same work for every micro-batch, so
FSDP2 reshards and reduces after each one there (a kept last micro-batch would differ).

- dp_shard or cp > 1: FSDP2 (HSDP with dp_replicate > 1), as TorchTitan does, one unit per
  block.
- Otherwise, for bf16 compute from fp32 weights (`Precision.casts_for_compute`), where no
  weight is sharded and nothing needs FSDP2's machinery (no PP, no dp_replicate, no CPU
  offload, no CUDA graphs on CUDA): `runtime.compute_copies`, each
  fp32 weight cast once per step with autograd recording the cast, gradients accumulated
  into the fp32 masters by autograd; no per-micro-batch hooks (FSDP2 on a 1-rank mesh cost
  the bf16 step 1.46x the fp32 one at TP 1 on CPU; `docs/performance.md`). It computes the
  same bits as FSDP2's `MixedPrecisionPolicy` (`tests/unit/test_accumulation.py`).
- The rest of those layouts (PP stages, dp_replicate > 1, CPU offload, CUDA graphs on
  CUDA) get FSDP2 on a mesh whose shard dim has 1 rank, so its `MixedPrecisionPolicy`
  gives them what FSDP runs get (bf16 parameters in compute, fp32 master weights,
  gradients accumulated and reduced in `mixed_precision_reduce`), as TorchTitan's main
  branch does (pytorch/torchtitan#2900, issue #2886). TorchTitan 0.2.2 builds that "fsdp"
  dim with the fake backend; FSDP2 runs no collective over a 1-rank dim (torch 2.13
  `FSDPParamGroup.unshard` casts the weights into the unsharded copy, `foreach_reduce`
  copies the gradients). Nothing is sharded there, so nothing is resharded after forward:
  the bf16 copy made by a step's first forward serves every micro-batch of the step, and
  gradients are reduced once after the last one (`runtime.accumulation`). The units stay
  TorchTitan's, one per block: a block's casts and gradient additions then run between
  the GEMMs of its neighbours. dp_replicate > 1 uses HSDP over (dp_replicate, fsdp = 1),
  as FSDP2's maintainers suggest for replicated mixed precision (pytorch/torchtitan#1469):
  its fp32 gradient all-reduce over dp_replicate moves DDP's bytes, while DDP under
  `torch.autocast` would compute differently from every other layout (and autocast does
  not fit BTP's backward functions).
- Otherwise (fp32, or bf16 weights via `training.dtype`): DDP with dp_replicate > 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torchtitan.config import TORCH_DTYPE_MAP
from torchtitan.distributed import ParallelDims
from torchtitan.models.llama3.infra.parallelize import (
    apply_ddp,
    apply_fsdp,
    disable_fsdp_gradient_division,
)
from torchtitan.tools.logging import logger

from boost_titan.config.precision import Precision
from boost_titan.runtime.compute_copies import apply_compute_copies
from boost_titan.runtime.device import force_sum_reductions, graphs_on_cuda
from boost_titan.runtime.titan_internals import one_rank_mesh


def _casts_without_fsdp(parallel_dims: ParallelDims, job_config) -> bool:
    """bf16 compute where `runtime.compute_copies` replaces FSDP2 (module docstring)."""
    training = job_config.training
    return (
        Precision.of(training).casts_for_compute
        and not training.enable_cpu_offload
        and not graphs_on_cuda(job_config)  # graphs replay FSDP2's casts
        and not (parallel_dims.fsdp_enabled or parallel_dims.dp_replicate_enabled)
        and not parallel_dims.pp_enabled
    )


@dataclass(frozen=True)
class FsdpUnits:
    """FSDP2's units of a model whose modules are not named as llama3's: its embedding,
    each block, and the final norm with the head (one unit), then the model itself."""

    embedding: nn.Module
    blocks: list[nn.Module]
    last: list[nn.Module]


def apply_fsdp_units(
    model: nn.Module, units: FsdpUnits, mesh, reshard_after_forward_policy: str, **fsdp
) -> None:
    """TorchTitan's llama3 `apply_fsdp` on `units` without PP (its resharding policy, its
    gradient sums); `fsdp`: `fully_shard`'s mp_policy and offload_policy."""
    if reshard_after_forward_policy not in ("default", "always", "never"):
        raise ValueError(f"Invalid reshard_after_forward_policy: {reshard_after_forward_policy}.")
    reshard = reshard_after_forward_policy != "never"  # "default" reshards without PP
    for unit in (units.embedding, *units.blocks):
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, **fsdp)
    last = reshard_after_forward_policy == "always"  # FSDP prefetches it for backward
    fully_shard(units.last, mesh=mesh, reshard_after_forward=last, **fsdp)
    fully_shard(model, mesh=mesh, **fsdp)
    disable_fsdp_gradient_division(model)


def apply_data_parallel(
    model: nn.Module,
    blocks: list[nn.Module],
    parallel_dims: ParallelDims,
    job_config,
    compile_model: bool,
    units: FsdpUnits | None = None,
) -> None:
    """FSDP2 / HSDP, compute copies or the 1-rank FSDP2 of mixed precision, or DDP (module
    docstring); `blocks` are the model's transformer blocks (the compute copies' units).
    FSDP2 is TorchTitan's llama3 `apply_fsdp` (it wraps `model.layers` and the
    `tok_embeddings` / `norm` / `output` it finds), or `apply_fsdp_units` on `units` for a
    model of other names (no PP)."""
    training = job_config.training
    replicate = parallel_dims.dp_replicate_enabled
    names = ["dp_replicate", "fsdp"] if replicate else ["fsdp"]
    if not parallel_dims.fsdp_enabled and not Precision.of(training).casts_for_compute:
        if replicate:
            apply_ddp(model, parallel_dims.get_mesh("dp_replicate"), enable_compile=compile_model)
        return
    if _casts_without_fsdp(parallel_dims, job_config):
        apply_compute_copies(model, TORCH_DTYPE_MAP[training.mixed_precision_param], blocks)
        logger.info(
            "Mixed precision without FSDP2 (nothing sharded): each fp32 weight cast once per "
            "step, gradients accumulated in fp32"
        )
        return
    sharded = parallel_dims.fsdp_enabled
    mesh = parallel_dims.get_mesh(names) if sharded else one_rank_mesh(parallel_dims, names)
    param_dtype = TORCH_DTYPE_MAP[training.mixed_precision_param]
    reduce_dtype = TORCH_DTYPE_MAP[training.mixed_precision_reduce]
    # a 1-rank shard dim has nothing to reshard (runtime.accumulation)
    policy = job_config.parallelism.fsdp_reshard_after_forward if sharded else "never"
    if units is not None:
        offload = {"offload_policy": CPUOffloadPolicy()} if training.enable_cpu_offload else {}
        mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
        apply_fsdp_units(model, units, mesh, policy, mp_policy=mp_policy, **offload)
    else:
        apply_fsdp(
            model,
            mesh,
            param_dtype=param_dtype,
            reduce_dtype=reduce_dtype,
            pp_enabled=parallel_dims.pp_enabled,
            cpu_offload=training.enable_cpu_offload,
            reshard_after_forward_policy=policy,
        )
    force_sum_reductions(model)  # gloo (CPU) has no PREMUL_SUM
    if replicate and not sharded:
        logger.info(
            "Applied HSDP with a 1-rank shard dim for mixed precision (gradients "
            f"all-reduced in {training.mixed_precision_reduce} over dp_replicate)"
        )
    elif not sharded:
        logger.info(
            "Applied FSDP2 on a 1-rank mesh for mixed precision (no collective; weights cast "
            "once per step outside CUDA graphs)"
        )
