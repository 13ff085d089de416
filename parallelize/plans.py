"""Tensor-parallel plans: plain mappings FQN -> ParallelStyle.

A plan is built from a `ModelLayout` that names the modules it touches, so any
torch-native model can reuse it by naming its own modules (FQNs may use `*`). Apply a plan
with `apply_plan`, which resolves every key strictly and checks that no parameter was
left undistributed.

Per block (T tokens, forward all-reduce payload per token; backward mirrors it):

  =========  =============================================  ===========================
  plan       layout                                         forward all-reduces
  =========  =============================================  ===========================
  megatron   column q,k,v,gate,up; row o,down; replicated   2 of d
  vanilla    every A column (along r), every B row          q,k,v,o,down at d_out;
                                                            gate,up at d_ff (5d+2d_ff)
  btp        every A row + all-reduce at r, every B column  3r+1, r, 2r+1, r (grouped,
             residual sharded along d                       online norm): 7r+2
  =========  =============================================  ===========================
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from .styles import (
    BottleneckNormedProjections,
    ColumnNormedProjections,
    ColumnParallel,
    Replicated,
    RowParallel,
    ShardedEmbedding,
    ShardedRMSNorm,
)

Plan = dict[str, ParallelStyle]


@dataclass(frozen=True)
class ModelLayout:
    """Where a decoder keeps the modules a plan shards (FQNs; `blocks` may use `*`).

    `shared_inputs` maps each pre-norm (relative to a block) to the projections that
    consume its output; `own_inputs` lists the projections with an input of their own.
    `fused_norms` says the norms are `NormedProjections`-like: called with their projections,
    so a style can fuse the norm with the down-projections and group their collectives.
    Low-rank projections have `.down` / `.up` children (LaX adds `.cross`, `.latent_norm`).
    """

    blocks: str = "layers.*"
    shared_inputs: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: {
            "attention_norm": ("attention.wq", "attention.wk", "attention.wv"),
            "ffn_norm": ("feed_forward.w1", "feed_forward.w3"),
        }
    )
    own_inputs: tuple[str, ...] = ("attention.wo", "feed_forward.w2")
    embedding: str = "tok_embeddings"
    final_norm: str = "norm"
    head: str = "output"
    fused_norms: bool = True


BOOST_LAYOUT = ModelLayout()


def _head(*, reduce_input_grad: bool, loss_parallel: bool) -> ColumnParallel:
    """Vocab-parallel lm_head: DTensor Shard(-1) logits for loss-parallel CE, or gathered."""
    return ColumnParallel(
        reduce_input_grad=reduce_input_grad,
        output_dtensor=loss_parallel,
        gather_output=not loss_parallel,
    )


def _crossing(projection: str) -> Plan:
    return {f"{projection}.cross": Replicated(), f"{projection}.latent_norm": Replicated()}


def megatron_plan(layout: ModelLayout = BOOST_LAYOUT, *, loss_parallel: bool = True) -> Plan:
    """Full-rank Megatron TP: the residual stream is replicated; two all-reduces of d per
    block forward (after o and down) and two backward (the norm outputs' grads)."""
    plan: Plan = {
        layout.embedding: Replicated(),
        layout.final_norm: Replicated(),
        layout.head: _head(reduce_input_grad=True, loss_parallel=loss_parallel),
    }
    fused = layout.fused_norms
    for norm, projections in layout.shared_inputs.items():
        plan[f"{layout.blocks}.{norm}"] = ColumnNormedProjections() if fused else Replicated()
        for p in projections:
            plan[f"{layout.blocks}.{p}"] = ColumnParallel(reduce_input_grad=not fused)
    for p in layout.own_inputs:
        plan[f"{layout.blocks}.{p}"] = RowParallel()
    return plan


def vanilla_plan(
    layout: ModelLayout = BOOST_LAYOUT, *, crossing: bool = False, loss_parallel: bool = True
) -> Plan:
    """Naive low-rank TP: each A column-parallel along r, each B row-parallel, so every
    low-rank projection ends in an all-reduce at its full output dim. The residual stream
    and q/k/v are replicated (attention runs on all heads on every rank). With LaX
    crossing the latents are all-gathered (the r x r crossing and LayerNorm_r need them
    whole) and each B takes its slice back."""
    plan: Plan = {
        layout.embedding: Replicated(),
        layout.final_norm: Replicated(),
        layout.head: _head(reduce_input_grad=True, loss_parallel=loss_parallel),
    }
    fused = layout.fused_norms
    for norm, projections in layout.shared_inputs.items():
        plan[f"{layout.blocks}.{norm}"] = (
            ColumnNormedProjections(gather_latents=crossing) if fused else Replicated()
        )
        for p in projections:
            plan[f"{layout.blocks}.{p}.down"] = ColumnParallel(
                reduce_input_grad=not fused, gather_output=crossing and not fused
            )
            plan[f"{layout.blocks}.{p}.up"] = RowParallel(split_input=crossing)
    for p in layout.own_inputs:
        plan[f"{layout.blocks}.{p}.down"] = ColumnParallel(gather_output=crossing)
        plan[f"{layout.blocks}.{p}.up"] = RowParallel(split_input=crossing)
    if crossing:
        for p in _all_projections(layout):
            plan.update(_crossing(f"{layout.blocks}.{p}"))
    return plan


def btp_plan(
    layout: ModelLayout = BOOST_LAYOUT,
    *,
    rmsnorm: str = "online",
    crossing: bool = False,
    loss_parallel: bool = True,
) -> Plan:
    """Bottleneck-aware TP (BOOST §3).

    The residual stream stays sharded along the hidden dim through the whole network:
    the embedding is sharded along its embedding dim (local lookup, no collective), every
    A is row-parallel followed by one all-reduce at r, every B column-parallel writes the
    sharded residual (q/k/v by heads, so attention is local). The stream leaves through
    the final RMSNorm (sync: a [T, 1] all-reduce) and ONE all-gather of d, whose backward
    is a reduce-scatter, into a vocab-parallel lm_head with loss-parallel cross-entropy.
    That is the least communication at the exit: an all-reduce of partial logits would
    move V >> d elements per token, and an all-reduce of the head's input grad would move
    twice the reduce-scatter's bytes.
    """
    plan: Plan = {
        layout.embedding: ShardedEmbedding(),
        layout.final_norm: ShardedRMSNorm(gather_output=True),
        layout.head: _head(reduce_input_grad=False, loss_parallel=loss_parallel),
    }
    fused = layout.fused_norms
    for norm, projections in layout.shared_inputs.items():
        plan[f"{layout.blocks}.{norm}"] = (
            BottleneckNormedProjections(rmsnorm=rmsnorm) if fused else ShardedRMSNorm()
        )
        for p in projections:
            plan[f"{layout.blocks}.{p}.down"] = RowParallel()
            plan[f"{layout.blocks}.{p}.up"] = ColumnParallel(reduce_input_grad=not fused)
    for p in layout.own_inputs:
        plan[f"{layout.blocks}.{p}.down"] = RowParallel()
        plan[f"{layout.blocks}.{p}.up"] = ColumnParallel()
    if crossing:
        for p in _all_projections(layout):
            plan.update(_crossing(f"{layout.blocks}.{p}"))
    return plan


def _all_projections(layout: ModelLayout) -> list[str]:
    shared = [p for group in layout.shared_inputs.values() for p in group]
    return shared + list(layout.own_inputs)


def _is_optional(key: str) -> bool:
    """LaX crossing modules are absent from the first block."""
    return key.endswith((".cross", ".latent_norm"))


def apply_plan(model: nn.Module, mesh: DeviceMesh, plan: Plan) -> nn.Module:
    """Apply `plan` with `parallelize_module`, strictly.

    Every key must match at least one module (`*` matches any FQN part), except LaX's
    optional crossing modules. Afterwards every parameter under the matched modules'
    roots must be a DTensor on `mesh`; a parameter left out of the plan is an error.
    Parts of the model that are None (pipeline stages) are skipped.
    """
    names = [name for name, _ in model.named_modules()]
    for key, style in plan.items():
        matches = [n for n in names if fnmatch.fnmatchcase(n, key)]
        if not matches and not _is_optional(key) and not _absent_stage_part(model, key):
            raise ValueError(f"plan key {key!r} matches no module of {type(model).__name__}")
        for name in matches:
            parallelize_module(model, mesh, {name: style})
    plain = [n for n, p in model.named_parameters() if not isinstance(p, DTensor)]
    if plain:
        raise ValueError(f"parameters not covered by the TP plan: {', '.join(plain[:5])}")
    return model


def _absent_stage_part(model: nn.Module, key: str) -> bool:
    """True when the key's top-level module was dropped from this pipeline stage: set to
    None (embedding, norm, head) or left as an empty container (a stage without blocks)."""
    top = key.split(".")[0]
    if "*" in top or not hasattr(model, top):
        return False
    part = getattr(model, top)
    return part is None or (isinstance(part, (nn.ModuleDict, nn.ModuleList)) and len(part) == 0)
