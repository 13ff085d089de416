"""The styles of a norm group's norm (`groups`' module docstring tells the mechanism):
`BottleneckGroupNorm` (BTP: one GEMM and one all-reduce of the hidden-sharded input give
every consumer's replicated latent) and `ReplicatedGroupNorm` (megatron / vanilla: the
norm replicated, the consumers' column-parallel first GEMMs as one).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard

from . import comm, group_check
from .group_members import GroupActivation
from .groups import GroupBound, GroupInstance, NormGroup
from .norm_modes import RMSNORM_MODES
from .norms import online_rmsnorm_down, sync_rmsnorm
from .styles import (
    Collective,
    Gemm,
    Role,
    TPStyle,
    describe_placements,
    is_rmsnorm_like,
    local,
    norm_dim,
    norm_eps,
)


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


class _GroupNorm(GroupBound, TPStyle):
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

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        instance = self._instance()
        instance.activation = instance.shared_activation()
        if instance.activation is not None:
            for i, act in enumerate(instance.acts):
                GroupActivation(instance, i)._apply(act, device_mesh)
        return super()._apply(module, device_mesh)


class BottleneckGroupNorm(_GroupNorm):
    """BTP for a pre-norm and its low-rank consumers (see `groups`' module docstring).

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
        out = instance.activate(zs[0] if len(zs) == 1 else torch.cat(zs, dim=-1))
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
        out = instance.activate(ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1))
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
