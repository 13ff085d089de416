"""Bottleneck-aware tensor parallelism (BTP) and its baselines as DTensor plans, for any
torch-native decoder.

A model-free library that stands alone: it imports torch, `boost_titan.kernels` and its own
modules only (a checkout of `parallelize/` and `kernels/` alone imports every module).
Describe where a model keeps its modules with a `ModelLayout`, build a plan
(`btp_plan`, `vanilla_plan`, `megatron_plan`: FQN -> ParallelStyle) and apply it with
`apply_plan`, which checks the plan against the model first (`verify=True` also compares
one step with an unsharded copy). `plan_table` prints what a plan does to each module.

Modules: `plans` (layouts, plan builders, apply), `styles` (single-module styles),
`groups` (a pre-norm and the consumers it feeds, as one unit; its styles in `group_norms`
and `group_members`), `group_check` (first-forward check of how the model uses a group's
output), `verify`, `describe`, `norms` (sharded RMSNorms, online and sync), `comm`
(autograd-aware collectives), `lowrank_ac` (low-rank
activation checkpointing), `context_parallel` (context parallelism: ring attention on
the attention modules a layout names, sequence sharding with head-tail load balancing;
`apply_context_parallel`), `cp_checks` (its first-forward refusals), `cp_step`
(`context_parallel_step`: a training step's sharding, loss divisor and gradient sum),
`compile_cache` (compile cache keys that name the rank),
`float8` (which per-rank GEMMs of an applied plan run in float8: `apply_float8`), `debug`
(`record_collectives`: every collective a piece of code issues, checked against torch's
`CommDebugMode`). Hugging Face models (transformers imported lazily): `hf` (`hf_layout`),
`hf_guards` (one-line errors for what a sharded HF model cannot do),
`low_rank` (`to_low_rank`: down/up pairs with SVD init), `hf_checkpoint` (`save_hf` /
`load_hf` as a HF folder). `torch_internals`: every write to torch's own modules, classes
and settings that this library makes. A sharded model's DCP checkpoint (`save_sharded` /
`load_sharded`) is `boost_titan.checkpoint.sharded`'s.
"""

import importlib

_EXPORTS = {
    "BottleneckGroupNorm": "group_norms",
    "ColumnParallel": "styles",
    "GroupMember": "group_members",
    "GroupUp": "group_members",
    "HeadNorm": "styles",
    "LowRankLinear": "low_rank",
    "ModelLayout": "plans",
    "NormGroup": "groups",
    "Plan": "plans",
    "PlanError": "styles",
    "Replicated": "styles",
    "ReplicatedGroupNorm": "group_norms",
    "RowParallel": "styles",
    "ShardedEmbedding": "styles",
    "ShardedRMSNorm": "styles",
    "apply_context_parallel": "context_parallel",
    "apply_plan": "plans",
    "btp_plan": "plans",
    "context_parallel_step": "cp_step",
    "hf_layout": "hf",
    "key_compile_caches_by_rank": "compile_cache",
    "load_hf": "hf_checkpoint",
    "megatron_plan": "plans",
    "plan_table": "describe",
    "resolve_plan": "plans",
    "save_hf": "hf_checkpoint",
    "to_low_rank": "low_rank",
    "vanilla_plan": "plans",
    "verify_plan": "verify",
}
"""Each public name -> the module that defines it, imported on first use (PEP 562), so that
importing one torch-free module of the library (`norm_modes`) does not import torch."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
