"""One context-parallel training step of a whole batch: what a CP loop must otherwise do by
hand (`context_parallel_step`).

Every rank of the CP mesh gets the same whole batch (checked: one all-reduce of a
fingerprint per step); it shards tokens, labels and positions along the sequence, sums
its shard's loss, divides by the batch's token count (not the shard's), backpropagates,
and sums the gradients this step produced over the CP group, so that each rank holds the
gradient of the batch's mean loss. `verify=True` first compares the CP forward with the
unsharded forward of the same batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from .context_parallel import (
    APPLIED,
    CPState,
    load_balancing,
    shard_sequence,
    unshard_sequence,
)
from .styles import PlanError
from .verify import _logits, _relative_error

VERIFY_RTOL = {torch.float64: 1e-9, torch.float32: 1e-4}
"""verify's largest relative error of the logits by dtype (others: 2e-2)."""


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def summed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy summed over the tokens whose label is not -100, in fp32 at least."""
    logits = logits.flatten(0, -2).to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits, labels.flatten(), reduction="sum")


def _state(model: nn.Module) -> CPState:
    state = APPLIED.get(model)
    if state is None:
        raise PlanError(
            f"context_parallel_step: {type(model).__name__} has no context parallelism; call "
            "apply_context_parallel(model, mesh, layout) first (without it every rank "
            "attends over its own shard alone)"
        )
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        raise PlanError(
            "context_parallel_step sums the gradients over the CP group itself; FSDP would "
            "reduce them again: shard the model with TP only, or use the trainer"
        )
    return state


def _check_batch(tokens: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor) -> None:
    seq = tokens.shape[1] if tokens.dim() > 1 else -1
    if tokens.dim() != 2 or labels.shape != tokens.shape:
        raise PlanError(
            f"context_parallel_step takes tokens and labels [batch, seq] of one shape, got "
            f"{tuple(tokens.shape)} and {tuple(labels.shape)}"
        )
    if positions.shape not in ((seq,), tokens.shape):
        raise PlanError(
            f"context_parallel_step: positions of shape {tuple(positions.shape)} for tokens "
            f"{tuple(tokens.shape)}; pass [seq] or [batch, seq]"
        )


def _gather_sequence(state: CPState, local: torch.Tensor, load_balance: bool) -> torch.Tensor:
    shards = [torch.empty_like(local) for _ in range(state.mesh.size())]
    dist.all_gather(shards, local.contiguous(), group=state.mesh.get_group())
    return unshard_sequence(shards, load_balance=load_balance)


def _check_same_batch(state: CPState, tensors: tuple[torch.Tensor, ...]) -> None:
    """PlanError when the ranks of the CP group passed different batches (each would train
    on a mix of shards of different sequences): one all-reduce of two integers."""
    fingerprint = torch.zeros(1, dtype=torch.int64, device=tensors[0].device)
    for t in tensors:
        flat = t.reshape(-1).long()
        weights = torch.arange(flat.numel(), device=flat.device) % 1_000_003 + 1
        fingerprint += (flat * weights).sum()
    both = torch.cat([fingerprint, -fingerprint])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=state.mesh.get_group())
    if both[0] != -both[1]:
        raise PlanError(
            "context_parallel_step: the ranks of the CP group passed different batches; "
            "every rank of a CP group passes the same whole batch (give them one data seed "
            "and shard data over data-parallel ranks only)"
        )


@torch.no_grad()
def _verify(
    model: nn.Module,
    state: CPState,
    shards: list[torch.Tensor],
    whole: tuple[torch.Tensor, torch.Tensor],
    load_balance: bool,
) -> None:
    """PlanError when the CP forward of the shards, gathered, differs from the unsharded
    forward of the whole batch (both in eval mode: no dropout)."""
    training = model.training
    model.eval()
    try:
        local = model(shards[0], **{state.positions: shards[2]})
        got = _gather_sequence(state, _full(_logits(local)), load_balance)
        state.ring_off = True
        want = _full(_logits(model(whole[0], **{state.positions: whole[1]})))
    finally:
        state.ring_off = False
        model.train(training)
    error = _relative_error(got, want)
    rtol = VERIFY_RTOL.get(want.dtype, 2e-2)
    if not error <= rtol:
        raise PlanError(
            f"context_parallel_step verify: the CP forward differs from the unsharded one by "
            f"{error:.1e} (relative, tolerance {rtol:.0e}); the model mixes tokens outside "
            "SDPA in the named attention modules, or does not place them by "
            f"`{state.positions}` (see parallelize.cp_checks)"
        )
    state.verified = True


def _sum_new_grads(model: nn.Module, state: CPState, run: Callable[[], None]) -> None:
    """Run `run` (a backward) and sum the gradients it produced over the CP group; gradients
    accumulated before are kept as they were (each step's are summed once)."""
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        run()
        new = [_local(p.grad) for p in params if p.grad is not None]
        if state.mesh.size() > 1 and new:
            for dtype in {g.dtype for g in new}:
                same = [g for g in new if g.dtype == dtype]
                flat = torch.cat([g.reshape(-1) for g in same])
                dist.all_reduce(flat, group=state.mesh.get_group())
                for g, part in zip(same, flat.split([g.numel() for g in same]), strict=True):
                    g.copy_(part.view_as(g))
    finally:
        for p, old in zip(params, before, strict=True):
            if old is not None:
                p.grad = old if p.grad is None else p.grad + old


def context_parallel_step(
    model: nn.Module,
    tokens: torch.Tensor,
    labels: torch.Tensor,
    *,
    positions: torch.Tensor | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = summed_cross_entropy,
    divisor: float | None = None,
    load_balance: bool = True,
    verify: bool = False,
) -> torch.Tensor:
    """One CP forward and backward of a whole batch on a model `apply_context_parallel` ran on.

    Every rank of the CP mesh passes the same whole batch. The step shards tokens, labels
    and positions along the sequence (`shard_sequence`), runs the model on its shard,
    divides the shard's summed loss by `divisor` (the batch's token count, not the
    shard's), backpropagates, and sums the gradients this step produced over the CP
    group: each rank then holds the gradient of the batch's mean loss, and gradients
    accumulated by earlier calls are kept (call it per micro-batch, step the optimizer
    after). Not for FSDP-sharded models (FSDP reduces gradients itself).

    Args:
        model (nn.Module): the model, after `apply_context_parallel`.
        tokens (torch.Tensor): the whole batch's input ids [batch, seq]; seq divisible by
            2 x the CP degree.
        labels (torch.Tensor): the whole batch's targets [batch, seq] (-100: not scored).
        positions (torch.Tensor | None): each token's place in its sequence, [seq] or
            [batch, seq]. Default: ``arange(seq)``.
        loss_fn (Callable): (logits, labels) -> the loss SUMMED over the tokens.
            Default: `summed_cross_entropy`.
        divisor (float | None): what the summed loss is divided by (pass the whole
            optimizer step's count when accumulating micro-batches). Default: the batch's
            labels that are not -100 (at least 1).
        load_balance (bool): head-tail load balancing of the shards. Default: True.
        verify (bool): the model's first verified step first runs, in eval mode and
            without gradients, the CP forward of the shards and the unsharded forward of
            the whole batch (the ring off) and compares the logits: one line when they
            differ, e.g. positions read but not used for RoPE, tokens mixed outside the
            named attention. Costs a forward of the whole sequence. Default: False.

    Returns:
        torch.Tensor: the batch's mean loss (detached), the same on every CP rank.

    Raises:
        PlanError: no `apply_context_parallel` on the model, an FSDP model, a batch of the
            wrong shapes, CP ranks that passed different batches, a sequence not divisible
            by 2 x CP, a refusal of the first CP forward (`cp_checks`), or a `verify`
            mismatch.

    Example::

        >>> import torch
        >>> import torch.distributed as dist
        >>> from torch.distributed.device_mesh import init_device_mesh
        >>> from boost_titan.examples.own_model import LAYOUT, VOCAB, Decoder
        >>> from boost_titan.parallelize import apply_context_parallel, context_parallel_step
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> mesh = init_device_mesh("cpu", (1,))  # under torchrun: ("cuda", (cp,))
        >>> model = Decoder()
        >>> _ = apply_context_parallel(model, mesh, LAYOUT)
        >>> batch = torch.randint(0, VOCAB, (2, 17))
        >>> loss = context_parallel_step(model, batch[:, :-1], batch[:, 1:], verify=True)
        >>> 4.5 < loss.item() < 7.5, model.lm_head.weight.grad is not None
        (True, True)
        >>> dist.destroy_process_group()
    """
    state = _state(model)
    if positions is None:
        positions = torch.arange(tokens.shape[-1], device=tokens.device)
    _check_batch(tokens, labels, positions)
    if divisor is None:
        divisor = (labels != -100).sum().clamp_min(1).item()
    if state.mesh.size() > 1:
        _check_same_batch(state, (tokens, labels, positions))
    mine = shard_sequence(state.mesh, (tokens, labels, positions), load_balance=load_balance)
    outputs: list[torch.Tensor] = []

    def forward_backward() -> None:
        logits = model(mine[0], **{state.positions: mine[2]})
        loss = loss_fn(_logits(logits), mine[1]) / divisor
        loss.backward()
        outputs.append(_full(loss).detach())

    with load_balancing(load_balance):
        if verify and not state.verified:
            _verify(model, state, mine, (tokens, positions), load_balance)
        _sum_new_grads(model, state, forward_backward)
    loss = outputs[0].clone()
    if state.mesh.size() > 1:
        dist.all_reduce(loss, group=state.mesh.get_group())
    return loss
