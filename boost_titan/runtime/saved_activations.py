"""The activation bytes a forward keeps for backward, measured on real (or fake) tensors.

`saved_activation_bytes(fn)` runs a forward and returns the bytes it keeps for backward:
every distinct storage (counted once, whatever views share it) that autograd saved
(`saved_tensors_hooks`) or that an op created and is still alive when `fn` returns (the
selective-checkpoint caches, whose tensors bypass the hooks). Parameters and buffers of
`exclude` and the returned tensors (unless saved) are not activations.
`PeakSavedActivations` follows the training forwards of a step (the trainer logs its
peak); `boost_titan.activation_memory` applies the same measurement to one block offline.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    is_traceable_wrapper_subclass,
)
from torch.utils._pytree import tree_leaves


# ---- saved-activation bytes ----------------------------------------------------------
def _storages(t: torch.Tensor) -> list[torch.UntypedStorage]:
    """The storages holding a tensor's data: a wrapper subclass's (DTensor, async
    collective results) are its inner tensors'."""
    if is_traceable_wrapper_subclass(t):
        attrs, _ = t.__tensor_flatten__()
        inner = [getattr(t, a) for a in attrs]
        return [s for x in inner if isinstance(x, torch.Tensor) for s in _storages(x)]
    try:
        return [t.untyped_storage()]
    except (RuntimeError, NotImplementedError):  # tensors without storage
        return []


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


# Eager these return their input; under fake tensors their output has a storage of its own.
_ALIASING_COMM = {
    torch.ops._c10d_functional.wait_tensor.default,
    torch.ops._c10d_functional._wrap_tensor_autograd.default,
}


class _StorageLog(TorchDispatchMode):
    """Weak references to the storages that ops create or autograd saves, grouped by the
    allocation they belong to (with their aliases)."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, list[StorageWeakRef]] = {}
        self.alias: dict[int, int] = {}
        self.saved: set[int] = set()
        self.parameters: set[int] = set()

    def key(self, storage: torch.UntypedStorage) -> int:
        return self.alias.get(storage._cdata, storage._cdata)

    def keys(self, tensors: list[torch.Tensor]) -> set[int]:
        return {self.key(s) for t in tensors for s in _storages(t)}

    def add(self, t: torch.Tensor, saved: bool = False) -> None:
        for storage in _storages(t):
            self.refs.setdefault(self.key(storage), []).append(StorageWeakRef(storage))
            if saved:
                self.saved.add(self.key(storage))

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        self.add(t, saved=True)
        return t

    def alive_bytes(self, ignore: set[int]) -> int:
        """Current size of the logged storages still alive, except `ignore` and FSDP's
        buffers (a storage resized to 0, such as a resharded parameter's, counts 0)."""
        total = 0
        for key, refs in self.refs.items():
            if key in ignore or key in self.parameters:
                continue
            alive = (torch.UntypedStorage._new_with_weak_ptr(r.cdata) for r in refs)
            storage = next((s for s in alive if s is not None), None)
            total += 0 if storage is None else storage.nbytes()
        return total

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _ALIASING_COMM:
            source = self.key(_storages(args[0])[0])
            self.alias.update((s._cdata, source) for t in _tensors(out) for s in _storages(t))
        tensors = _tensors(out)
        for t in tensors:
            self.add(t)
        if func.namespace == "fsdp":  # FSDP's all-gather buffers hold parameters
            self.parameters |= self.keys(_tensors((args, kwargs)) + tensors)
        return out


def saved_activation_bytes(
    fn: Callable[[], Any], *, exclude: nn.Module | None = None, track_ops: bool = True
) -> int:
    """Bytes of distinct storages that the forward `fn()` keeps alive for backward.

    Call it on a forward only (no backward inside `fn`); the graph is freed on return.
    Parameters and buffers of `exclude` do not count, nor do `fn`'s returned tensors
    unless autograd saved them. Eager selective-checkpoint caches are found by tracking
    op outputs; torch.compile refuses that dispatch mode, so pass `track_ops=False` when
    the blocks are compiled (compiled regions save everything through autograd, which the
    hooks see). Buffers that FSDP's ops (`torch.ops.fsdp.*`) fill or read are parameters,
    not activations; an unsharded parameter counts 0 once resharded (storage freed).
    """
    log = _StorageLog()
    out = _logged(log, fn, track_ops)
    state = [] if exclude is None else [*exclude.parameters(), *exclude.buffers()]
    returned = log.keys(_tensors(out)) - log.saved
    return log.alive_bytes(log.keys(state) | returned)


def _logged(log: _StorageLog, fn: Callable[[], Any], track_ops: bool) -> Any:
    """`fn()` with its saved tensors (and op outputs, if `track_ops`) logged; garbage
    collected after, so only what the graph and caches hold stays alive."""
    tracking = log if track_ops else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(log.pack, lambda t: t), tracking:
        out = fn()
    gc.collect()
    return out


class PeakSavedActivations:
    """Peak bytes that the training forwards of `modules` keep for backward, while
    `watching()` is on (e.g. one training step, with forwards and backwards interleaved
    as in a pipeline schedule).

    The forwards are the calls of each module's `forward`, or of the `(object, method)`
    pairs in `calls` (a pipeline stage's `forward_one_chunk`: per micro-batch, unlike
    its submodule's forward, which the stage also runs once to infer metadata). Each one
    made with grad enabled is measured as in `saved_activation_bytes`, over the storages
    logged during all the forwards so far: afterwards, the bytes still alive that were
    saved by autograd or created by an op (selective-checkpoint caches), except the
    modules' current parameters and buffers, FSDP's all-gather buffers and the forwards'
    outputs (unless saved). Backward frees activations, so the largest of these values
    is the peak. The hooks and the dispatch mode are thread-local: forwards must run in
    the thread that calls them (pipeline schedules do).
    """

    def __init__(
        self,
        modules: list[nn.Module],
        *,
        calls: list[tuple[Any, str]] | None = None,
        track_ops: bool = True,
    ) -> None:
        self.modules = modules
        self.calls = [(m, "forward") for m in modules] if calls is None else calls
        self.track_ops = track_ops
        self.peak = 0
        self.log = _StorageLog()
        self.returned: set[int] = set()

    def _forward(self, forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # e.g. validation
            return forward(*args, **kwargs)
        out = _logged(self.log, functools.partial(forward, *args, **kwargs), self.track_ops)
        self.returned |= self.log.keys(_tensors(out))
        state = [t for m in self.modules for t in (*m.parameters(), *m.buffers())]
        ignore = self.log.keys(state) | (self.returned - self.log.saved)
        self.peak = max(self.peak, self.log.alive_bytes(ignore))
        return out

    @contextlib.contextmanager
    def watching(self) -> Iterator[PeakSavedActivations]:
        """Measure the forwards (the methods are wrapped meanwhile)."""
        previous = [owner.__dict__.get(name) for owner, name in self.calls]
        for owner, name in self.calls:
            setattr(owner, name, functools.partial(self._forward, getattr(owner, name)))
        try:
            yield self
        finally:
            for (owner, name), method in zip(self.calls, previous, strict=True):
                if method is None:
                    delattr(owner, name)  # the class's method again
                else:
                    setattr(owner, name, method)
            self.log = _StorageLog()
            self.returned = set()
