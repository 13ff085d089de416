"""Norm-led groups: a pre-norm computes the first linear of every module that reads it.

An ordinary model writes ``h = norm(x)`` and then calls each consumer on ``h`` one by one
(``q_proj(h)``, ``k_proj(h)``, ...; a low-rank pair as ``up(act(down(h)))`` in its own
forward). A `NormGroup` names the norm and its consumers (paths relative to a block). Its
styles turn them into one unit without touching the model's code:

* the norm's style computes, from its input, the first linear of every consumer (the
  ``down`` of a low-rank pair, or the linear itself) and returns their outputs side by
  side in ONE tensor;
* each first linear's style returns its own columns of that tensor (the weights stay its
  own parameters, so checkpoint keys do not change);
* whatever the model does next (an activation, nothing, LaX's crossing) runs as written.

BTP (`BottleneckGroupNorm`): the input is hidden-sharded. One GEMM of the local shard
(scaled by the norm weight) with the concatenated, row-parallel down weights and ONE
all-reduce return every consumer's replicated latent; online RMSNorm's statistic rides in
the same all-reduce (3r+1 elements per token for q/k/v). The ups are column-parallel and
their input grads are partial sums. When every pair of the group is self-contained (no
parameter between down and up; the latent flows only into its up) the group is
*deferred*: the ups leave their input grads partial and the group all-reduces the grad of
the concatenated latent once (3r for q/k/v): one backward collective instead of three.
Otherwise each up all-reduces its own input grad.

Megatron / vanilla (`ReplicatedGroupNorm`): the norm runs replicated. Grouped, it runs the
consumers' column-parallel first GEMMs as one GEMM on the concatenated weights; ungrouped,
each consumer runs its own. Their input grads are partial and the group all-reduces the
norm output's grad once, overlapped with the weight-grad GEMMs when grouped.

Both rely on the group's output reaching only the listed consumers and, when deferred, on
each latent reaching only its up. `group_check.BlockCheck` verifies that on the autograd graph
of each block's first training forward (eager mode) and raises a one-line `PlanError`.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard

from boost_titan.kernels.float8 import Float8

from . import comm, group_check
from .norms import online_rmsnorm_down, sync_rmsnorm
from .styles import (
    Collective,
    ColumnParallel,
    Gemm,
    PlanError,
    Role,
    TPStyle,
    check_heads,
    describe_placements,
    is_rmsnorm_like,
    linear,
    local,
    norm_dim,
    norm_eps,
    own_gemm,
)

RMSNORM_MODES = ("online", "sync")


class NormGroup:
    """A pre-norm and the modules that read its output, as paths relative to a block.

    The styles of the norm and of its consumers' linears share one NormGroup; the plan
    builders make one per entry of `ModelLayout.shared_inputs`.

    Args:
        norm (str): path of the norm (RMSNorm-like) inside a block.
        consumers (Sequence[str]): paths of every module that reads the norm's output.
        low_rank (bool): the consumers are low-rank pairs (modules with `down` and `up`
            nn.Linear children); else nn.Linear modules.

    Raises:
        PlanError: `consumers` is empty.

    Example::

        >>> from boost_titan.parallelize import NormGroup, PlanError
        >>> group = NormGroup("ln2", ("mlp.gate_proj", "mlp.up_proj"), low_rank=True)
        >>> group.first(0), group.second(1)  # a consumer's first linear, a pair's up
        ('mlp.gate_proj.down', 'mlp.up_proj.up')
        >>> try:
        ...     NormGroup("ln2", (), low_rank=True)
        ... except PlanError as e:
        ...     print(e)
        norm 'ln2' has no consumers; list the modules that read it
    """

    def __init__(self, norm: str, consumers: Sequence[str], *, low_rank: bool) -> None:
        if not consumers:
            raise PlanError(f"norm {norm!r} has no consumers; list the modules that read it")
        self.norm = norm
        self.consumers = tuple(consumers)
        self.low_rank = low_rank

    def first(self, index: int) -> str:
        """Path of a consumer's first linear (its down-projection, or itself)."""
        c = self.consumers[index]
        return f"{c}.down" if self.low_rank else c

    def second(self, index: int) -> str:
        """Path of a low-rank consumer's up-projection."""
        return f"{self.consumers[index]}.up"

    def bind(self, root: nn.Module, fqn: str, relative: str) -> GroupInstance:
        """The instance of this group in the block that holds module `fqn`, whose path
        inside its block is `relative`."""
        block_fqn = fqn[: len(fqn) - len(relative)].rstrip(".")
        block = root.get_submodule(block_fqn) if block_fqn else root
        prefix = f"{block_fqn}." if block_fqn else ""
        norm = _submodule(block, self.norm, prefix)
        instance = _INSTANCES.get(norm)
        if instance is None or instance.spec is not self:
            instance = GroupInstance.resolve(self, block, norm, prefix)
            _INSTANCES[norm] = instance
        return instance


def _submodule(block: nn.Module, path: str, prefix: str) -> nn.Module:
    try:
        return block.get_submodule(path)
    except AttributeError:
        raise PlanError(f"{prefix}{path} does not exist; fix the FQN in ModelLayout") from None


def _pair(module: nn.Module, fqn: str) -> tuple[nn.Linear, nn.Linear]:
    down, up = getattr(module, "down", None), getattr(module, "up", None)
    if not (isinstance(down, nn.Linear) and isinstance(up, nn.Linear)):
        raise PlanError(
            f"{fqn} is not a low-rank pair (a module with `down` and `up` nn.Linear "
            "children); list it under a plan for full linears (megatron) or fix the FQN"
        )
    return down, up


def _self_contained(pair: nn.Module, down: nn.Linear, up: nn.Linear) -> bool:
    """No parameter of the pair lives outside its down and up (nothing trainable between)."""
    own = {id(p) for m in (down, up) for p in m.parameters()}
    return all(id(p) in own for p in pair.parameters())


@dataclass(eq=False)
class GroupInstance:
    """One block's norm group: the modules, how the group output is laid out, and what
    the first checked forward recorded."""

    spec: NormGroup
    norm_fqn: str
    consumer_fqns: list[str]
    block: nn.Module
    norm: nn.Module
    firsts: list[nn.Linear]
    seconds: list[nn.Linear | None]
    self_contained: bool
    norm_style: TPStyle | None = None
    deferred: bool = False
    computes_firsts: bool = True
    """The group output holds the first linears' outputs (members slice it); else it is
    the norm output and each member runs its own GEMM."""
    spans: list[tuple[int, int]] = field(default_factory=list)
    parts: list[torch.Tensor | None] = field(default_factory=list)
    """The current forward call's consumer outputs, split off the group output in one op
    (eager mode): each consumer takes its own, so backward concatenates their grads
    instead of summing one zero-padded full-width grad per consumer."""
    owner: torch.Tensor | None = None
    """The group output the parts were split from, held until every part is taken (the
    parts keep its memory alive anyway). A weak reference would die in checkpoint's
    recomputation, where nothing else holds the output, and `take` would then run other
    ops than the forward did, which selective checkpointing refuses."""
    stash: comm.WeightGradStash | None = None
    """The current forward call's: the linears that leave their input grads partial
    leave their weight-grad GEMMs to the group's backward all-reduce too, which runs
    behind them (eager mode; compiled forwards reduce without it)."""
    record: group_check.GroupRecord | None = None

    @classmethod
    def resolve(
        cls, spec: NormGroup, block: nn.Module, norm: nn.Module, prefix: str
    ) -> GroupInstance:
        firsts: list[nn.Linear] = []
        seconds: list[nn.Linear | None] = []
        contained = True
        for consumer in spec.consumers:
            module = _submodule(block, consumer, prefix)
            if spec.low_rank:
                down, up = _pair(module, prefix + consumer)
                contained &= _self_contained(module, down, up)
                firsts.append(down)
                seconds.append(up)
            else:
                if not isinstance(module, nn.Linear):
                    raise PlanError(
                        f"{prefix}{consumer} is a {type(module).__name__}, not an nn.Linear; "
                        "use a low-rank plan (btp, vanilla) for down/up pairs or fix the FQN"
                    )
                firsts.append(module)
                seconds.append(None)
        return cls(
            spec,
            prefix + spec.norm,
            [prefix + c for c in spec.consumers],
            block,
            norm,
            firsts,
            seconds,
            contained,
        )

    def first_fqn(self, index: int) -> str:
        """FQN of consumer `index`'s first linear."""
        fqn = self.consumer_fqns[index]
        return f"{fqn}.down" if self.spec.low_rank else fqn

    def stack_gemm(self, members: Sequence[int]) -> Gemm:
        """The one GEMM of these consumers' first linears (their local weights stacked)."""
        shapes = [local(self.firsts[i].weight).shape for i in members]
        return Gemm(
            tuple(self.first_fqn(i) for i in members), sum(s[0] for s in shapes), shapes[0][1]
        )

    @property
    def width(self) -> int:
        return self.spans[-1][0] + self.spans[-1][1]

    def validate(self, tp: int) -> None:
        """Checks shared by the group's styles (message without an FQN prefix)."""
        if self.norm_style is None:
            raise PlanError(
                f"the plan has no style for its norm {self.norm_fqn}; "
                "build plans with btp_plan / vanilla_plan / megatron_plan"
            )
        if not is_rmsnorm_like(self.norm):
            raise PlanError(
                f"{self.norm_fqn} is a {type(self.norm).__name__}, not an RMSNorm-like module "
                "(1-D weight, eps, no bias); only RMSNorm pre-norms are supported"
            )
        dim = norm_dim(self.norm)
        for fqn, first in zip(self.consumer_fqns, self.firsts, strict=True):
            if first.in_features != dim:
                raise PlanError(
                    f"{fqn} takes {first.in_features} features but {self.norm_fqn} "
                    f"normalises {dim}; it cannot read that norm's output, fix ModelLayout"
                )

    # ---- recording for the first-forward check ---------------------------------------
    def hand_out(self, out: torch.Tensor) -> None:
        """Split the group output into the consumers' parts for this forward call."""
        if torch.compiler.is_compiling():
            return
        self.parts = list(out.split([width for _, width in self.spans], dim=-1))
        self.owner = out

    def take(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Consumer `index`'s columns of the group output `x`: its part when `x` is the
        output it was split from (once), else a narrow view (compiled forwards)."""
        part = self.parts[index] if index < len(self.parts) else None
        if part is None or self.owner is None or not group_check.same_data(x, self.owner):
            start, width = self.spans[index]
            return x.narrow(-1, start, width)
        self.parts[index] = None
        if all(p is None for p in self.parts):
            self.owner = None
        return part.view_as(part)

    def new_stash(self) -> comm.WeightGradStash | None:
        self.stash = None if torch.compiler.is_compiling() else comm.WeightGradStash()
        return self.stash

    def stashed_weights(
        self, linears: Sequence[nn.Linear], members: Sequence[int]
    ) -> dict[int, torch.Tensor]:
        """Consumer index -> local weight of those `linears` whose weight grads wait for
        the group's all-reduce (none without a stash)."""
        return {} if self.stash is None else {i: local(linears[i].weight) for i in members}

    def deferred_linear(
        self, x: torch.Tensor, module: nn.Linear, index: int, f8: Float8 | None
    ) -> torch.Tensor:
        """A consumer linear whose input grad the group reduces: its weight grad waits
        for the group's all-reduce (with a stash). `f8`: its GEMMs in float8."""
        if self.stash is None:
            return linear(x, module, f8)
        y = comm.stashed_linear(x, local(module.weight), self.stash, index, f8)
        return y + local(module.bias) if module.bias is not None else y

    def record_output(self, out: torch.Tensor) -> None:
        if self.record is not None and not torch.compiler.is_compiling():
            self.record.output = out

    def record_first(self, index: int, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.record is None or torch.compiler.is_compiling():
            return
        output = self.record.output
        if output is None or not group_check.same_data(x, output):
            raise PlanError(
                f"{self.consumer_fqns[index]} is listed as reading {self.norm_fqn}'s output "
                "but was called with another tensor; fix ModelLayout.shared_inputs"
            )
        self.record.firsts[index] = group_check.nodes_between(y, output)
        self.record.latents[index] = y.grad_fn

    def record_up(self, index: int, h: torch.Tensor, y: torch.Tensor) -> None:
        if self.record is not None and not torch.compiler.is_compiling():
            self.record.ups[index] = (h.grad_fn, y.grad_fn)


_INSTANCES: weakref.WeakKeyDictionary[nn.Module, GroupInstance] = weakref.WeakKeyDictionary()


class _Bound:
    """Mixed into a TPStyle that belongs to a NormGroup: `bind` also resolves the block's
    instance of the group."""

    spec: NormGroup
    instance: GroupInstance | None = None

    def relative(self) -> str:
        raise NotImplementedError

    def bind(self, root: nn.Module, fqn: str):
        bound = super().bind(root, fqn)
        bound.instance = self.spec.bind(root, fqn, self.relative())
        return bound

    def _instance(self) -> GroupInstance:
        if self.instance is None:
            raise PlanError(
                f"{type(self).__name__} must be applied with apply_plan, which links a norm "
                "group's modules"
            )
        return self.instance


def _stacked_bias(firsts: Sequence[nn.Linear], widths: Sequence[int]) -> torch.Tensor | None:
    """The first linears' local biases side by side (zeros for those without); None if
    none has one."""
    if all(f.bias is None for f in firsts):
        return None
    return torch.cat(
        [
            local(f.bias)
            if f.bias is not None
            else torch.zeros(w, dtype=local(f.weight).dtype, device=local(f.weight).device)
            for f, w in zip(firsts, widths, strict=True)
        ]
    )


class _GroupNorm(_Bound, TPStyle):
    """The style of a group's norm: it owns the group's instance configuration."""

    def relative(self) -> str:
        return self.spec.norm

    def configure(self, instance: GroupInstance) -> None:
        raise NotImplementedError

    def bind(self, root: nn.Module, fqn: str):
        bound = super().bind(root, fqn)
        bound.instance.norm_style = bound
        self.configure(bound.instance)
        return bound

    def kind_ok(self, module: nn.Module) -> bool:
        return is_rmsnorm_like(module)

    def kind_names(self) -> str:
        return "an RMSNorm-like module"

    def validate(self, module: nn.Module, tp: int) -> None:
        super().validate(module, tp)
        self._instance().validate(tp)


class BottleneckGroupNorm(_GroupNorm):
    """BTP for a pre-norm and its low-rank consumers (see the module docstring).

    In: the hidden state, sharded. Out: the consumers' replicated latents A_p norm(x),
    side by side (the downs' styles, `GroupMember` with ``sharding="row"``, hand each its
    own; the ups are `GroupUp`). Applied by `apply_plan`, which links the group's modules.

    Args:
        spec (NormGroup): the norm and its low-rank consumers.
        rmsnorm (str): ``"online"``: the statistic rides in the (first) down all-reduce;
            ``"sync"``: it is all-reduced on its own, forward and backward.
            Default: ``"online"``.
        grouped (bool): one GEMM and one all-reduce for the whole group; else one per
            consumer. Default: True.
        defer (bool): allow the deferred backward all-reduce (one for all the ups' input
            grads) when the group's pairs are self-contained. Default: True.

    Raises:
        ValueError: `rmsnorm` is neither ``"online"`` nor ``"sync"``.

    Example::

        >>> import torch.distributed as dist
        >>> from torch.distributed.device_mesh import init_device_mesh
        >>> from boost_titan.examples.own_model import LAYOUT, Decoder
        >>> from boost_titan.parallelize import (
        ...     BottleneckGroupNorm, GroupMember, GroupUp, NormGroup, apply_plan, btp_plan
        ... )
        >>> plan = btp_plan(LAYOUT, loss_parallel=False)
        >>> group = NormGroup("ln2", ("mlp.gate_proj", "mlp.up_proj"), low_rank=True)
        >>> plan["blocks.*.ln2"] = BottleneckGroupNorm(group, rmsnorm="sync")  # by hand
        >>> for i, pair in enumerate(group.consumers):
        ...     plan[f"blocks.*.{pair}.down"] = GroupMember(group, i, sharding="row")
        ...     plan[f"blocks.*.{pair}.up"] = GroupUp(group, i)
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> mesh = init_device_mesh("cpu", (1,))  # under torchrun: ("cuda", (tp,))
        >>> model = apply_plan(Decoder(), mesh, plan, verify=True)  # equals the unsharded
        >>> dist.destroy_process_group()
    """

    placements = {"weight": Shard(0)}

    def __init__(
        self,
        spec: NormGroup,
        *,
        rmsnorm: str = "online",
        grouped: bool = True,
        defer: bool = True,
    ) -> None:
        super().__init__()
        if rmsnorm not in RMSNORM_MODES:
            raise ValueError(f"rmsnorm must be one of {', '.join(RMSNORM_MODES)}, not {rmsnorm!r}")
        self.spec, self.rmsnorm, self.grouped, self.defer = spec, rmsnorm, grouped, defer

    def configure(self, instance: GroupInstance) -> None:
        instance.deferred = self.defer and instance.self_contained
        instance.computes_firsts = True
        instance.spans = _spans([f.out_features for f in instance.firsts])

    def _stacks(self) -> list[list[nn.Linear]]:
        firsts = self._instance().firsts
        return [list(firsts)] if self.grouped else [[f] for f in firsts]

    def gemms(self, module: nn.Module) -> list[Gemm]:
        return _first_gemms(self._instance(), self.grouped)

    def role(self, module: nn.Module, tp: int) -> Role:
        instance = self._instance()
        widths = [sum(f.out_features for f in stack) for stack in self._stacks()]
        forward: list[Collective] = [("all_reduce", w) for w in widths]
        backward: list[Collective] = [("all_reduce", w) for w in widths] * instance.deferred
        if self.rmsnorm == "online":
            forward[0] = ("all_reduce", widths[0] + 1)
        else:
            forward.insert(0, ("all_reduce", 1))
            backward.append(("all_reduce", 1))
        names = ", ".join(c.rsplit(".", 1)[-1] for c in self.spec.consumers)
        return Role(
            f"BottleneckGroupNorm({self.rmsnorm}{', grouped' * self.grouped}"
            f"{', deferred' * instance.deferred})",
            describe_placements(module, self.placements),
            "sharded",
            f"replicated latents of {names} ({sum(widths)})",
            tuple(forward),
            tuple(backward),
        )

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        group_check.watch(self._instance())
        return super()._apply(module, device_mesh)

    def _local_forward(self, module, group, x):
        instance = self._instance()
        x = local(x)
        weight, eps, dim = local(module.weight), norm_eps(module, x), norm_dim(module)
        stacks = self._stacks()
        downs = [
            torch.cat([local(f.weight) for f in s]) if len(s) > 1 else local(s[0].weight)
            for s in stacks
        ]
        if self.rmsnorm == "online":
            zs = list(
                online_rmsnorm_down(
                    x, weight, downs, dim, eps, group, self.overlap_chunks, self.f8s
                )
            )
        else:
            normed = sync_rmsnorm(x, weight, dim, eps, group)
            zs = [
                comm.row_linear(normed, w, group, self.overlap_chunks, self.f8(i))
                for i, w in enumerate(downs)
            ]
        for i, stack in enumerate(stacks):
            bias = _stacked_bias(stack, [f.out_features for f in stack])
            if bias is not None:
                zs[i] = zs[i] + bias
        if instance.deferred:
            stash = instance.new_stash()
            members = [range(len(stacks[0]))] if self.grouped else [[i] for i in range(len(zs))]
            zs = [
                comm.reduce_grad(z, group, stash, instance.stashed_weights(instance.seconds, m))
                for z, m in zip(zs, members, strict=True)
            ]
        out = zs[0] if len(zs) == 1 else torch.cat(zs, dim=-1)
        instance.hand_out(out)
        instance.record_output(out)
        return out


class ReplicatedGroupNorm(_GroupNorm):
    """Megatron / vanilla for a pre-norm and its column-parallel consumers.

    In: replicated. The norm runs replicated. Backward: one all-reduce of the norm
    output's grad for the whole group. The consumers' first linears are `GroupMember`
    with ``sharding="column"``. Applied by `apply_plan`, which links the group's modules.

    Args:
        spec (NormGroup): the norm and its consumers (nn.Linear, or low-rank pairs).
        grouped (bool): the consumers' first GEMMs run here as one GEMM on their
            concatenated weight shards and the output holds their sharded results side
            by side; else the output is the norm output and each consumer runs its own
            GEMM. Default: True.
        gather_latents (bool): vanilla LaX, whose r x r crossing needs whole latents: the
            first GEMMs run here and each latent is all-gathered, so the output holds
            replicated latents. Default: False.

    Example::

        >>> import torch.distributed as dist
        >>> from torch.distributed.device_mesh import init_device_mesh
        >>> from boost_titan.examples.own_model import LAYOUT, Decoder
        >>> from boost_titan.parallelize import (
        ...     GroupMember, NormGroup, ReplicatedGroupNorm, apply_plan, vanilla_plan
        ... )
        >>> plan = vanilla_plan(LAYOUT, loss_parallel=False)
        >>> group = NormGroup("ln1", ("attn.q_proj", "attn.k_proj", "attn.v_proj"), low_rank=True)
        >>> plan["blocks.*.ln1"] = ReplicatedGroupNorm(group, grouped=False)  # by hand
        >>> for i, pair in enumerate(group.consumers):
        ...     plan[f"blocks.*.{pair}.down"] = GroupMember(group, i, sharding="column")
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> mesh = init_device_mesh("cpu", (1,))  # under torchrun: ("cuda", (tp,))
        >>> model = apply_plan(Decoder(), mesh, plan, verify=True)  # equals the unsharded
        >>> dist.destroy_process_group()
    """

    def __init__(
        self, spec: NormGroup, *, grouped: bool = True, gather_latents: bool = False
    ) -> None:
        super().__init__()
        self.spec, self.grouped, self.gather_latents = spec, grouped, gather_latents

    def configure(self, instance: GroupInstance) -> None:
        instance.deferred = False
        instance.computes_firsts = self.grouped or self.gather_latents

    def role(self, module: nn.Module, tp: int) -> Role:
        instance = self._instance()
        names = ", ".join(c.rsplit(".", 1)[-1] for c in self.spec.consumers)
        widths = [f.out_features for f in instance.firsts]
        forward = tuple(("all_gather", w // tp) for w in widths) * self.gather_latents
        if self.gather_latents:
            output = f"replicated latents of {names} ({sum(widths)})"
        elif self.grouped:
            output = f"sharded outputs of {names} ({sum(widths) // tp} per rank)"
        else:
            output = "replicated (read by " + names + ")"
        style = f"ReplicatedGroupNorm({'grouped' if self.grouped else 'ungrouped'}" + (
            ", gather latents)" if self.gather_latents else ")"
        )
        return Role(
            style,
            describe_placements(module, self.placements),
            "replicated",
            output,
            forward,
            (("all_reduce", norm_dim(module)),),
        )

    def gemms(self, module: nn.Module) -> list[Gemm]:
        instance = self._instance()
        return _first_gemms(instance, self.grouped) if instance.computes_firsts else []

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        instance = self._instance()
        tp = device_mesh.size()
        full = [f.out_features for f in instance.firsts]
        instance.spans = _spans(full if self.gather_latents else [w // tp for w in full])
        group_check.watch(instance)
        return super()._apply(module, device_mesh)

    def _local_forward(self, module, group, x):
        instance = self._instance()
        x = local(x)
        normed = F.rms_norm(x, (norm_dim(module),), local(module.weight), norm_eps(module, x))
        if not instance.computes_firsts:
            stash = instance.new_stash()
            members = range(len(instance.firsts))
            weights = instance.stashed_weights(instance.firsts, members)
            out = comm.reduce_grad(normed, group, stash, weights)
            instance.record_output(out)
            return out
        firsts = instance.firsts
        weights = [local(f.weight) for f in firsts]
        widths = [w.shape[0] for w in weights]
        bias = _stacked_bias(firsts, widths)
        if self.grouped:
            (y,) = comm.column_linears(
                normed, [torch.cat(weights)], group, chunks=self.overlap_chunks, f8s=self.f8s
            )
            y = y + bias if bias is not None else y
            ys = list(y.split(widths, dim=-1)) if self.gather_latents else [y]
        else:
            ys = list(
                comm.column_linears(
                    normed, weights, group, chunks=self.overlap_chunks, f8s=self.f8s
                )
            )
            if bias is not None:
                ys = [y + b for y, b in zip(ys, bias.split(widths), strict=True)]
        if self.gather_latents:
            ys = [comm.gather_last(y, group) for y in ys]
        out = ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)
        instance.hand_out(out)
        instance.record_output(out)
        return out


def _first_gemms(instance: GroupInstance, grouped: bool) -> list[Gemm]:
    """The GEMMs of a group's first linears: one on their stacked weights, or one each."""
    members = range(len(instance.firsts))
    if grouped:
        return [instance.stack_gemm(members)]
    return [instance.stack_gemm([i]) for i in members]


def _spans(widths: Sequence[int]) -> list[tuple[int, int]]:
    starts = [sum(widths[:i]) for i in range(len(widths))]
    return list(zip(starts, widths, strict=True))


class GroupMember(_Bound, TPStyle):
    """The first linear of a norm group's consumer (a pair's down, or a full linear).

    In: the group's output. Out: this consumer's columns of it (replicated latent in BTP,
    sharded output in megatron / vanilla), or, when the group output is the plain norm
    output, this linear's own column-parallel GEMM of it (its input grad is reduced by the
    group). No collective of its own. Applied by `apply_plan`, which links the group's
    modules (examples: `BottleneckGroupNorm`, `ReplicatedGroupNorm`).

    Args:
        spec (NormGroup): the group this linear's module belongs to.
        index (int): the consumer's position in ``spec.consumers``.
        sharding (str): ``"row"`` (BTP downs: weight Shard(1)) or ``"column"`` (megatron
            and vanilla: weight and bias Shard(0)).
        head_dim (int | None): the outputs are attention heads of that size (a megatron
            q/k/v), which must split evenly over the ranks. Default: None.

    Raises:
        ValueError: `sharding` is neither ``"row"`` nor ``"column"``.

    Example::

        >>> from boost_titan.examples.own_model import LAYOUT
        >>> from boost_titan.parallelize import btp_plan, vanilla_plan
        >>> for build in (btp_plan, vanilla_plan):
        ...     member = build(LAYOUT)["blocks.*.attn.q_proj.down"]
        ...     print(f"{build.__name__}: {type(member).__name__}, {member.sharding}")
        btp_plan: GroupMember, row
        vanilla_plan: GroupMember, column
    """

    def __init__(
        self, spec: NormGroup, index: int, *, sharding: str, head_dim: int | None = None
    ) -> None:
        super().__init__()
        if sharding not in ("row", "column"):
            raise ValueError(f"sharding must be row or column, not {sharding!r}")
        self.spec, self.index, self.sharding, self.head_dim = spec, index, sharding, head_dim
        self.placements = (
            {"weight": Shard(1), "bias": Replicate()}
            if sharding == "row"
            else {"weight": Shard(0), "bias": Shard(0)}
        )

    def relative(self) -> str:
        return self.spec.first(self.index)

    def validate(self, module: nn.Module, tp: int) -> None:
        super().validate(module, tp)
        self._instance().validate(tp)
        check_heads(module.out_features, self.head_dim, tp)

    def role(self, module: nn.Module, tp: int) -> Role:
        instance = self._instance()
        norm = instance.norm_fqn.rsplit(".", 1)[-1]
        if self.sharding == "row":
            output = "replicated latent"
        else:
            output = "sharded"
        inputs = f"{norm} output" + (" (own columns)" if instance.computes_firsts else "")
        return Role(
            f"GroupMember({self.sharding})",
            describe_placements(module, self.placements),
            inputs,
            output,
        )

    def gemms(self, module: nn.Module) -> list[Gemm]:
        return [] if self._instance().computes_firsts else own_gemm(self, module)

    def _local_forward(self, module, group, x):
        instance = self._instance()
        if instance.computes_firsts:
            if x.shape[-1] != instance.width:
                raise PlanError(
                    f"{instance.consumer_fqns[self.index]} expects {instance.norm_fqn}'s "
                    f"output ({instance.width} features per rank), got {x.shape[-1]}; its input "
                    "does not come from that norm, fix ModelLayout.shared_inputs"
                )
            y = instance.take(self.index, x)
        else:
            y = instance.deferred_linear(local(x), module, self.index, self.f8())
        instance.record_first(self.index, x, y)
        return y


class GroupUp(_Bound, ColumnParallel):
    """A BTP group consumer's up-projection: column-parallel on its replicated latent.

    Backward: when the group is deferred (`BottleneckGroupNorm`'s `defer` and every pair
    self-contained), the input grad stays partial and the group reduces all of them at
    once; else this up all-reduces it, overlapped with its weight grad. Applied by
    `apply_plan`, which links the group's modules.

    Args:
        spec (NormGroup): the group this up's pair belongs to.
        index (int): the pair's position in ``spec.consumers``.
        head_dim (int | None): the outputs are attention heads of that size (q/k/v),
            which must split evenly over the ranks. Default: None.

    Example::

        >>> import dataclasses
        >>> import torch
        >>> import torch.distributed as dist
        >>> from torch.distributed.device_mesh import init_device_mesh
        >>> from torch.distributed.tensor.debug import CommDebugMode
        >>> from boost_titan.examples.own_model import LAYOUT, Decoder
        >>> from boost_titan.parallelize import apply_plan, btp_plan
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> mesh = init_device_mesh("cpu", (1,))  # under torchrun: ("cuda", (tp,))
        >>> for defer in (True, False):  # backward all-reduces of 4 blocks and the final norm
        ...     layout = dataclasses.replace(LAYOUT, defer_latent_grads=defer)
        ...     model = apply_plan(Decoder(), mesh, btp_plan(layout, loss_parallel=False))
        ...     logits = model(torch.randint(0, 256, (1, 8)))
        ...     with CommDebugMode() as comm:
        ...         logits.sum().backward()
        ...     print(comm.get_comm_counts()[torch.ops.c10d_functional.all_reduce])
        17
        29
        >>> dist.destroy_process_group()
    """

    def __init__(self, spec: NormGroup, index: int, *, head_dim: int | None = None) -> None:
        super().__init__(head_dim=head_dim)
        self.spec, self.index = spec, index

    def relative(self) -> str:
        return self.spec.second(self.index)

    def role(self, module: nn.Module, tp: int) -> Role:
        deferred = self._instance().deferred
        backward = () if deferred else (("all_reduce", module.in_features),)
        inputs = "replicated latent" + (" (grad reduced by norm)" if deferred else "")
        return Role(
            "GroupUp", describe_placements(module, self.placements), inputs, "sharded", (), backward
        )

    def _local_forward(self, module, group, h):
        instance = self._instance()
        h = local(h)
        if instance.deferred:
            y = instance.deferred_linear(h, module, self.index, self.f8())
        else:
            (y,) = comm.column_linears(
                h, [local(module.weight)], group, chunks=self.overlap_chunks, f8s=self.f8s
            )
            y = y + local(module.bias) if module.bias is not None else y
        instance.record_up(self.index, h, y)
        return y
