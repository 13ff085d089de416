"""The micro-batch protocol of a run: what happens around the micro-batches of one step.

`boost_llama.data_parallel.apply_data_parallel` picks one per model (its module docstring
holds the table of which layout takes which path) and attaches it as
`model.microbatch_protocol`; the trainer, `bench memory` (`bench.measure.memtrack`) and
`tests/unit/test_accumulation.py` call it the same way:

    protocol.start_step()
    for i in range(n):
        protocol.before_microbatch(i, n)
        ...forward, loss and backward of micro-batch i...
    protocol.end_step()
"""

from __future__ import annotations

from torch.distributed.fsdp import FSDPModule

from boost_titan.runtime.accumulation import Accumulation
from boost_titan.runtime.compute_copies import ComputeCopies


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


__all__ = ["FsdpSwitches", "HeldCopies", "MicrobatchProtocol"]
