"""Bottleneck-aware tensor parallelism (BTP) and its baselines as DTensor plans, for any
torch-native decoder.

A model-free library: it imports torch, `boost_titan.kernels` and its own modules only.
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
the attention modules a layout names, sequence sharding with head-tail load balancing),
`compile_cache` (compile cache keys that name the rank),
`float8` (which per-rank GEMMs of an applied plan run in float8: `apply_float8`), `debug`
(`record_collectives`: every collective a piece of code issues, checked against torch's
`CommDebugMode`). Hugging Face models (transformers imported lazily): `hf` (`hf_layout`),
`hf_guards` (one-line errors for what a sharded HF model cannot do),
`low_rank` (`to_low_rank`: down/up pairs with SVD init), `hf_checkpoint` (`save_hf` /
`load_hf` as a HF folder, `save_sharded` / `load_sharded` with DCP). Processes and files:
`safe_load` (a DCP checkpoint's pickles through one allowlist: loading never runs code from
the files), `dcp_layout` (what a checkpoint's `.metadata` says, checked: types, files inside
the folder, tensor bytes as declared), `teardown` (the orderly end of a process in a process
group), `local_ranks` (`run_on_ranks`: a function on N local gloo ranks).
"""

from .compile_cache import key_compile_caches_by_rank
from .describe import plan_table
from .group_members import GroupMember, GroupUp
from .group_norms import BottleneckGroupNorm, ReplicatedGroupNorm
from .groups import NormGroup
from .hf import hf_layout
from .hf_checkpoint import load_hf, load_sharded, save_hf, save_sharded
from .low_rank import LowRankLinear, to_low_rank
from .plans import (
    ModelLayout,
    Plan,
    apply_plan,
    btp_plan,
    megatron_plan,
    resolve_plan,
    vanilla_plan,
)
from .styles import (
    ColumnParallel,
    HeadNorm,
    PlanError,
    Replicated,
    RowParallel,
    ShardedEmbedding,
    ShardedRMSNorm,
)
from .verify import verify_plan

__all__ = [
    "BottleneckGroupNorm",
    "ColumnParallel",
    "GroupMember",
    "GroupUp",
    "HeadNorm",
    "LowRankLinear",
    "ModelLayout",
    "NormGroup",
    "Plan",
    "PlanError",
    "Replicated",
    "ReplicatedGroupNorm",
    "RowParallel",
    "ShardedEmbedding",
    "ShardedRMSNorm",
    "apply_plan",
    "btp_plan",
    "hf_layout",
    "key_compile_caches_by_rank",
    "load_hf",
    "load_sharded",
    "megatron_plan",
    "plan_table",
    "resolve_plan",
    "save_hf",
    "save_sharded",
    "to_low_rank",
    "vanilla_plan",
    "verify_plan",
]
