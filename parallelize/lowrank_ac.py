"""Communication-free low-rank activation checkpointing (BOOST §5).

Each transformer block is checkpointed as one region with selective-checkpoint contexts
whose policy keeps only the bottleneck latents:

  * under TP, the outputs of the forward collectives (`_c10d_functional.*`): in BTP these
    are the replicated, post-all-reduce latents [3r+1], [r], [2r+1], [r] per token;
  * without TP (no collectives), the down-projection GEMM outputs: `mm`/`addmm` results
    of width r, 2r or 3r that do not contract over r (which leaves out the up-projections
    and LaX's r x r crossing).

Together with the block input (the previous block's B_down + residual, which checkpoint
keeps) these are the boundaries of the segments [B_down(prev) + residual + norm + A_qkv],
[B_qkv + RoPE + attention + A_o], [B_o + residual + norm + A_gate/up] and [B_gate/up +
multiply + A_down]. Backward recomputes what lies between from them (norms, B GEMMs, RoPE,
attention, products; not B_down, see below) and replays no forward collective, so it
issues exactly the collectives it issues without checkpointing.

In eager mode a GEMM whose output only feeds a cached collective (BTP's row-parallel
partial products A_i x_i, possibly through `cat`) is not recomputed either: after the
forward its recompute entry becomes an uninitialised placeholder of its layout, since the
collective returns its cached output whatever its input. The same holds for a GEMM whose
output only feeds residual adds that nothing in the block reads and whose results leave
the block (B_down under TP: its column-parallel autograd Function saves its input only
after its GEMM, so checkpoint would rerun that GEMM before it could stop). torch.compile's
partitioner drops such dead recomputation by itself, so compiled blocks use the plain
policy, with one addition under TP: ops that draw random numbers (the attention kernel is
tagged so, dropout or not) are saved, not recomputed. In torch 2.13 AOT autograd appends
the RNG state of a recomputed random op after the DTensor meshes it passes from forward
to backward, then reads its saved values at the wrong offsets and fails; saving the
attention output (and its log-sum-exp) per layer avoids it. `compilable_full_ac` gives
TorchTitan's whole-block AC the same rule when it is compiled under TP.

With `tp_strategy = "vanilla"` the same mechanism applies and stays communication-free,
but vanilla's collectives sit at the full output dims (5d + 2 d_ff per token), so it saves
far more than BTP; TorchTitan's `[activation_checkpoint]` modes remain available there.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    checkpoint_wrapper,
)
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten
from torch.utils.checkpoint import (
    CheckpointPolicy,
    SelectiveCheckpointContext,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from .context_parallel import runs_ring

aten = torch.ops.aten
GEMMS = frozenset({aten.mm.default, aten.addmm.default})
# ops whose autograd saves none of their inputs: a residual add may end a skipped chain
_SINKS = frozenset({aten.add.Tensor})
# ops whose autograd saves nothing of their inputs: a skipped chain may pass through them
_PASS_THROUGH = frozenset({aten.cat.default, aten.clone.default})
_SKIPPABLE = GEMMS | _PASS_THROUGH


def down_widths(rank: int, tp_degree: int) -> frozenset[int]:
    """Output widths of the down-projection GEMMs to keep: r, 2r, 3r without TP (grouped
    gate/up and q/k/v), none under TP (there the post-all-reduce latents are kept)."""
    return frozenset({rank, 2 * rank, 3 * rank}) if tp_degree == 1 else frozenset()


def _is_collective(func: Any) -> bool:
    return getattr(func, "namespace", None) == "_c10d_functional"


def lowrank_policy(
    widths: frozenset[int], ctx: SelectiveCheckpointContext, func, *args, **kwargs
) -> CheckpointPolicy:
    """MUST_SAVE collective outputs, ring attention's output and log-sum-exp (context
    parallelism: recomputing it would replay the ring) and down-projection GEMM outputs
    (of a width in `widths`, not contracting over the rank); recompute the rest."""
    if _is_collective(func) or runs_ring(func, args):
        return CheckpointPolicy.MUST_SAVE
    if func in GEMMS and widths:
        out, mat2 = ctx.op_output, args[-1]
        if out.shape[-1] in widths and mat2.shape[0] != min(widths):
            return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def draws_random_numbers(func: Any) -> bool:
    """Ops tagged as seeded by the RNG (dropout, the attention kernels)."""
    return torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())


def compiled_lowrank_policy(
    widths: frozenset[int],
    save_random: bool,
    ctx: SelectiveCheckpointContext,
    func,
    *args,
    **kwargs,
) -> CheckpointPolicy:
    """`lowrank_policy` for compiled blocks; with `save_random` (under TP) ops that draw
    random numbers are saved too (see the module doc)."""
    if save_random and draws_random_numbers(func):
        return CheckpointPolicy.MUST_SAVE
    return lowrank_policy(widths, ctx, func, *args, **kwargs)


def _save_random_ops(ctx: SelectiveCheckpointContext, func, *args, **kwargs) -> CheckpointPolicy:
    return (
        CheckpointPolicy.MUST_SAVE
        if draws_random_numbers(func)
        else CheckpointPolicy.PREFER_RECOMPUTE
    )


def compilable_full_ac(wrapper: nn.Module) -> None:
    """Make a whole-block checkpoint wrapper (TorchTitan's `full` or layer-selective AC)
    compilable under TP in torch 2.13: it saves the outputs of random ops (the attention
    kernel) and recomputes everything else (see the module doc)."""
    context_fn = functools.partial(create_selective_checkpoint_contexts, _save_random_ops)
    wrapper.checkpoint_fn = functools.partial(wrapper.checkpoint_fn, context_fn=context_fn)


def _storage(t: torch.Tensor) -> torch.UntypedStorage | None:
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


def _storage_key(t: torch.Tensor) -> int | None:
    storage = _storage(t)
    return None if storage is None else storage._cdata


def _is_view(func: Any) -> bool:
    """Ops whose output shares its input's storage (`_unsafe_view` hides it from autograd)."""
    schema = func._schema
    aliases = any(r.alias_info is not None for r in schema.returns)
    return func is aten._unsafe_view.default or (aliases and not schema.is_mutable)


class _Placeholder:
    """Stands in for a skipped op's output in the SAC cache: an uninitialised tensor with
    the output's layout, which only flows into other skipped ops or a cached collective."""

    def __init__(self, t: torch.Tensor) -> None:
        self.size, self.stride, self.dtype, self.device = t.shape, t.stride(), t.dtype, t.device

    def get_val(self, allow_cache_entry_mutation: bool) -> torch.Tensor:
        return torch.empty_strided(self.size, self.stride, dtype=self.dtype, device=self.device)


_COLLECTIVE, _OTHER = -1, -2
"""Consumer ids that are not candidate ops: a cached collective, anything else. A sink
(`_SINKS`) k has the id `_sink_id(k)`."""


def _sink_id(k: int) -> int:
    return -3 - k


@dataclass
class _Sink:
    """An op that saves none of its inputs; a dead end when nothing in the block reads its
    output and that output leaves the block."""

    storages: frozenset[int]
    read: bool = False


@dataclass
class _Candidate:
    """A GEMM or pass-through op whose recomputation may be skipped."""

    func: Any
    index: int
    placeholder: _Placeholder
    storages: frozenset[int]
    consumers: list[int] = field(default_factory=list)


class _DataFlow:
    """Forward-time data flow of one checkpointed call (at storage level), used to turn
    the recomputation of GEMMs that only feed cached collectives into placeholders."""

    def __init__(self, widths: frozenset[int]) -> None:
        self.widths = widths
        self.mode = None
        self.candidates: list[_Candidate] = []
        self.producer: dict[int, int] = {}
        self.sinks: list[_Sink] = []
        self.sink_of: dict[int, int] = {}
        # weak references keep storage ids unique (no address reuse) until finalize
        self.seen: list[StorageWeakRef] = []

    def contexts(self):
        forward, recompute = create_selective_checkpoint_contexts(self.policy)
        self.mode = forward
        return forward, recompute

    def policy(self, ctx, func, *args, **kwargs) -> CheckpointPolicy:
        decision = lowrank_policy(self.widths, ctx, func, *args, **kwargs)
        if _is_view(func):
            return decision
        out = ctx.op_output
        candidate = func in _SKIPPABLE and isinstance(out, torch.Tensor)
        sink = func in _SINKS and isinstance(out, torch.Tensor)
        me = (
            len(self.candidates)
            if candidate
            else _sink_id(len(self.sinks))
            if sink
            else _COLLECTIVE
            if _is_collective(func)
            else _OTHER
        )
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        for key in map(_storage_key, tensors):
            if key in self.producer:
                self.candidates[self.producer[key]].consumers.append(me)
            if key in self.sink_of:
                self.sinks[self.sink_of[key]].read = True
        if func._schema.is_mutable:
            return decision
        storages = [_storage(t) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        storages = [s for s in storages if s is not None]
        self.seen += map(StorageWeakRef, storages)
        keys = {s._cdata for s in storages}
        for key in keys:
            self.producer.pop(key, None)
            self.sink_of.pop(key, None)
        if sink:
            self.sink_of.update(dict.fromkeys(keys, len(self.sinks)))
            self.sinks.append(_Sink(frozenset(keys)))
        if candidate:
            index = self.mode.func_counter[func] - 1
            self.candidates.append(_Candidate(func, index, _Placeholder(out), frozenset(keys)))
            self.producer.update(dict.fromkeys(keys, me))
        return decision

    def finalize(self, outputs: Any) -> None:
        """Replace the recompute entries of candidates whose outputs only feed cached
        collectives or dead-end sinks (directly or through skipped pass-through ops) by
        placeholders."""
        escaped = {_storage_key(t) for t in tree_leaves(outputs) if isinstance(t, torch.Tensor)}
        dead_ends = {
            _sink_id(k)
            for k, sink in enumerate(self.sinks)
            if not sink.read and sink.storages and sink.storages <= escaped
        }
        skipped: set[int] = set()
        for i in reversed(range(len(self.candidates))):
            op = self.candidates[i]
            if (
                op.consumers
                and not op.storages & escaped
                and all(
                    c == _COLLECTIVE
                    or c in dead_ends
                    or (c in skipped and self.candidates[c].func in _PASS_THROUGH)
                    for c in op.consumers
                )
            ):
                skipped.add(i)
                self.mode.storage[op.func][op.index] = op.placeholder
        self.candidates.clear()
        self.producer.clear()
        self.sinks.clear()
        self.sink_of.clear()
        self.seen.clear()


def lowrank_checkpoint(
    module: nn.Module, *args, widths: frozenset[int], tp_degree: int = 1, **kwargs
):
    """Run `module` under low-rank selective checkpointing (tensors in nested arguments,
    such as LaX latents, are passed to checkpoint as top-level inputs)."""
    flat, spec = tree_flatten((args, kwargs))

    def run(*flat_args):
        run_args, run_kwargs = tree_unflatten(list(flat_args), spec)
        return module(*run_args, **run_kwargs)

    if torch.compiler.is_compiling():
        policy = functools.partial(compiled_lowrank_policy, widths, tp_degree > 1)
        context_fn = functools.partial(create_selective_checkpoint_contexts, policy)
        return checkpoint(run, *flat, use_reentrant=False, context_fn=context_fn)
    flow = _DataFlow(widths)
    out = checkpoint(run, *flat, use_reentrant=False, context_fn=flow.contexts)
    flow.finalize(out)
    return out


def apply_lowrank_ac(
    model: nn.Module, *, rank: int, tp_degree: int, blocks: str = "layers"
) -> None:
    """Wrap every child of the container `blocks` (the transformer blocks) in low-rank
    activation checkpointing (in place, after TP and before compile / FSDP, like
    TorchTitan's `apply_ac`). `rank`: the projections' bottleneck rank."""
    layers = model.get_submodule(blocks)
    widths = down_widths(rank, tp_degree)
    for layer_id, block in layers.named_children():
        wrapped = checkpoint_wrapper(
            block, checkpoint_fn=lowrank_checkpoint, widths=widths, tp_degree=tp_degree
        )
        layers.register_module(layer_id, wrapped)
