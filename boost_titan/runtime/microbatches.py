"""The micro-batch protocol of a run: what happens around the micro-batches of one step.

The trainer picks it once, from the parallel layout the TrainSpec's `parallelize_fn` built
(`protocol_for`; no attribute of the model is read, so any TrainSpec's model runs):

| the built layout | protocol |
|---|---|
| a pipeline stage | none (the schedule defers resharding and reduction itself) |
| compute copies (`runtime.compute_copies`) | `HeldCopies` |
| FSDP2 modules, CUDA graphs on CUDA | `FsdpSwitches`, resharding and reducing every micro-batch |
| FSDP2 modules | `FsdpSwitches` with `Accumulation.for_layout` (dp_shard or cp > 1 shards) |
| anything else (no data parallelism, DDP) | none |

Which of these our model gets is `runtime.data_parallel`'s choice (its module
docstring holds the table of layouts); TorchTitan's own models apply FSDP2 or DDP
themselves. The trainer, `bench memory` (`bench.measure.memtrack`) and
`tests/unit/test_accumulation.py` call a protocol the same way:

    protocol.start_step()
    for i in range(n):
        protocol.before_microbatch(i, n)
        ...forward, loss and backward of micro-batch i...
    protocol.end_step()
"""

from __future__ import annotations

from torch import nn
from torch.distributed.fsdp import FSDPModule

from boost_titan.runtime.accumulation import Accumulation, fsdp_modules
from boost_titan.runtime.compute_copies import ComputeCopies, compute_copies_of
from boost_titan.runtime.device import graphs_on_cuda


class MicrobatchProtocol:
    """Nothing around the micro-batches: layouts without FSDP2 or compute copies (fp32
    without sharding, DDP) and pipeline stages (their schedule defers resharding and
    reduction to a stage's last backward itself)."""

    def start_step(self) -> None:
        """Before a step's first micro-batch: undo what happened since the last step."""

    def before_microbatch(self, index: int, count: int) -> None:
        """Before the forward of micro-batch `index` of `count`."""

    def end_step(self) -> None:
        """After the step's last backward, before clipping: the gradients are complete."""


class FsdpSwitches(MicrobatchProtocol):
    """FSDP2's reshard and reduce switches, set before every micro-batch by `accumulation`."""

    def __init__(self, modules: list[FSDPModule], accumulation: Accumulation) -> None:
        self.modules = modules
        self.accumulation = accumulation

    def start_step(self) -> None:
        # an eager forward since the last step (validation) may have left weights unsharded
        for module in self.modules:
            module.reshard()

    def before_microbatch(self, index: int, count: int) -> None:
        self.accumulation.before_microbatch(self.modules, index, count)


class HeldCopies(MicrobatchProtocol):
    """The compute copies (`runtime.compute_copies`), held from a step's first forward to
    its last backward."""

    def __init__(self, copies: ComputeCopies) -> None:
        self.copies = copies

    def start_step(self) -> None:
        self.copies.end_step()  # a step that raised mid-way left the copies in place

    def before_microbatch(self, index: int, count: int) -> None:
        self.copies.before_microbatch(index, count)

    def end_step(self) -> None:
        self.copies.end_step()  # the masters' gradients are complete


def casts_itself(model_parts: list[nn.Module]) -> bool:
    """Whether the built layout casts weights for compute itself (compute copies or FSDP2's
    mixed-precision policy); elsewhere a TorchTitan model gets TorchTitan's autocast."""
    return any(map(compute_copies_of, model_parts)) or bool(fsdp_modules(model_parts))


def protocol_for(model_parts: list[nn.Module], parallel_dims, job_config) -> MicrobatchProtocol:
    """The protocol of the layout `model_parts` were built with (module docstring's table):
    `parallel_dims` says whether it is a pipeline stage and whether FSDP2 shards weights."""
    if parallel_dims.pp_enabled:
        return MicrobatchProtocol()
    copies = [c for c in map(compute_copies_of, model_parts) if c is not None]
    if copies:
        (held,) = copies  # compute copies only where there is no PP: one model part
        return HeldCopies(held)
    modules = fsdp_modules(model_parts)
    if not modules:
        return MicrobatchProtocol()
    if graphs_on_cuda(job_config):  # a replay does the same work every micro-batch
        return FsdpSwitches(modules, Accumulation(keep_weights=False, defer_reduction=False))
    accumulation = Accumulation.for_layout(
        shards_weights=parallel_dims.fsdp_enabled,
        reshard_policy=job_config.parallelism.fsdp_reshard_after_forward,
    )
    return FsdpSwitches(modules, accumulation)


__all__ = ["FsdpSwitches", "HeldCopies", "MicrobatchProtocol", "casts_itself", "protocol_for"]
