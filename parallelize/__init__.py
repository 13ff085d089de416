"""Bottleneck-aware tensor parallelism (BTP) and its baselines as DTensor plans.

`styles` holds the ParallelStyles, `plans` the FQN -> style plans (reusable on any
torch-native model through `ModelLayout`), `norms` the sharded RMSNorms (online and sync),
`comm` the autograd-aware collectives, `compose` TorchTitan's parallelize function.
"""

from .plans import (
    BOOST_LAYOUT,
    ModelLayout,
    Plan,
    apply_plan,
    btp_plan,
    megatron_plan,
    vanilla_plan,
)
from .styles import (
    BottleneckNormedProjections,
    ColumnNormedProjections,
    ColumnParallel,
    Replicated,
    RowParallel,
    ShardedEmbedding,
    ShardedRMSNorm,
)

__all__ = [
    "BOOST_LAYOUT",
    "BottleneckNormedProjections",
    "ColumnNormedProjections",
    "ColumnParallel",
    "ModelLayout",
    "Plan",
    "Replicated",
    "RowParallel",
    "ShardedEmbedding",
    "ShardedRMSNorm",
    "apply_plan",
    "btp_plan",
    "megatron_plan",
    "vanilla_plan",
]
