"""Record the collectives a piece of code issues: kind, payload shape and dtype, phase.

`record_collectives()` runs `CollectiveRecorder` (a TorchDispatchMode that sees every
collective op on plain tensors, including those DTensor desugars into) together with
torch's `CommDebugMode`, whose per-kind counts the recorder's must match. A payload is
the tensor each rank hands to the collective (for an all-gather the local shard, for a
reduce-scatter the full unreduced tensor), so its bytes are `numel * itemsize`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.utils._python_dispatch import TorchDispatchMode

_COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d_functional", "c10d")
_KINDS = {
    "all_reduce": "all_reduce",
    "allreduce": "all_reduce",
    "all_gather": "all_gather",
    "allgather": "all_gather",
    "reduce_scatter": "reduce_scatter",
}
_NOT_COLLECTIVES = ("wait_tensor", "_wrap_tensor_autograd", "barrier", "monitored_barrier")


def collective_kind(op_name: str) -> str | None:
    """all_reduce / all_gather / reduce_scatter (or the op's own name for other
    collectives) for a c10d op name like ``all_reduce_`` or ``_allgather_base_``;
    None for ops that move no data (waits, wrappers, barriers)."""
    if op_name in _NOT_COLLECTIVES:
        return None
    base = op_name.strip("_")
    for prefix, kind in _KINDS.items():
        if base.startswith(prefix):
            return kind
    return base


@dataclass(frozen=True)
class CollectiveCall:
    """One collective as one rank issued it."""

    kind: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    backward: bool

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def elements_per_token(self, tokens: int) -> int:
        if self.numel % tokens:
            raise ValueError(f"payload {self.shape} is not a whole number of {tokens} tokens")
        return self.numel // tokens


_C10D_IN_PLACE = {"allreduce_", "allreduce_coalesced_", "broadcast_", "reduce_"}
"""c10d ops whose first argument is their input; the others take (outputs, inputs)."""


def _payload(func, args: tuple) -> torch.Tensor:
    """The input tensor of a collective; c10d ops take (nested) lists of tensors."""
    in_place = func._overloadpacket.__name__ in _C10D_IN_PLACE
    arg = args[0] if func.namespace != "c10d" or in_place else args[1]
    while isinstance(arg, (list, tuple)):
        arg = arg[0]
    return arg


class CollectiveRecorder(TorchDispatchMode):
    """Appends a `CollectiveCall` to `calls` for every collective dispatched on plain
    tensors. DTensor ops are passed through first (NotImplemented), so the collectives
    they desugar into are seen too. `backward` is set for calls made by the autograd
    engine."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[CollectiveCall] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            return NotImplemented
        if getattr(func, "namespace", None) in _COLLECTIVE_NAMESPACES:
            kind = collective_kind(func._overloadpacket.__name__)
            if kind is not None:
                tensor = _payload(func, args)
                backward = torch._C._current_graph_task_id() != -1
                self.calls.append(CollectiveCall(kind, tuple(tensor.shape), tensor.dtype, backward))
        return func(*args, **kwargs)


@dataclass
class CollectiveLog:
    """What `record_collectives` saw: the recorder's calls and CommDebugMode's counts."""

    calls: list[CollectiveCall] = field(default_factory=list)
    debug_counts: Counter[str] = field(default_factory=Counter)

    @property
    def forward(self) -> list[CollectiveCall]:
        return [c for c in self.calls if not c.backward]

    @property
    def backward(self) -> list[CollectiveCall]:
        return [c for c in self.calls if c.backward]

    def counts(self) -> Counter[str]:
        """The recorder's calls per kind."""
        return Counter(c.kind for c in self.calls)


@contextmanager
def record_collectives() -> Iterator[CollectiveLog]:
    """Record collectives with `CollectiveRecorder` and count them with `CommDebugMode`;
    on exit, raise if the two disagree on the number of collectives of any kind."""
    log = CollectiveLog()
    recorder = CollectiveRecorder()
    with CommDebugMode() as debug, recorder:
        yield log
    log.calls = recorder.calls
    for op, count in debug.get_comm_counts().items():
        kind = collective_kind(op.__name__)
        if kind is not None:
            log.debug_counts[kind] += count
    if log.counts() != log.debug_counts:
        raise AssertionError(
            f"recorder saw {dict(log.counts())}, CommDebugMode {dict(log.debug_counts)}"
        )
