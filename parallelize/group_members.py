"""The styles of a norm group's consumers (`groups`' module docstring tells the mechanism):
`GroupMember` (a consumer's first linear: its columns of the group output), `GroupUp` (a
BTP pair's up-projection, whose input grad the group may reduce for all the ups at once)
and `GroupActivation` (a pair's activation, when the group applies it once for all).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard

from . import comm
from .groups import GroupBound, GroupInstance, NormGroup
from .styles import (
    ColumnParallel,
    Gemm,
    PlanError,
    Role,
    TPStyle,
    check_heads,
    describe_placements,
    local,
    own_gemm,
)


class GroupMember(GroupBound, TPStyle):
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


class GroupUp(GroupBound, ColumnParallel):
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


class GroupActivation(TPStyle):
    """A consumer pair's activation module when its group applies that activation once to
    its whole output (`GroupInstance.shared_activation`): it returns its input, which is
    already this consumer's columns of the activated output. Applied by the group's norm
    style, not listed in plans: the group applies the activation only where it installed
    this, so nothing gets it twice.

    Args:
        instance (GroupInstance): the block's group.
        index (int): the consumer's position in the group.
    """

    module_kinds = (nn.Module,)

    def __init__(self, instance: GroupInstance, index: int) -> None:
        super().__init__()
        self.instance, self.index = instance, index

    def role(self, module: nn.Module, tp: int) -> Role:
        norm = self.instance.norm_fqn.rsplit(".", 1)[-1]
        return Role("GroupActivation", "-", "activated latent", f"as is (applied by {norm})")

    def _local_forward(self, module, group, z):
        self.instance.record_activation(self.index, z)
        return z
