"""Gradient accumulation that casts each weight once per optimizer step.

FSDP2's mixed-precision policy casts a unit's fp32 weights to bf16 whenever it unshards
them, and TorchTitan 0.2.2 reshards after every forward (without PP) and after every
backward: under gradient accumulation each weight was cast twice per micro-batch (8 times
per step at 4 micro-batches; 3,184 cast kernels of a 13,733-kernel step of CoLA 1B on an
H100). `Accumulation` sets FSDP2's switches before every micro-batch instead:

- On a 1-rank FSDP2 mesh (nothing sharded; which layouts: `runtime.data_parallel`) the
  bf16 copy stays from the first micro-batch's forward to the last one's backward
  (`reshard_after_forward = False` there, `set_reshard_after_backward` here) and the weight
  gradients accumulate unsharded in fp32 (FSDP2 upcasts each micro-batch's bf16 gradient
  into its fp32 accumulator), reduced once after the last micro-batch
  (`set_requires_gradient_sync`): one cast per weight per step; the copy costs 2 bytes per
  weight for the whole step.
- FSDP layouts (dp_shard or cp > 1) with `parallelism.fsdp_reshard_after_forward = "never"`
  keep the gathered weights across micro-batches too (one all-gather per step instead of
  two per micro-batch); their gradients are still reduce-scattered after every micro-batch,
  so gradient memory stays sharded. With "default"/"always" nothing changes.

`runtime.microbatches.FsdpSwitches` applies the policy in a run.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torch.distributed.fsdp import FSDPModule


@dataclass(frozen=True)
class Accumulation:
    """What stays unsharded across the micro-batches of one optimizer step."""

    keep_weights: bool
    """The bf16 (gathered) weights stay from the first forward to the last backward."""
    defer_reduction: bool
    """Gradients accumulate unsharded in fp32 and are reduced after the last micro-batch."""

    @classmethod
    def for_layout(cls, *, shards_weights: bool, reshard_policy: str) -> Accumulation:
        """The policy of an FSDP2 layout: `shards_weights` (dp_shard or cp > 1), and
        TorchTitan's `parallelism.fsdp_reshard_after_forward`."""
        if not shards_weights:
            return cls(keep_weights=True, defer_reduction=True)
        return cls(keep_weights=reshard_policy == "never", defer_reduction=False)

    @property
    def active(self) -> bool:
        return self.keep_weights or self.defer_reduction

    def before_microbatch(self, fsdp_modules: list[FSDPModule], index: int, count: int) -> None:
        """Set the switches of every FSDP2 module for micro-batch `index` of `count`: only
        the last one reshards and reduces."""
        last = index == count - 1
        for module in fsdp_modules:
            if self.keep_weights:
                module.set_reshard_after_backward(last, recurse=False)
            if self.defer_reduction:
                module.set_requires_gradient_sync(last, recurse=False)


def fsdp_modules(model_parts: list[nn.Module]) -> list[FSDPModule]:
    """Every FSDP2 module of the model parts (the blocks, the ends and each root)."""
    return [m for part in model_parts for m in part.modules() if isinstance(m, FSDPModule)]


__all__ = ["Accumulation", "fsdp_modules"]
