"""What the one-process and gloo-rank tests of the plans on foreign models share: each
strategy's plan, a batch, the loss, and swapping a model's block class."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from boost_titan.parallelize import ModelLayout, btp_plan, megatron_plan, vanilla_plan
from tests.helpers import foreign_models as fm

BUILDERS = {"btp": btp_plan, "vanilla": vanilla_plan, "megatron": megatron_plan}
NORMED_LAYOUT = dataclasses.replace(fm.PLAIN_LAYOUT, crossing=("norm",))
"""PLAIN_LAYOUT for `fm.with_normed_latents` models: their latent norms listed as crossing."""


def plan_for(layout: ModelLayout, strategy: str, **options):
    """The plan of `strategy` for `layout`."""
    return BUILDERS[strategy](layout, **options)


def tokens(batch: int = 2, seq: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of one fixed random batch."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, fm.CONFIG["vocab"], (batch, seq + 1), generator=generator)
    return ids[:, :-1], ids[:, 1:]


def loss_of(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def swap_blocks(model: nn.Module, cls: type) -> nn.Module:
    """Make every block of `model` a `cls` (a subclass of its block class)."""
    for block in model.blocks:
        block.__class__ = cls
    return model
