"""The TrainSpec's parallelize function: TP plan -> activation checkpointing -> compile ->
FSDP2 / DDP, in TorchTitan's order, configured from the job's TOML (as TorchTitan's
`models/llama3/infra/parallelize.py`)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torchtitan.config import TORCH_DTYPE_MAP
from torchtitan.distributed import ParallelDims
from torchtitan.distributed.activation_checkpoint import apply_ac
from torchtitan.models.llama3.infra.parallelize import (
    _op_sac_save_list,
    apply_compile,
    apply_ddp,
    apply_fsdp,
)
from torchtitan.tools.logging import logger

from boost_titan.parallelize import apply_plan
from boost_titan.parallelize.lowrank_ac import apply_lowrank_ac, compilable_full_ac
from boost_titan.runtime.device import force_sum_reductions

from .strategies import build_plan, resolve_strategy

# selective AC keeps collectives' outputs, so recomputation never replays a collective
_SAC_SAVE = _op_sac_save_list | {
    torch.ops._c10d_functional.all_reduce.default,
    torch.ops._c10d_functional.all_gather_into_tensor.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def _rank_own_compile_cache() -> None:
    """Give this rank its own Inductor cache folder. In torch 2.13 the compiled graphs of
    different TP groups get the same cache key although their collectives name different
    process groups (pytorch/pytorch#176532), so a rank could load another group's graph and
    fail with "Could not resolve the process group registered under the name N"."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir(), f"rank{dist.get_rank()}")


def parallelize_boost(model: nn.Module, parallel_dims: ParallelDims, job_config) -> nn.Module:
    """Apply TP, activation checkpointing, torch.compile and data parallelism."""
    boost = job_config.boost
    if parallel_dims.tp_enabled:
        strategy = resolve_strategy(boost.arch, boost.tp_strategy).name
        plan = build_plan(
            strategy,
            model.args,
            rmsnorm=boost.rmsnorm,
            group_linears=boost.group_linears,
            loss_parallel=not job_config.parallelism.disable_loss_parallel,
        )
        apply_plan(model, parallel_dims.get_mesh("tp"), plan, overlap_chunks=boost.overlap_chunks)
        details = f", {boost.rmsnorm} RMSNorm" * (strategy == "btp")
        details += f", grouping {boost.group_linears}"
        details += f", all-reduces in {boost.overlap_chunks} overlapped blocks" * (boost.overlap_chunks > 1)
        logger.info(f"Applied {strategy} tensor parallelism (TP={parallel_dims.tp}{details})")

    compile_model = job_config.compile.enable and "model" in job_config.compile.components
    ac = job_config.activation_checkpoint
    if ac.mode != "none":
        apply_ac(
            model,
            ac,
            model_compile_enabled=compile_model,
            op_sac_save_list=_SAC_SAVE,
            base_folder=job_config.job.dump_folder,
        )
        whole_blocks = ac.mode == "full" or ac.selective_ac_option != "op"  # full or by layer
        if compile_model and parallel_dims.tp_enabled and whole_blocks:
            for block in model.layers.values():
                if isinstance(block, CheckpointWrapper):
                    compilable_full_ac(block)
    elif boost.lowrank_ac:
        apply_lowrank_ac(model, rank=model.args.effective_rank, tp_degree=parallel_dims.tp)
        logger.info("Applied low-rank activation checkpointing to the model")
    if compile_model:
        if parallel_dims.tp_enabled and parallel_dims.world_size > parallel_dims.tp:
            _rank_own_compile_cache()
        apply_compile(model, job_config.compile)

    if parallel_dims.fsdp_enabled:
        names = ["dp_replicate", "fsdp"] if parallel_dims.dp_replicate_enabled else ["fsdp"]
        training = job_config.training
        apply_fsdp(
            model,
            parallel_dims.get_mesh(names),
            param_dtype=TORCH_DTYPE_MAP[training.mixed_precision_param],
            reduce_dtype=TORCH_DTYPE_MAP[training.mixed_precision_reduce],
            pp_enabled=parallel_dims.pp_enabled,
            cpu_offload=training.enable_cpu_offload,
            reshard_after_forward_policy=job_config.parallelism.fsdp_reshard_after_forward,
        )
        force_sum_reductions(model)  # gloo (CPU) has no PREMUL_SUM
    elif parallel_dims.dp_replicate_enabled:
        apply_ddp(model, parallel_dims.get_mesh("dp_replicate"), enable_compile=compile_model)
    return model

