"""Tensor-parallel plans: plain mappings FQN -> ParallelStyle, for any torch-native decoder.

A plan is built from a `ModelLayout` that names the modules it touches (FQNs may use
`*`); `apply_plan` checks it against the model, then applies it with `parallelize_module`.
The model's code is not changed: each style replaces one module's forward. What a plan
needs from a model:

* pre-norms are RMSNorm-like (a 1-D `weight`, an `eps` or `variance_epsilon`, output
  ``x / rms(x) * weight``), and `ModelLayout.shared_inputs` lists every module that reads
  each one's output (checked on the first training forward);
* a low-rank projection is any module with `down` and `up` nn.Linear children; what its
  forward does between them (an activation, nothing, LaX's crossing) stays its own code;
* attention takes its head count from the tensor (``view(b, s, -1, head_dim)``): under
  BTP and megatron each rank holds heads / TP of them;
* under BTP the residual stream is sharded along the hidden dim: code between the listed
  modules must act on each hidden feature on its own (residual adds, scaling, dropout).

The mechanism (see `groups`): a pre-norm's style computes the first linear of every
consumer it feeds (one GEMM on concatenated weights) and returns the results side by side;
each consumer's first linear (a `down`, or a full linear) returns its own columns. Under
BTP that puts q/k/v (and gate/up) behind ONE all-reduce of 3r+1 (2r+1) elements per token
that also carries online RMSNorm's statistic, and the ups' partial input grads behind one
backward all-reduce of 3r (2r) when the pairs are self-contained.

Per block (T tokens, all-reduce elements per token; standard pre-norm block):

  =========  =============================================  ============  ==============
  plan       layout                                         forward       backward
  =========  =============================================  ============  ==============
  megatron   column q,k,v,gate,up; row o,down; replicated   d, d          d, d
  vanilla    every A column (along r), every B row          q,k,v,o,down  d, d, d, d_ff
             (q,k,v,o,down at d_out; gate,up at d_ff)       5d + 2d_ff
  btp        every A row + all-reduce at r, every B column  3r+1, r,      3r, r, 2r, r
             residual sharded along d                       2r+1, r
  =========  =============================================  ============  ==============

A parallel block (one norm feeding q,k,v,gate,up) gets one group of five: under BTP
5r+1, r, r forward and 5r, r, r backward.
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from .compile_cache import key_compile_caches_by_rank
from .groups import (
    BottleneckGroupNorm,
    GroupMember,
    GroupUp,
    NormGroup,
    ReplicatedGroupNorm,
)
from .styles import (
    ColumnParallel,
    PlanError,
    Replicated,
    RowParallel,
    ShardedEmbedding,
    ShardedRMSNorm,
    TPStyle,
)

Plan = dict[str, ParallelStyle]


@dataclass(frozen=True)
class ModelLayout:
    """Where a decoder keeps the modules a plan shards (FQNs; `blocks` may use `*`).

    Paths other than `blocks`, `embedding`, `final_norm` and `head` are relative to a block.
    """

    blocks: str = "layers.*"
    """FQN pattern of the transformer blocks."""
    shared_inputs: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: {
            "attention_norm": ("attention.wq", "attention.wk", "attention.wv"),
            "ffn_norm": ("feed_forward.w1", "feed_forward.w3"),
        }
    )
    """Each pre-norm -> every projection that reads its output."""
    own_inputs: tuple[str, ...] = ("attention.wo", "feed_forward.w2")
    """Projections whose input is not a norm's output (attention output, MLP down)."""
    embedding: str = "tok_embeddings"
    final_norm: str = "norm"
    head: str = "output"
    head_dim: int = 0
    """Size of one attention head; 0 skips the head-count checks."""
    qkv: tuple[str, ...] = ("attention.wq", "attention.wk", "attention.wv")
    """Projections whose outputs are attention heads."""
    attention_out: tuple[str, ...] = ("attention.wo",)
    """Projections whose inputs are attention heads."""
    crossing: tuple[str, ...] = ()
    """LaX: children of every low-rank projection that act on its latent (e.g. "cross",
    "latent_norm"); replicated, and optional (absent from the first block)."""
    defer_latent_grads: bool = True
    """BTP: let a group of self-contained pairs reduce its ups' input grads in one
    backward all-reduce (checked on the first forward). Turn off when a pair's latent is
    also used outside the pair (LaX hands it to the next block)."""

    def projections(self) -> list[str]:
        shared = [p for group in self.shared_inputs.values() for p in group]
        return shared + list(self.own_inputs)

    def head_dim_of(self, projection: str, *, output: bool) -> int | None:
        heads = self.qkv if output else self.attention_out
        return self.head_dim or None if projection in heads else None


def _head(*, reduce_input_grad: bool, loss_parallel: bool) -> ColumnParallel:
    """Vocab-parallel lm_head: DTensor Shard(-1) logits for loss-parallel CE, or gathered."""
    return ColumnParallel(
        reduce_input_grad=reduce_input_grad,
        output_dtensor=loss_parallel,
        gather_output=not loss_parallel,
    )


def _crossing(layout: ModelLayout) -> Plan:
    return {
        f"{layout.blocks}.{p}.{child}": Replicated(optional=True)
        for p in layout.projections()
        for child in layout.crossing
    }


def megatron_plan(
    layout: ModelLayout = ModelLayout(), *, group_linears: bool = True, loss_parallel: bool = True
) -> Plan:
    """Full-rank Megatron TP: the residual stream is replicated; column-parallel q, k, v,
    gate, up (run by their norm, as one GEMM with `group_linears`), row-parallel o and
    down. Two all-reduces of d per block forward (after o and down) and two backward (the
    norm outputs' grads)."""
    plan: Plan = {
        layout.embedding: Replicated(),
        layout.final_norm: Replicated(),
        layout.head: _head(reduce_input_grad=True, loss_parallel=loss_parallel),
    }
    for norm, consumers in layout.shared_inputs.items():
        group = NormGroup(norm, consumers, low_rank=False)
        plan[f"{layout.blocks}.{norm}"] = ReplicatedGroupNorm(group, grouped=group_linears)
        for i, p in enumerate(consumers):
            plan[f"{layout.blocks}.{p}"] = GroupMember(
                group, i, sharding="column", head_dim=layout.head_dim_of(p, output=True)
            )
    for p in layout.own_inputs:
        plan[f"{layout.blocks}.{p}"] = RowParallel(head_dim=layout.head_dim_of(p, output=False))
    return plan


def vanilla_plan(
    layout: ModelLayout = ModelLayout(),
    *,
    group_linears: bool = True,
    loss_parallel: bool = True,
) -> Plan:
    """Naive low-rank TP: each A column-parallel along r, each B row-parallel, so every
    low-rank projection ends in an all-reduce at its full output dim. The residual stream
    and q/k/v are replicated (attention runs on all heads on every rank). With LaX
    crossing (`layout.crossing`) the latents are all-gathered (the r x r crossing and
    LayerNorm_r need them whole) and each B takes its slice back."""
    crossing = bool(layout.crossing)
    plan: Plan = {
        layout.embedding: Replicated(),
        layout.final_norm: Replicated(),
        layout.head: _head(reduce_input_grad=True, loss_parallel=loss_parallel),
    }
    for norm, consumers in layout.shared_inputs.items():
        group = NormGroup(norm, consumers, low_rank=True)
        plan[f"{layout.blocks}.{norm}"] = ReplicatedGroupNorm(
            group, grouped=group_linears, gather_latents=crossing
        )
        for i, p in enumerate(consumers):
            plan[f"{layout.blocks}.{p}.down"] = GroupMember(group, i, sharding="column")
            plan[f"{layout.blocks}.{p}.up"] = RowParallel(split_input=crossing)
    for p in layout.own_inputs:
        plan[f"{layout.blocks}.{p}.down"] = ColumnParallel(gather_output=crossing)
        plan[f"{layout.blocks}.{p}.up"] = RowParallel(split_input=crossing)
    plan.update(_crossing(layout))
    return plan


def btp_plan(
    layout: ModelLayout = ModelLayout(),
    *,
    rmsnorm: str = "online",
    group_linears: bool = True,
    loss_parallel: bool = True,
) -> Plan:
    """Bottleneck-aware TP (BOOST §3).

    The residual stream stays sharded along the hidden dim through the whole network:
    the embedding is sharded along its embedding dim (local lookup, no collective), every
    A is row-parallel followed by one all-reduce at r (a norm's consumers together, with
    online RMSNorm's statistic), every B column-parallel writes the sharded residual (q/k/v
    by heads, so attention is local). The stream leaves through the final RMSNorm (sync:
    a [T, 1] all-reduce) and ONE all-gather of d, whose backward is a reduce-scatter, into
    a vocab-parallel lm_head with loss-parallel cross-entropy: an all-reduce of partial
    logits would move V >> d elements per token, and an all-reduce of the head's input
    grad twice the reduce-scatter's bytes.
    """
    plan: Plan = {
        layout.embedding: ShardedEmbedding(),
        layout.final_norm: ShardedRMSNorm(gather_output=True),
        layout.head: _head(reduce_input_grad=False, loss_parallel=loss_parallel),
    }
    for norm, consumers in layout.shared_inputs.items():
        group = NormGroup(norm, consumers, low_rank=True)
        plan[f"{layout.blocks}.{norm}"] = BottleneckGroupNorm(
            group, rmsnorm=rmsnorm, grouped=group_linears, defer=layout.defer_latent_grads
        )
        for i, p in enumerate(consumers):
            plan[f"{layout.blocks}.{p}.down"] = GroupMember(group, i, sharding="row")
            plan[f"{layout.blocks}.{p}.up"] = GroupUp(
                group, i, head_dim=layout.head_dim_of(p, output=True)
            )
    for p in layout.own_inputs:
        plan[f"{layout.blocks}.{p}.down"] = RowParallel(
            head_dim=layout.head_dim_of(p, output=False)
        )
        plan[f"{layout.blocks}.{p}.up"] = ColumnParallel()
    plan.update(_crossing(layout))
    return plan


@dataclass(frozen=True)
class Resolved:
    """One module a plan applies to, with its (bound) style."""

    key: str
    fqn: str
    module: nn.Module
    style: ParallelStyle


def resolve_plan(model: nn.Module, plan: Plan, tp: int) -> list[Resolved]:
    """Match every plan key against the model and check the whole plan, touching nothing.

    Raises `PlanError` (one line: the FQN and the fix) for a key that matches no module
    (LaX crossing modules are optional; parts of a pipeline stage that are None are
    skipped), a module matched twice, tied parameters, a module the style cannot shard
    (kind, divisibility by `tp`, heads), a norm group whose layout disagrees with the
    model, and any parameter no style distributes.
    """
    modules = dict(model.named_modules())
    resolved: list[Resolved] = []
    for key, style in plan.items():
        matches = [n for n in modules if fnmatch.fnmatchcase(n, key)]
        optional = getattr(style, "optional", False)
        if not matches and not optional and not _absent_stage_part(model, key):
            raise PlanError(
                f"plan key {key!r} matches no module of {type(model).__name__}; "
                "fix the FQN in ModelLayout"
            )
        for name in matches:
            bound = style.bind(model, name) if hasattr(style, "bind") else style
            resolved.append(Resolved(key, name, modules[name], bound))
    seen: dict[str, str] = {}
    for r in resolved:
        if r.fqn in seen:
            raise PlanError(
                f"{r.fqn} is matched by plan keys {seen[r.fqn]!r} and {r.key!r}; keep one"
            )
        seen[r.fqn] = r.key
    _check_untied(model)
    for r in resolved:
        if isinstance(r.style, TPStyle):
            try:
                r.style.validate(r.module, tp)
            except PlanError as e:
                raise PlanError(f"{r.fqn}: {e}") from None
    covered = {id(p) for r in resolved for p in r.module.parameters(recurse=False)}
    plain = [n for n, p in model.named_parameters() if id(p) not in covered]
    if plain:
        more = f" (and {len(plain) - 1} more)" * (len(plain) > 1)
        raise PlanError(
            f"{plain[0]}{more} is not covered by the plan; add its module to the ModelLayout"
        )
    return resolved


def apply_plan(
    model: nn.Module,
    mesh: DeviceMesh,
    plan: Plan,
    *,
    src_data_rank: int | None = 0,
    verify: bool = False,
    overlap_chunks: int = 1,
) -> nn.Module:
    """Check `plan` against `model` (`resolve_plan`), then shard the model in place.

    `src_data_rank`: the rank whose weights are scattered (None: each rank keeps its own
    slice, no communication; as `parallelize_module`). `verify`: afterwards run one small
    forward and backward on random tokens against an unsharded copy of the model and raise
    `PlanError` on any mismatch (`verify.verify_plan`): cheap insurance for a new model.
    `overlap_chunks`: split the tokens of each forward all-reduce that follows a GEMM
    (row-parallel outputs, online-RMSNorm downs) and of each column-parallel input-grad
    all-reduce into that many row blocks, each launched before the next block's GEMM, so
    that communication runs behind computation (1: one all-reduce each).

    It also makes the keys of torch.compile's caches name this rank and its TP group
    (`compile_cache.key_compile_caches_by_rank`): compiled graphs of sharded models are
    rank-specific, and a warm cache shared by the ranks would otherwise mix them.
    """
    if overlap_chunks < 1:
        raise PlanError(f"overlap_chunks must be >= 1, got {overlap_chunks}")
    resolved = resolve_plan(model, plan, mesh.size())
    reference = copy.deepcopy(model) if verify else None
    for r in resolved:
        r.style.overlap_chunks = overlap_chunks
        parallelize_module(r.module, mesh, r.style, src_data_rank=src_data_rank)
    key_compile_caches_by_rank(mesh)
    if reference is not None:
        from .verify import verify_plan

        verify_plan(model, reference)
    return model


def _check_untied(model: nn.Module) -> None:
    first: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            raise PlanError(
                f"{name} and {first[id(param)]} share one parameter (tied weights), which "
                "TP plans do not support; untie them"
            )
        first[id(param)] = name


def _absent_stage_part(model: nn.Module, key: str) -> bool:
    """True when the key's top-level module was dropped from this pipeline stage: set to
    None (embedding, norm, head) or left as an empty container (a stage without blocks)."""
    top = key.split(".")[0]
    if "*" in top or not hasattr(model, top):
        return False
    part = getattr(model, top)
    return part is None or (isinstance(part, (nn.ModuleDict, nn.ModuleList)) and len(part) == 0)
