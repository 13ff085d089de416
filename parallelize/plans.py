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
5r+1, r, r forward and 5r, r, r backward. Per-head q/k norms (`ModelLayout.head_norms`,
Qwen3) add, under btp and megatron, one backward all-reduce each of their weight grad:
head_dim elements per call, not per token (`Role.weight_grads`); none under vanilla.
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from .compile_cache import key_compile_caches_by_rank
from .group_members import GroupMember, GroupUp
from .group_norms import BottleneckGroupNorm, ReplicatedGroupNorm
from .groups import NormGroup
from .hf_guards import guard_sharded_hf_model
from .styles import (
    ColumnParallel,
    HeadNorm,
    PlanError,
    Replicated,
    RowParallel,
    ShardedEmbedding,
    ShardedRMSNorm,
    TPStyle,
)
from .verify import verify_plan

Plan = dict[str, ParallelStyle]
"""A TP plan: FQN pattern (may use `*`) -> the ParallelStyle of the modules it matches."""


@dataclass(frozen=True)
class ModelLayout:
    """Where a decoder keeps the modules a plan shards, as FQNs.

    `embedding`, `final_norm` and `head` are paths from the model, `blocks` a pattern that
    may use `*`; every other path is relative to a block. The defaults are TorchTitan's
    Llama names.

    Args:
        blocks (str): FQN pattern of the transformer blocks. Default: ``"layers.*"``.
        shared_inputs (Mapping[str, tuple[str, ...]]): each pre-norm -> every projection
            that reads its output. Default: ``attention_norm`` -> ``attention.wq``,
            ``.wk``, ``.wv``; ``ffn_norm`` -> ``feed_forward.w1``, ``.w3``.
        own_inputs (tuple[str, ...]): projections whose input is not a norm's output
            (attention output, MLP down). Default: ``("attention.wo", "feed_forward.w2")``.
        embedding (str): the token embedding. Default: ``"tok_embeddings"``.
        final_norm (str): the norm before the head. Default: ``"norm"``.
        head (str): the output projection. Default: ``"output"``.
        head_dim (int): size of one attention head, for the check that the heads (and
            kv heads) of `qkv` and `attention_out` split over the TP degree; required
            under TP > 1 when those name projections. Default: 0.
        qkv (tuple[str, ...]): projections whose outputs are attention heads.
            Default: ``attention.wq``, ``.wk``, ``.wv``.
        attention_out (tuple[str, ...]): projections whose inputs are attention heads.
            Default: ``("attention.wo",)``.
        crossing (tuple[str, ...]): LaX: children of every low-rank projection that act on
            its latent (e.g. ``"cross"``, ``"latent_norm"``); replicated, and optional
            (absent from the first block). Default: ``()``.
        head_norms (tuple[str, ...]): norms applied to each attention head of q or k
            (Qwen3's ``self_attn.q_norm``, ``k_norm``; weight [head_dim]). Where the
            heads are sharded (megatron, btp) each is a `HeadNorm`, whose weight grad is
            all-reduced in backward (one all-reduce of head_dim elements per norm per
            call); under vanilla every rank holds all heads: `Replicated`. Default: ``()``.
        attention (tuple[str, ...]): modules whose forward calls
            ``F.scaled_dot_product_attention``: context parallelism runs those calls as ring
            attention (`apply_context_parallel`); ``""`` names the block itself (SDPA in
            the block's own forward). Default: ``("attention.inner_attention",)``.
        positions (str): the keyword of the model's forward that takes each token's place
            in its sequence ([s] or [b, s]; Hugging Face models: ``"position_ids"``):
            under context parallelism a rank holds a shard of it. Default: ``"positions"``.
        defer_latent_grads (bool): BTP: let a group of self-contained pairs reduce its
            ups' input grads in one backward all-reduce (checked on the first forward).
            Turn it off when a pair's latent is also used outside the pair (LaX hands it
            to the next block). Default: True.

    Example::

        >>> from boost_titan.examples.own_model import Decoder  # ordinary PyTorch names
        >>> from boost_titan.parallelize import ModelLayout, btp_plan, resolve_plan
        >>> layout = ModelLayout(
        ...     blocks="blocks.*",
        ...     shared_inputs={
        ...         "ln1": ("attn.q_proj", "attn.k_proj", "attn.v_proj"),
        ...         "ln2": ("mlp.gate_proj", "mlp.up_proj"),
        ...     },
        ...     own_inputs=("attn.o_proj", "mlp.down_proj"),
        ...     embedding="tok",
        ...     final_norm="ln_f",
        ...     head="lm_head",
        ...     head_dim=16,
        ...     qkv=("attn.q_proj", "attn.k_proj", "attn.v_proj"),
        ...     attention_out=("attn.o_proj",),
        ... )
        >>> len(resolve_plan(Decoder(), btp_plan(layout), tp=2))  # modules the plan shards
        67
    """

    blocks: str = "layers.*"
    shared_inputs: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: {
            "attention_norm": ("attention.wq", "attention.wk", "attention.wv"),
            "ffn_norm": ("feed_forward.w1", "feed_forward.w3"),
        }
    )
    own_inputs: tuple[str, ...] = ("attention.wo", "feed_forward.w2")
    embedding: str = "tok_embeddings"
    final_norm: str = "norm"
    head: str = "output"
    head_dim: int = 0
    qkv: tuple[str, ...] = ("attention.wq", "attention.wk", "attention.wv")
    attention_out: tuple[str, ...] = ("attention.wo",)
    crossing: tuple[str, ...] = ()
    head_norms: tuple[str, ...] = ()
    attention: tuple[str, ...] = ("attention.inner_attention",)
    positions: str = "positions"
    defer_latent_grads: bool = True

    def projections(self) -> list[str]:
        shared = [p for group in self.shared_inputs.values() for p in group]
        return shared + list(self.own_inputs)

    def head_dim_of(self, projection: str, *, output: bool) -> int | None:
        heads = self.qkv if output else self.attention_out
        return self.head_dim if projection in heads else None


def _head(*, reduce_input_grad: bool, loss_parallel: bool) -> ColumnParallel:
    """Vocab-parallel lm_head: DTensor Shard(-1) logits for loss-parallel CE, or gathered."""
    return ColumnParallel(
        reduce_input_grad=reduce_input_grad,
        output_dtensor=loss_parallel,
        gather_output=not loss_parallel,
    )


def _head_norms(layout: ModelLayout, *, sharded_heads: bool) -> Plan:
    style = HeadNorm if sharded_heads else Replicated
    return {f"{layout.blocks}.{n}": style() for n in layout.head_norms}


def _crossing(layout: ModelLayout) -> Plan:
    return {
        f"{layout.blocks}.{p}.{child}": Replicated(optional=True)
        for p in layout.projections()
        for child in layout.crossing
    }


def megatron_plan(
    layout: ModelLayout = ModelLayout(), *, group_linears: bool = True, loss_parallel: bool = True
) -> Plan:
    """Full-rank Megatron TP, for models whose projections are plain nn.Linear.

    The residual stream is replicated; q, k, v, gate and up are column-parallel (run by
    their norm's style), o and down row-parallel. Two all-reduces of d per block forward
    (after o and down) and two backward (the norm outputs' grads).

    Args:
        layout (ModelLayout): where the model keeps its modules. Default: ``ModelLayout()``.
        group_linears (bool): a norm runs the first GEMMs of all its consumers as one GEMM
            on their concatenated weights; else each consumer runs its own. Default: True.
        loss_parallel (bool): the head returns vocab-sharded ``DTensor(Shard(-1))`` logits
            for a loss-parallel cross-entropy; else logits gathered on every rank.
            Default: True.

    Returns:
        Plan: FQN pattern -> style, for `apply_plan`.

    Raises:
        PlanError: a norm of ``layout.shared_inputs`` lists no consumers.

    Example::

        >>> from torch import nn
        >>> from boost_titan.examples.own_model import LAYOUT, Decoder
        >>> from boost_titan.parallelize import PlanError, megatron_plan, resolve_plan
        >>> model = Decoder()  # low-rank projections (down / up pairs): refused
        >>> try:  # doctest: +ELLIPSIS
        ...     resolve_plan(model, megatron_plan(LAYOUT), tp=2)
        ... except PlanError as e:
        ...     print(e)
        blocks.0.attn.q_proj is a LowRank, not an nn.Linear; use a low-rank plan (btp, ...
        >>> for block in model.blocks:  # its full-rank twin: each pair becomes one nn.Linear
        ...     for part in (block.attn, block.mlp):
        ...         for name, pair in list(part.named_children()):
        ...             d_in, d_out = pair.down.in_features, pair.up.out_features
        ...             setattr(part, name, nn.Linear(d_in, d_out, bias=False))
        >>> len(resolve_plan(model, megatron_plan(LAYOUT), tp=2))  # modules the plan shards
        39
    """
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
    plan.update(_head_norms(layout, sharded_heads=True))
    return plan


def vanilla_plan(
    layout: ModelLayout = ModelLayout(),
    *,
    group_linears: bool = True,
    loss_parallel: bool = True,
) -> Plan:
    """Naive low-rank TP, the baseline BTP improves on.

    Each A (``down``) is column-parallel along r, each B (``up``) row-parallel, so every
    low-rank projection ends in an all-reduce at its full output dim. The residual stream
    and q/k/v are replicated (attention runs on all heads on every rank). With LaX
    crossing (`layout.crossing`) the latents are all-gathered (the r x r crossing and
    LayerNorm_r need them whole) and each B takes its slice back.

    Args:
        layout (ModelLayout): where the model keeps its modules. Default: ``ModelLayout()``.
        group_linears (bool): a norm runs the downs of all its consumers as one GEMM on
            their concatenated weights; else each down runs its own. Default: True.
        loss_parallel (bool): the head returns vocab-sharded ``DTensor(Shard(-1))`` logits
            for a loss-parallel cross-entropy; else logits gathered on every rank.
            Default: True.

    Returns:
        Plan: FQN pattern -> style, for `apply_plan`.

    Raises:
        PlanError: a norm of ``layout.shared_inputs`` lists no consumers.

    Example::

        >>> from boost_titan.examples.own_model import LAYOUT, Decoder
        >>> from boost_titan.parallelize import btp_plan, resolve_plan, vanilla_plan
        >>> for build in (vanilla_plan, btp_plan):  # A and B of the attention output
        ...     plan = build(LAYOUT)
        ...     down, up = (plan[f"blocks.*.attn.o_proj.{p}"] for p in ("down", "up"))
        ...     print(f"{build.__name__}: {type(down).__name__}, {type(up).__name__}")
        vanilla_plan: ColumnParallel, RowParallel
        btp_plan: RowParallel, ColumnParallel
        >>> len(resolve_plan(Decoder(), vanilla_plan(LAYOUT), tp=2))
        67
    """
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
    plan.update(_head_norms(layout, sharded_heads=False))
    plan.update(_crossing(layout))
    return plan


def btp_plan(
    layout: ModelLayout = ModelLayout(),
    *,
    rmsnorm: str = "online",
    group_linears: bool = True,
    loss_parallel: bool = True,
) -> Plan:
    """Bottleneck-aware TP (BOOST §3): low-rank TP whose collectives run at the rank r.

    The residual stream stays sharded along the hidden dim through the whole network:
    the embedding is sharded along its embedding dim (local lookup, no collective), every
    A is row-parallel followed by one all-reduce at r (a norm's consumers together, with
    online RMSNorm's statistic), every B column-parallel writes the sharded residual (q/k/v
    by heads, so attention is local). The stream leaves through the final RMSNorm (sync:
    a [T, 1] all-reduce) and ONE all-gather of d, whose backward is a reduce-scatter, into
    a vocab-parallel lm_head with loss-parallel cross-entropy: an all-reduce of partial
    logits would move V >> d elements per token, and an all-reduce of the head's input
    grad twice the reduce-scatter's bytes.

    Args:
        layout (ModelLayout): where the model keeps its modules. Default: ``ModelLayout()``.
        rmsnorm (str): ``"online"``: each pre-norm's statistic rides in its group's
            all-reduce; ``"sync"``: it is all-reduced on its own. Default: ``"online"``.
        group_linears (bool): one GEMM and one all-reduce for all consumers of a norm;
            else one per consumer. Default: True.
        loss_parallel (bool): the head returns vocab-sharded ``DTensor(Shard(-1))`` logits
            for a loss-parallel cross-entropy; else logits gathered on every rank.
            Default: True.

    Returns:
        Plan: FQN pattern -> style, for `apply_plan`.

    Raises:
        ValueError: `rmsnorm` is neither ``"online"`` nor ``"sync"``.
        PlanError: a norm of ``layout.shared_inputs`` lists no consumers.

    Example::

        >>> from boost_titan.examples.own_model import LAYOUT
        >>> from boost_titan.parallelize import btp_plan
        >>> for key, style in btp_plan(LAYOUT).items():
        ...     print(f"{key}: {type(style).__name__}")
        tok: ShardedEmbedding
        ln_f: ShardedRMSNorm
        lm_head: ColumnParallel
        blocks.*.ln1: BottleneckGroupNorm
        blocks.*.attn.q_proj.down: GroupMember
        blocks.*.attn.q_proj.up: GroupUp
        blocks.*.attn.k_proj.down: GroupMember
        blocks.*.attn.k_proj.up: GroupUp
        blocks.*.attn.v_proj.down: GroupMember
        blocks.*.attn.v_proj.up: GroupUp
        blocks.*.ln2: BottleneckGroupNorm
        blocks.*.mlp.gate_proj.down: GroupMember
        blocks.*.mlp.gate_proj.up: GroupUp
        blocks.*.mlp.up_proj.down: GroupMember
        blocks.*.mlp.up_proj.up: GroupUp
        blocks.*.attn.o_proj.down: RowParallel
        blocks.*.attn.o_proj.up: ColumnParallel
        blocks.*.mlp.down_proj.down: RowParallel
        blocks.*.mlp.down_proj.up: ColumnParallel
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
    plan.update(_head_norms(layout, sharded_heads=True))
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

    `apply_plan` and `plan_table` start with it; call it to check a layout early.

    Args:
        model (nn.Module): the unsharded model.
        plan (Plan): FQN pattern -> style, e.g. from `btp_plan`.
        tp (int): the TP degree to check divisibility (features, heads) against.

    Returns:
        list[Resolved]: one entry per matched module, in plan order: the plan `key`, the
        module's `fqn`, the `module` and the `style` bound to it.

    Raises:
        PlanError: one line naming the FQN and the fix, for a key that matches no module
            (LaX crossing modules are optional; parts of a pipeline stage that are None
            are skipped), a module matched twice, tied parameters, a module the style
            cannot shard (kind, divisibility by `tp`, heads), a norm group whose layout
            disagrees with the model, and any parameter no style distributes.

    Example::

        >>> from boost_titan.examples.own_model import LAYOUT, Decoder
        >>> from boost_titan.parallelize import PlanError, btp_plan, resolve_plan
        >>> resolved = resolve_plan(Decoder(), btp_plan(LAYOUT), tp=2)
        >>> [r.fqn for r in resolved if r.key == "blocks.*.ln1"]
        ['blocks.0.ln1', 'blocks.1.ln1', 'blocks.2.ln1', 'blocks.3.ln1']
        >>> try:
        ...     resolve_plan(Decoder(), btp_plan(LAYOUT), tp=3)
        ... except PlanError as e:
        ...     print(e)
        tok: weight dim 1 of size 128 does not split over TP 3; choose a TP degree that divides it
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
    _check_embeddings(resolved)
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

    Each matched module's parameters become DTensors on `mesh` and its forward computes on
    the local shards. It also makes the keys of torch.compile's caches name this rank and
    its TP group (`key_compile_caches_by_rank`): compiled graphs of sharded models are
    rank-specific, and a warm cache shared by the ranks would otherwise mix them.

    Args:
        model (nn.Module): the unsharded model, sharded in place.
        mesh (DeviceMesh): the 1-D TP mesh.
        plan (Plan): FQN pattern -> style, e.g. from `btp_plan`.
        src_data_rank (int | None): the rank whose weights are scattered; None: each rank
            keeps its own slice, no communication (as `parallelize_module`). Default: 0.
        verify (bool): afterwards run one small forward and backward on random tokens
            against an unsharded copy of the model (`verify_plan`): cheap insurance for a
            new model. Default: False.
        overlap_chunks (int): split the tokens of each forward all-reduce that follows a
            GEMM (row-parallel outputs, online-RMSNorm downs) and of each column-parallel
            input-grad all-reduce into that many row blocks, each launched before the next
            block's GEMM, so that communication runs behind computation (1: one
            all-reduce each). Default: 1.

    Returns:
        nn.Module: `model`, sharded.

    A transformers model sharded here refuses, in one line naming the fix, what cannot
    work on its DTensor parameters: ``save_pretrained`` (use `save_hf`) and, under a
    loss-parallel head, its own loss (``labels=``).

    Raises:
        PlanError: the plan does not fit the model (see `resolve_plan`), `overlap_chunks`
            is below 1, the model is already sharded, or `verify` found a mismatch.

    Example::

        >>> import torch
        >>> import torch.distributed as dist
        >>> from torch.distributed.device_mesh import init_device_mesh
        >>> from boost_titan.examples.own_model import LAYOUT, Decoder
        >>> from boost_titan.parallelize import apply_plan, btp_plan
        >>> # one process here; under torchrun: init_device_mesh("cuda", (tp,))
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> mesh = init_device_mesh("cpu", (1,))
        >>> model = apply_plan(Decoder(), mesh, btp_plan(LAYOUT, loss_parallel=False), verify=True)
        >>> model.blocks[0].attn.q_proj.down.weight.placements
        (Shard(dim=1),)
        >>> model(torch.randint(0, 256, (2, 16))).shape
        torch.Size([2, 16, 256])
        >>> dist.destroy_process_group()
    """
    if overlap_chunks < 1:
        raise PlanError(f"overlap_chunks must be >= 1, got {overlap_chunks}")
    if any(isinstance(p, DTensor) for p in model.parameters()):
        raise PlanError(
            f"{type(model).__name__} is already sharded (apply_plan ran on it); apply one "
            "plan to a freshly built model"
        )
    resolved = resolve_plan(model, plan, mesh.size())
    reference = copy.deepcopy(model) if verify else None
    for r in resolved:
        r.style.overlap_chunks = overlap_chunks
        parallelize_module(r.module, mesh, r.style, src_data_rank=src_data_rank)
    key_compile_caches_by_rank(mesh)
    heads = [r.fqn for r in resolved if getattr(r.style, "output_dtensor", False)]
    guard_sharded_hf_model(model, heads[0] if heads else None)
    if reference is not None:
        verify_plan(model, reference)
    return model


def _check_embeddings(resolved: list[Resolved]) -> None:
    """Every embedding of the plan in one style: they add into one residual stream, which
    BTP shards along the hidden dim (a position embedding beside the token embedding
    must then be a ShardedEmbedding too) and the other plans replicate."""
    embeddings = [r for r in resolved if isinstance(r.module, nn.Embedding)]
    for r in embeddings[1:]:
        first = embeddings[0]
        if type(r.style) is not type(first.style):
            raise PlanError(
                f"{r.fqn} is {type(r.style).__name__} but {first.fqn} is "
                f"{type(first.style).__name__}: embeddings that add into the residual stream "
                f"must be laid out alike; make {r.fqn} a {type(first.style).__name__}"
            )


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
