"""Context parallelism (CP): each rank of a CP group holds a shard of every sequence, and
attention runs torch's ring algorithm over the group (`_templated_ring_attention` and its
backward, `torch.distributed.tensor.experimental._context_parallel`).

- `shard_sequence(mesh, tensors, load_balance=True)`: a rank's shard of the tokens,
  labels and positions along dim 1 (positions [s] along dim 0), head-tail load balanced
  (rank r of n holds chunks r and 2n-1-r of 2n) as torch's `_HeadTailLoadBalancer`;
  `unshard_sequence` undoes it. The ring's causal masking must follow the same choice:
  run the forward and backward of the shards inside `load_balancing(load_balance)`, which
  sets torch's global CP option and restores it on exit.
- `apply_context_parallel(model, mesh, layout)`: inside the forward of each named module,
  `F.scaled_dot_product_attention` (causal, no mask) runs on the sequence-sharded q, k, v
  as DTensors `Shard(2)` on `mesh`, so DTensor dispatches its op to a ring handler: on CUDA
  torch's own (flash, efficient, cuDNN), on CPU `cpu_ring_handler` registered here for
  `aten._scaled_dot_product_flash_attention_for_cpu` and its backward. K/V travel as the
  model made them: grouped (GQA) K/V heads are not repeated, the CPU op takes them as they
  are. The model stays blind to CP: it takes the positions of its tokens as data (under
  the keyword `ModelLayout.positions`, required on every CP forward). The model's first
  CP forward runs the refusals of `cp_checks`; `cp_step.context_parallel_step` runs a
  training step on it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor.experimental._context_parallel import _attention as ring
from torch.overrides import TorchFunctionMode

from .cp_checks import (
    FirstForward,
    accepts_keyword,
    no_attention_called,
    positions_of,
    unread_positions,
)
from .plans import ModelLayout
from .styles import PlanError
from .torch_internals import add_dtensor_op_handlers, ring_merges_in_f32, set_cp_load_balance

aten = torch.ops.aten
SEQ_DIM = 2
"""The sequence dim of SDPA's [batch, heads, seq, head_dim] tensors (and of its
log-sum-exp [batch, heads, seq])."""

CPU_OPS = (
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
)
ATTENTION_OPS = frozenset(
    {
        CPU_OPS[0],
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
    }
)
"""The forward attention ops a ring handler runs (CPU here, CUDA torch's)."""


def runs_ring(func: Any, args: Sequence[Any]) -> bool:
    """Whether `func(*args)` is ring attention: an attention op on DTensors (sharded along
    the sequence), whose forward issues the ring's collectives."""
    return func in ATTENTION_OPS and any(isinstance(a, DTensor) for a in args)


def chunk_order(world_size: int, load_balance: bool) -> list[int]:
    """The 2 * world_size chunks of a sequence in the order of the ranks' shards: rank r
    holds chunks (r, 2n-1-r) under load balancing, else (2r, 2r+1)."""
    if not load_balance:
        return list(range(2 * world_size))
    return [c for r in range(world_size) for c in (r, 2 * world_size - 1 - r)]


def _sequence_dim(t: torch.Tensor, seq_dim: int) -> int:
    """The dim of `t` that runs along the sequence: `seq_dim`, or 0 for a 1-D tensor
    (positions [s], shared by every sequence of the batch)."""
    if t.dim() == 1:
        return 0
    if t.dim() <= seq_dim:
        raise PlanError(
            f"context parallelism shards along dim {seq_dim}, but a tensor has shape "
            f"{tuple(t.shape)}; pass [batch, seq, ...] (or [seq] positions)"
        )
    return seq_dim


def shard_sequence(
    mesh: DeviceMesh,
    tensors: Sequence[torch.Tensor],
    *,
    load_balance: bool = True,
    seq_dim: int = 1,
) -> list[torch.Tensor]:
    """This rank's shard of each tensor along `seq_dim` (a 1-D tensor, e.g. positions [s],
    along its only dim; module docstring). Run the model on the shards inside
    `load_balancing(load_balance)`."""
    world, rank = mesh.size(), mesh.get_local_rank()
    order = chunk_order(world, load_balance)
    mine = order[2 * rank : 2 * rank + 2]
    shards = []
    for t in tensors:
        dim = _sequence_dim(t, seq_dim)
        if t.shape[dim] % (2 * world):
            raise PlanError(
                f"sequence length {t.shape[dim]} is not divisible by 2 x CP degree ({2 * world})"
            )
        chunks = t.chunk(2 * world, dim=dim)
        shards.append(torch.cat([chunks[c] for c in mine], dim=dim))
    return shards


@contextlib.contextmanager
def load_balancing(load_balance: bool) -> Iterator[None]:
    """The ring's causal masking for shards cut with `load_balance` (torch's global CP
    option `enable_load_balance`, set for the block and restored after it)."""
    keep = ring._cp_options.enable_load_balance
    set_cp_load_balance(load_balance)
    try:
        yield
    finally:
        set_cp_load_balance(keep)


def unshard_sequence(
    shards: Sequence[torch.Tensor], *, load_balance: bool = True, seq_dim: int = 1
) -> torch.Tensor:
    """The whole sequence from every rank's shard (in rank order): `shard_sequence` undone."""
    order = chunk_order(len(shards), load_balance)
    dim = _sequence_dim(shards[0], seq_dim)
    chunks = [c for s in shards for c in s.chunk(2, dim=dim)]
    whole = [None] * len(chunks)
    for position, chunk in zip(order, chunks, strict=True):
        whole[position] = chunk
    return torch.cat(whole, dim=dim)


def _spec(mesh: DeviceMesh, local: torch.Tensor) -> DTensorSpec:
    """A tensor sharded along SEQ_DIM over `mesh`, evenly: its global meta from the local."""
    shape = list(local.shape)
    shape[SEQ_DIM] *= mesh.size()
    stride = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    meta = TensorMeta(torch.Size(shape), tuple(stride), local.dtype)
    return DTensorSpec(mesh, (Shard(SEQ_DIM),), tensor_meta=meta)


def _ring_forward(group, q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    return ring._templated_ring_attention(
        group,
        SEQ_DIM,
        CPU_OPS[0].overloadpacket,
        q,
        k,
        v,
        is_causal=is_causal,
        dropout_p=dropout_p,
        scale=scale,
    )


def _ring_backward(
    group, dout, q, k, v, out, lse, dropout_p, is_causal, *, attn_mask=None, scale=None
):
    return ring._templated_ring_attention_backward(
        group,
        SEQ_DIM,
        CPU_OPS[1].overloadpacket,
        dout,
        "grad_out",
        q,
        k,
        v,
        out,
        lse,
        is_causal=is_causal,
        dropout_p=dropout_p,
        scale=scale,
    )


def cpu_ring_handler(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> object:
    """DTensor's handler for the CPU flash-attention op and its backward on q/k/v sharded
    along the sequence: torch's ring algorithm on the local shards, merged in fp32 below
    fp64 (torch's `convert_to_f32`; fp64 stays fp64)."""
    dtensors = [a for a in args if isinstance(a, DTensor)]
    mesh = dtensors[0].device_mesh
    if kwargs.get("attn_mask") is not None or any(
        d.placements != (Shard(SEQ_DIM),) for d in dtensors
    ):
        raise NotImplementedError("context parallel attention takes no mask, q/k/v Shard(2)")
    local = [a.to_local() if isinstance(a, DTensor) else a for a in args]
    with ring_merges_in_f32(dtensors[0].dtype != torch.float64):
        run = _ring_forward if op == CPU_OPS[0] else _ring_backward
        results = run(mesh.get_group(), *local, **kwargs)
    return tuple(DTensor(r, _spec(mesh, r), requires_grad=False) for r in results)


def enable_ring_dispatch() -> None:
    """Route DTensor SDPA to the ring: torch's CUDA handlers, then the CPU ones here (torch's
    switch rebuilds the handler table, so the CPU ones are added after it)."""
    ring._enable_context_parallel_dispatcher()
    add_dtensor_op_handlers(dict.fromkeys(CPU_OPS, cpu_ring_handler))


@dataclass
class CPState:
    """What `apply_context_parallel` did to a model, for its forwards and
    `context_parallel_step`."""

    mesh: DeviceMesh
    positions: str
    """The keyword of the model's forward that takes each token's place in its sequence."""
    names: str
    """The attention patterns, for messages."""
    ring_depth: int = 0
    """How many named modules' forwards are running (SDPA in them runs the ring)."""
    ring_off: bool = False
    """The named modules run their own forward (the unsharded reference of `verify`)."""
    checked: bool = False
    """The first CP forward passed the checks of `cp_checks`."""
    verified: bool = False


APPLIED: weakref.WeakKeyDictionary[nn.Module, CPState] = weakref.WeakKeyDictionary()
"""Each model `apply_context_parallel` ran on -> its state."""


class _RingSDPA(TorchFunctionMode):
    """Within a module's forward: `F.scaled_dot_product_attention` on q, k, v sharded
    along the sequence over `mesh` (as DTensors, so the op reaches the ring handlers);
    counts the calls."""

    def __init__(self, mesh: DeviceMesh) -> None:
        super().__init__()
        self.mesh = mesh
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        self.calls += 1
        q, k, v, *rest = args
        causal = kwargs.get("is_causal", rest[2] if len(rest) > 2 else False)
        mask = kwargs.get("attn_mask", rest[0] if rest else None)
        if mask is not None or not causal:
            raise PlanError(
                "context parallelism runs causal scaled_dot_product_attention without "
                "attn_mask; this model passes "
                + ("a mask" if mask is not None else "is_causal=False")
            )
        placement = [Shard(SEQ_DIM)]
        q, k, v = (DTensor.from_local(t, self.mesh, placement, run_check=False) for t in (q, k, v))
        return func(q, k, v, *rest, **kwargs).to_local()


def _ring_forward_of(module: nn.Module, name: str, state: CPState) -> Callable[..., Any]:
    forward = module.forward

    @functools.wraps(forward)
    def ring_forward(*args: Any, **kwargs: Any) -> Any:
        if state.ring_off:
            return forward(*args, **kwargs)
        mode = _RingSDPA(state.mesh)
        state.ring_depth += 1
        try:
            with mode:
                out = forward(*args, **kwargs)
        finally:
            state.ring_depth -= 1
        if not mode.calls:
            raise no_attention_called(name)
        return out

    return ring_forward


def _checked_forward_of(model: nn.Module, state: CPState) -> Callable[..., Any]:
    """The model's forward, given its shard's positions; the first one under `FirstForward`."""
    forward = model.forward
    signature = inspect.signature(forward)

    @functools.wraps(forward)
    def checked_forward(*args: Any, **kwargs: Any) -> Any:
        positions = positions_of(model, signature, state.positions, args, kwargs)
        if state.checked or state.ring_off:
            return forward(*args, **kwargs)
        mode = FirstForward(positions, lambda: state.ring_depth > 0, state.names)
        with mode:
            out = forward(*args, **kwargs)
        if not mode.positions_read:
            raise unread_positions(model, state.positions)
        state.checked = True
        return out

    return checked_forward


ROTATE_METHODS = ("allgather", "alltoall")
"""How the ring moves K/V (torch's `set_rotate_method`): one all-gather of every shard, or
an all-to-all per step."""


def apply_context_parallel(
    model: nn.Module, mesh: DeviceMesh, layout: ModelLayout, *, rotate: str = "allgather"
) -> int:
    """Run a decoder's causal attention as ring attention over the sequence shards of `mesh`.

    The SDPA calls in the forward of the modules `layout.attention` names in every block
    run torch's ring algorithm. The model's forward then requires its shard's positions
    (keyword `layout.positions`); its first forward refuses, in one line, what would
    train silently wrong (`cp_checks`): SDPA run outside the named modules, a named
    module that calls no SDPA (attention written by hand), positions no operation reads.
    `context_parallel_step` runs a training step on it.

    Args:
        model (nn.Module): the decoder (after any TP plan), changed in place.
        mesh (DeviceMesh): the 1-D CP mesh.
        layout (ModelLayout): names the attention modules (`attention`, relative to a
            block; ``""`` is the block itself) and the positions keyword (`positions`).
        rotate (str): how the ring moves K/V, one of ROTATE_METHODS. Default:
            ``"allgather"``.

    Returns:
        int: how many modules run ring attention.

    Raises:
        PlanError: an unknown `rotate`, a forward without the positions keyword, a pattern
            that matches no module, or CP already applied to the model.

    Example::

        >>> import torch.distributed as dist
        >>> from torch.distributed.device_mesh import init_device_mesh
        >>> from boost_titan.examples.own_model import LAYOUT, Decoder
        >>> from boost_titan.parallelize import apply_context_parallel
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> mesh = init_device_mesh("cpu", (1,))  # under torchrun: ("cuda", (cp,))
        >>> LAYOUT.attention, LAYOUT.positions
        (('attn',), 'positions')
        >>> apply_context_parallel(Decoder(), mesh, LAYOUT)  # one per block
        4
        >>> dist.destroy_process_group()
    """
    if rotate not in ROTATE_METHODS:
        raise PlanError(f"unknown rotate method {rotate!r}; choose one of {ROTATE_METHODS}")
    if model in APPLIED:
        raise PlanError(
            f"context parallelism is already applied to this {type(model).__name__}; apply it once"
        )
    if not accepts_keyword(model.forward, layout.positions):
        raise PlanError(
            f"context parallelism needs {type(model).__name__}.forward to take "
            f"`{layout.positions}` (each token's place in its sequence, for RoPE): a rank "
            "holds a shard of it; name its keyword in ModelLayout.positions"
        )
    patterns = [layout.blocks if a == "" else f"{layout.blocks}.{a}" for a in layout.attention]
    state = CPState(mesh, layout.positions, ", ".join(patterns))
    names = dict(model.named_modules())
    matched = {}
    for pattern in patterns:
        found = [n for n in names if _matches(pattern, n)]
        if not found:
            raise PlanError(
                f"context parallelism: no module matches {pattern!r}; name the modules whose "
                "forward calls F.scaled_dot_product_attention in ModelLayout.attention"
            )
        matched |= dict.fromkeys(found)
    for name in matched:
        names[name].forward = _ring_forward_of(names[name], name, state)
    model.forward = _checked_forward_of(model, state)
    APPLIED[model] = state
    ring.set_rotate_method(rotate)
    enable_ring_dispatch()
    return len(matched)


def _matches(pattern: str, name: str) -> bool:
    parts, names = pattern.split("."), name.split(".")
    if len(parts) != len(names):
        return False
    return all(p in ("*", n) for p, n in zip(parts, names, strict=True))
