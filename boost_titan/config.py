"""The `[boost]` TOML section, merged into TorchTitan's JobConfig.

Loaded through `--job.custom_config_module boost_titan.config`, which `boost_titan.train`
adds by itself. TorchTitan requires the module to define a dataclass named `JobConfig`
whose fields are the new sections.
"""

from dataclasses import dataclass, field

ARCHS = ("fullrank", "svd", "cola", "lax")
LAX_BASES = ("svd", "cola")
TP_STRATEGIES = ("auto", "btp", "vanilla", "megatron")
RMSNORM_MODES = ("online", "sync")


@dataclass
class Boost:
    arch: str = "cola"
    """Projection family: fullrank | svd | cola | lax."""

    rank: int = 0
    """Bottleneck rank r of every low-rank projection (0 = the flavor's default, d/4)."""

    lax_base: str = "cola"
    """For arch = lax: the underlying low-rank layer, cola (with SiLU) or svd (none)."""

    tp_strategy: str = "auto"
    """Tensor-parallel plan: auto (btp for low-rank, megatron for fullrank) | btp | vanilla | megatron."""

    rmsnorm: str = "online"
    """RMSNorm in front of BTP down-projections: online (statistic rides the down all-reduce) | sync."""

    group_linears: bool = True
    """Run q/k/v and gate/up down-projections as one GEMM and one all-reduce each."""

    lowrank_ac: bool = False
    """Low-rank activation checkpointing: save only the bottleneck latents, recompute the rest."""


@dataclass
class JobConfig:
    boost: Boost = field(default_factory=Boost)
