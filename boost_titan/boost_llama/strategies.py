"""The tensor-parallel strategies of `boost_llama`: the one registry that the config check,
the parallelize function, the benchmarks and the performance model read.

`boost_layout(args)` says where `BoostTransformer` keeps the modules the plans shard;
`build_plan` turns a strategy into the plan of `boost_titan.parallelize` for a model. The
registry itself loads without torch (the performance model reads it); the plan builders
are imported on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from boost_titan.config.errors import ConfigError

from .archs import architecture
from .shapes import ModelShape

if TYPE_CHECKING:
    from boost_titan.parallelize import ModelLayout, Plan


@dataclass(frozen=True)
class Strategy:
    """A TP plan for our model family."""

    name: str
    low_rank: bool
    """Trains a low-rank arch (svd, cola, lax); else the fullrank one."""
    divisible: tuple[str, ...]
    """Sizes (names of `sizes`) the TP degree must divide."""
    builder_name: str
    """The plan builder's name in `boost_titan.parallelize`."""
    summary: str

    @property
    def builder(self) -> Callable[..., Plan]:
        """`boost_titan.parallelize.<builder_name>`: (layout, **options) -> Plan."""
        return getattr(importlib.import_module("boost_titan.parallelize"), self.builder_name)


_HEADS = ("n_heads", "n_kv_heads", "ffn_dim", "vocab_size")

STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            "megatron",
            False,
            _HEADS,
            "megatron_plan",
            "full-rank Megatron TP (column q/k/v/gate/up, row o/down)",
        ),
        Strategy(
            "vanilla",
            True,
            (*_HEADS, "rank"),
            "vanilla_plan",
            "naive low-rank TP (A column along r, B row)",
        ),
        Strategy(
            "btp",
            True,
            (*_HEADS, "dim"),
            "btp_plan",
            "bottleneck-aware TP (A row + all-reduce at r, B column)",
        ),
    )
}
"""Baseline first: megatron, vanilla, btp."""

AUTO = "auto"
"""[boost] tp_strategy = "auto": btp for low-rank archs, megatron for fullrank."""


def sizes(args: ModelShape) -> dict[str, int]:
    """The model's sizes a strategy may shard, by their [boost] / flavor names."""
    return {
        "dim": args.dim,
        "n_heads": args.n_heads,
        "n_kv_heads": args.kv_heads,
        "ffn_dim": args.ffn_dim,
        "vocab_size": args.vocab_size,
        "rank": args.effective_rank,
    }


def strategy_names(*, auto: bool = False) -> tuple[str, ...]:
    return (AUTO, *STRATEGIES) if auto else tuple(STRATEGIES)


def resolve_strategy(arch: str, name: str) -> Strategy:
    """The strategy `name` stands for (`auto` -> the architecture's default: btp for
    low-rank archs, megatron for full rank); ConfigError for an unknown name or one that
    does not fit the arch."""
    family = architecture(arch)
    if name == AUTO:
        name = family.default_strategy
    if name not in STRATEGIES:
        raise ConfigError(
            f"unknown [boost] tp_strategy {name!r}; choose one of "
            f"{', '.join(strategy_names(auto=True))}"
        )
    strategy = STRATEGIES[name]
    if strategy.low_rank != family.low_rank:
        fits = [f'"{s.name}"' for s in STRATEGIES.values() if s.low_rank == family.low_rank]
        needs = "a low-rank arch" if strategy.low_rank else "a full-rank arch"
        raise ConfigError(
            f"tp_strategy {name} needs {needs}, but arch is {arch}; use tp_strategy = "
            f'{" or ".join(fits)} (or "auto")'
        )
    return strategy


def boost_layout(args: ModelShape) -> ModelLayout:
    """Where `BoostTransformer` keeps the modules the plans shard (the layout's defaults
    name them); the architecture's latent modules (LaX's crossing) are replicated, and an
    architecture that hands every latent to the next block lets its ups reduce their own
    grads."""
    from boost_titan.parallelize import ModelLayout

    arch = args.architecture
    return ModelLayout(
        head_dim=args.head_dim,
        crossing=arch.latent_modules,
        defer_latent_grads=not arch.carries_latents,
    )


def build_plan(
    strategy: str,
    args: ModelShape,
    *,
    rmsnorm: str = "online",
    group_linears: bool = True,
    loss_parallel: bool = True,
) -> Plan:
    """The TP plan of a `BoostTransformer` with `args` under `strategy` (a registry name)."""
    options = {"group_linears": group_linears, "loss_parallel": loss_parallel}
    if strategy == "btp":
        options["rmsnorm"] = rmsnorm
    return STRATEGIES[strategy].builder(boost_layout(args), **options)
