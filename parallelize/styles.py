"""ParallelStyles for bottleneck (low-rank) and full-rank tensor parallelism.

Every style shards the module's parameters as DTensors on the TP mesh (so FSDP2, DCP
checkpoints and resharding see ordinary DTensors) and swaps in a forward that computes on
the local shards with explicit, autograd-aware collectives from `comm`. Activations
between modules are plain local tensors; each style states the layout it expects in and
leaves out:

  * replicated : every rank holds the full tensor
  * sharded    : each rank holds its contiguous slice of the last dim
  * partial    : each rank holds a summand of the full tensor

The two linear styles are the two halves of every TP scheme:

==================  ==============  ============  ===========================
scheme              down / first    up / second   sync point
==================  ==============  ============  ===========================
Megatron (full)     ColumnParallel  RowParallel   all-reduce at d (per pair)
vanilla low-rank    ColumnParallel  RowParallel   all-reduce at d_out (per pair)
BTP                 RowParallel     ColumnParallel  all-reduce at r
==================  ==============  ============  ===========================
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle

from boost_titan.models.layers import (
    down_of,
    group_latents,
    latent_of,
    latent_or_none,
    up_of,
)

from . import comm
from .norms import online_rmsnorm_down, sync_rmsnorm


def local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (differentiable), or the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def _dim(norm: nn.Module) -> int:
    """The full (unsharded) hidden size a norm normalises over."""
    return norm.normalized_shape[-1]


def _norm_eps(norm: nn.Module, x: torch.Tensor) -> float:
    return norm.eps if norm.eps is not None else torch.finfo(x.dtype).eps


class _ShardParams(ParallelStyle):
    """Distributes the named parameters with the given placements and installs a forward."""

    placements: dict[str, Placement] = {}

    def _distribute(self, module: nn.Module, mesh: DeviceMesh) -> None:
        for name, param in list(module.named_parameters(recurse=False)):
            placement = self.placements.get(name, Replicate())
            dtensor = distribute_tensor(
                param.data, mesh, [placement], src_data_rank=self.src_data_rank
            )
            module.register_parameter(name, nn.Parameter(dtensor, param.requires_grad))

    def _local_forward(self, module: nn.Module, group, *args, **kwargs):
        raise NotImplementedError

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        self._distribute(module, device_mesh)
        group = device_mesh.get_group()
        style = self

        def forward(mod, *args, **kwargs):
            return style._local_forward(mod, group, *args, **kwargs)

        module.forward = types.MethodType(forward, module)
        return module


def _check_type(module: nn.Module, types_: tuple[type, ...], style: str) -> None:
    if not isinstance(module, types_):
        names = ", ".join(t.__name__ for t in types_)
        raise TypeError(f"{style} applies to {names}, not {type(module).__name__}")


class ColumnParallel(_ShardParams):
    """nn.Linear with its output features sharded (weight Shard(0)).

    In: replicated. Out: sharded (or replicated with `gather_output`; or a
    `DTensor(Shard(-1))` with `output_dtensor`, for loss-parallel cross-entropy).
    Backward: the input grad is a partial sum; `reduce_input_grad` all-reduces it here,
    overlapped with the weight-grad GEMM. Turn it off when the module's weights are used
    by a normed-projections style (which reduces a whole group's input grad at once) or
    when the producer of the input reduce-scatters the grad.
    """

    placements = {"weight": Shard(0), "bias": Shard(0)}

    def __init__(
        self,
        *,
        reduce_input_grad: bool = True,
        gather_output: bool = False,
        output_dtensor: bool = False,
    ) -> None:
        super().__init__()
        self.reduce_input_grad = reduce_input_grad
        self.gather_output = gather_output
        self.output_dtensor = output_dtensor

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        _check_type(module, (nn.Linear,), "ColumnParallel")
        self.mesh = device_mesh
        return super()._apply(module, device_mesh)

    def _local_forward(self, module, group, x):
        x, weight = local(x), local(module.weight)
        if self.reduce_input_grad:
            (y,) = comm.column_linears(x, [weight], group)
        else:
            y = F.linear(x, weight)
        if module.bias is not None:
            y = y + local(module.bias)
        if self.gather_output:
            return comm.gather_last(y, group)
        if self.output_dtensor:
            return DTensor.from_local(y, self.mesh, [Shard(-1)], run_check=False)
        return y


class RowParallel(_ShardParams):
    """nn.Linear with its input features sharded (weight Shard(1)).

    In: sharded (or replicated with `split_input`, which takes this rank's slice).
    Out: replicated, through one all-reduce of the partial products. Backward: no
    collective (the replicated output grad is every partial's grad).
    """

    placements = {"weight": Shard(1), "bias": Replicate()}

    def __init__(self, *, split_input: bool = False) -> None:
        super().__init__()
        self.split_input = split_input

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        _check_type(module, (nn.Linear,), "RowParallel")
        return super()._apply(module, device_mesh)

    def _local_forward(self, module, group, x):
        x = local(x)
        if self.split_input:
            x = comm.split_last(x, group)
        y = comm.sum_partials(F.linear(x, local(module.weight)), group)
        return y + local(module.bias) if module.bias is not None else y


class Replicated(_ShardParams):
    """Parameters replicated on every rank; the module runs on local tensors, no collective.

    Supports nn.Linear, nn.Embedding, nn.LayerNorm and nn.RMSNorm. Use it only where the
    input and its gradient are replicated too (otherwise the weight grad would be partial).
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        _check_type(
            module, (nn.Linear, nn.Embedding, nn.LayerNorm, nn.RMSNorm), "Replicated"
        )
        return super()._apply(module, device_mesh)

    def _local_forward(self, module, group, x, *args):
        w = local(module.weight) if module.weight is not None else None
        if isinstance(module, nn.Linear):
            bias = local(module.bias) if module.bias is not None else None
            return F.linear(local(x), w, bias)
        if isinstance(module, nn.Embedding):
            return F.embedding(local(x), w)
        if isinstance(module, nn.LayerNorm):
            bias = local(module.bias) if module.bias is not None else None
            return F.layer_norm(local(x), module.normalized_shape, w, bias, module.eps)
        return F.rms_norm(local(x), module.normalized_shape, w, module.eps)


class ShardedEmbedding(_ShardParams):
    """nn.Embedding sharded along the embedding dim (weight Shard(1)).

    In: replicated token ids. Out: the hidden state sharded along its last dim, looked up
    locally: no collective forward or backward. This is how BTP's residual stream enters.
    """

    placements = {"weight": Shard(1)}

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        _check_type(module, (nn.Embedding,), "ShardedEmbedding")
        return super()._apply(module, device_mesh)

    def _local_forward(self, module, group, tokens):
        return F.embedding(local(tokens), local(module.weight))


class ShardedRMSNorm(_ShardParams):
    """nn.RMSNorm over a sharded hidden dim (weight Shard(0)), sync flavour.

    In: sharded. Out: sharded; with `gather_output` replicated through one all-gather whose
    backward is a reduce-scatter (the consumer is column-parallel, so its grad is partial).
    Collectives: the [tokens, 1] sum of squares, all-reduced forward and backward.
    """

    placements = {"weight": Shard(0)}

    def __init__(self, *, gather_output: bool = False) -> None:
        super().__init__()
        self.gather_output = gather_output

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        _check_type(module, (nn.RMSNorm,), "ShardedRMSNorm")
        return super()._apply(module, device_mesh)

    def _local_forward(self, module, group, x):
        x = local(x)
        y = sync_rmsnorm(x, local(module.weight), _dim(module), _norm_eps(module, x), group)
        return comm.gather_last_reduce_scatter_grad(y, group) if self.gather_output else y


class BottleneckNormedProjections(_ShardParams):
    """BTP for a `NormedProjections`: sharded-input RMSNorm fused with its down-projections.

    In: the hidden state, sharded. The down-projections passed at call time must be
    row-parallel (their weights Shard(1), e.g. by `RowParallel` entries of the same plan).
    Forward: the norm's statistic is reduced once and each group of projections (q,k,v or
    gate,up with grouping; each projection on its own without) runs one GEMM on local
    shards and ONE all-reduce that returns its replicated low-rank latents. With
    `rmsnorm="online"` the statistic rides in the first group's all-reduce (grouped:
    3r+1 / 2r+1 elements per token; ungrouped: r+1 for q and gate, r for the others), in
    the activation dtype; `"sync"` all-reduces it on its own first ([T, 1] forward and
    backward) and shares the normalised shard between the groups. Latent activations and
    LaX crossing then run replicated, and each group's up-projections run here as one
    `comm.column_linears` on the concatenated latents: a single backward all-reduce per
    group, overlapped with the ups' weight grads (their own ColumnParallel entries,
    `reduce_input_grad=False`, only shard the weights). Out: the up-projections'
    outputs, sharded, and the replicated latents.
    """

    placements = {"weight": Shard(0)}

    def __init__(self, *, rmsnorm: str = "online") -> None:
        super().__init__()
        if rmsnorm not in ("online", "sync"):
            raise ValueError(f"rmsnorm must be online or sync, not {rmsnorm!r}")
        self.rmsnorm = rmsnorm

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        _check_type(module, (nn.RMSNorm,), "BottleneckNormedProjections")
        return super()._apply(module, device_mesh)

    def _local_forward(self, module, group, x, projections=None, prevs=None):
        x = local(x)
        weight, eps = local(module.weight), _norm_eps(module, x)
        if projections is None:
            return sync_rmsnorm(x, weight, _dim(module), eps, group)
        groups = [list(projections)] if module.grouped else [[p] for p in projections]
        zs = self._down(x, weight, _dim(module), eps, groups, group)
        prevs = iter(prevs or [None] * len(projections))
        outputs, latents = [], []
        for members, z in zip(groups, zs):
            h, hs = group_latents(members, z, [next(prevs) for _ in members])
            # the ups' partial input grads: one all-reduce per group; the latents handed
            # to the next block's crossing bypass it (their grads are replicated)
            ups = comm.column_linears(h, [local(p.up.weight) for p in members], group,
                                      split_input=True)
            outputs += [y if p.up.bias is None else y + local(p.up.bias)
                        for y, p in zip(ups, members)]
            latents += hs
        return outputs, latents

    def _down(self, x, weight, dim, eps, groups, group) -> list[torch.Tensor]:
        """Replicated [z_p for p in group] = A_p norm(x), concatenated, for every group of
        projections: one stacked GEMM and one all-reduce each; the norm's statistic is
        reduced once."""
        downs = [[local(down_of(p).weight) for p in g] for g in groups]
        stacked = [torch.cat(d) if len(d) > 1 else d[0] for d in downs]
        if self.rmsnorm == "online":
            zs = online_rmsnorm_down(x, weight, stacked, dim, eps, group)
        else:
            normed = sync_rmsnorm(x, weight, dim, eps, group)
            zs = [comm.sum_partials(F.linear(normed, w), group) for w in stacked]
        return list(zs)


class ColumnNormedProjections(_ShardParams):
    """Megatron / vanilla for a `NormedProjections`: replicated norm, column-parallel projections.

    In: replicated hidden state. The projections passed at call time must be
    column-parallel (weights Shard(0), e.g. `ColumnParallel(reduce_input_grad=False)`
    entries); their first GEMMs run here as one `comm.column_linears` on the norm output:
    a single backward all-reduce for the group, overlapped with the weight grads. Out:
    each projection's output (sharded for a full linear; replicated after a low-rank
    pair's row-parallel up) and its latent, sharded along r; with
    `gather_latents` (vanilla LaX, whose crossing needs whole latents) the pre-activation
    latent is all-gathered and the latent is replicated.
    """

    def __init__(self, *, gather_latents: bool = False) -> None:
        super().__init__()
        self.gather_latents = gather_latents

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        _check_type(module, (nn.RMSNorm,), "ColumnNormedProjections")
        return super()._apply(module, device_mesh)

    def _local_forward(self, module, group, x, projections=None, prevs=None):
        x = local(x)
        normed = F.rms_norm(x, module.normalized_shape, local(module.weight), module.eps)
        if projections is None:
            return normed
        downs = [local(down_of(p).weight) for p in projections]
        if module.grouped:
            (fused,) = comm.column_linears(normed, [torch.cat(downs)], group)
            zs = fused.split([d.shape[0] for d in downs], -1)
        else:
            zs = comm.column_linears(normed, downs, group)
        if self.gather_latents:
            zs = [comm.gather_last(z, group) for z in zs]
        prevs = prevs or [None] * len(projections)
        latents = [latent_of(p, z, h) for p, z, h in zip(projections, zs, prevs)]
        outputs = [up_of(p, h) for p, h in zip(projections, latents)]
        return outputs, [latent_or_none(p, h) for p, h in zip(projections, latents)]
