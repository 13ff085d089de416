"""The TrainSpec's parallelize function: TP plan -> CP -> activation checkpointing -> compile ->
FSDP2 / DDP, in TorchTitan's order, configured from the job's TOML (as TorchTitan's
`models/llama3/infra/parallelize.py`). `apply_ac_mode` applies the same activation
checkpointing by mode name, for the measurements (`activation_memory`, `bench memory`)."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torchtitan.config.job_config import ActivationCheckpoint
from torchtitan.distributed import ParallelDims
from torchtitan.distributed.activation_checkpoint import apply_ac
from torchtitan.models.llama3.infra.parallelize import apply_compile
from torchtitan.tools.logging import logger

from boost_titan.config import AC_MODES
from boost_titan.config.errors import ConfigError
from boost_titan.parallelize import apply_plan, key_compile_caches_by_rank
from boost_titan.parallelize.lowrank_ac import apply_lowrank_ac, compilable_full_ac
from boost_titan.runtime.context_parallel import apply_cp
from boost_titan.runtime.data_parallel import apply_data_parallel
from boost_titan.runtime.job_float8 import apply_job_float8
from boost_titan.runtime.titan_internals import selective_ac_saves

from .strategies import boost_layout, build_plan, resolve_strategy

# selective AC keeps collectives' outputs, so recomputation never replays a collective
_SAC_SAVE = selective_ac_saves() | {
    torch.ops._c10d_functional.all_reduce.default,
    torch.ops._c10d_functional.all_gather_into_tensor.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def parallelize_boost(model: nn.Module, parallel_dims: ParallelDims, job_config) -> nn.Module:
    """Apply TP, activation checkpointing, torch.compile and data parallelism (the trainer
    reads its micro-batch protocol from the built layout: `runtime.microbatches`)."""
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
        details += f", all-reduces in {boost.overlap_chunks} overlapped blocks" * (
            boost.overlap_chunks > 1
        )
        logger.info(f"Applied {strategy} tensor parallelism (TP={parallel_dims.tp}{details})")
    if parallel_dims.cp_enabled:
        count = apply_cp(model, parallel_dims.get_mesh("cp"), boost_layout(model.args), job_config)
        logger.info(f"Applied context parallelism (CP={parallel_dims.cp}) to {count} attentions")
    apply_job_float8(model, job_config)  # on the plan's per-rank GEMMs, before AC and compile

    compile_model = job_config.compile.enable and "model" in job_config.compile.components
    apply_checkpointing(
        model,
        job_config.activation_checkpoint,
        lowrank=boost.lowrank_ac,
        tp_degree=parallel_dims.tp,
        compile_model=compile_model,
        base_folder=job_config.job.dump_folder,
    )
    if job_config.compile.enable:  # TorchTitan compiles the loss too (`compile.components`)
        key_compile_caches_by_rank(*parallel_dims.get_all_one_dimensional_meshes().values())
    if compile_model:
        apply_compile(model, job_config.compile)

    apply_data_parallel(
        model, list(model.layers.values()), parallel_dims, job_config, compile_model
    )
    return model


def apply_checkpointing(
    model: nn.Module,
    ac: ActivationCheckpoint,
    *,
    lowrank: bool,
    tp_degree: int,
    compile_model: bool = False,
    base_folder: str = "",
) -> None:
    """TorchTitan's AC for `ac.mode` != "none" (op-level selective AC saves `_SAC_SAVE`),
    else BOOST's low-rank AC when `lowrank`; blocks checkpointed whole stay compilable
    under TP."""
    if ac.mode != "none":
        apply_ac(
            model,
            ac,
            model_compile_enabled=compile_model,
            op_sac_save_list=_SAC_SAVE,
            base_folder=base_folder,
        )
        whole_blocks = ac.mode == "full" or ac.selective_ac_option != "op"  # full or by layer
        if compile_model and tp_degree > 1 and whole_blocks:
            for block in model.layers.values():
                if isinstance(block, CheckpointWrapper):
                    compilable_full_ac(block)
    elif lowrank:
        apply_lowrank_ac(model, rank=model.args.effective_rank, tp_degree=tp_degree)
        logger.info("Applied low-rank activation checkpointing to the model")


def apply_ac_mode(model: nn.Module, mode: str, *, tp_degree: int) -> None:
    """Wrap `model.layers` as the trainer would for `mode` (one of AC_MODES; selective is
    op-level, saving `_SAC_SAVE`, which includes the CPU flash-attention op, so attention
    is saved as it is on GPU)."""
    if mode not in AC_MODES:
        raise ConfigError(f"unknown AC mode {mode!r}; choose one of {', '.join(AC_MODES)}")
    lowrank = mode == "lowrank"
    config = ActivationCheckpoint(mode="none" if lowrank else mode, selective_ac_option="op")
    apply_checkpointing(model, config, lowrank=lowrank, tp_degree=tp_degree)
