"""One CPU process plays rank 0 of a TP group: the harness of `bench trace`, `bench memory`'s
tracker and `activation_memory`.

`fake_tp_mesh` makes a mesh over a fake process group (its collectives return garbage of the
right shape, so with FakeTensorMode a 30B block runs without real memory); `shard` applies a
strategy's real TP plan to a model on it without broadcasting weights (a fake group has none
to give); `fused_rms_norm_saves` makes `F.rms_norm` keep what CUDA's fused kernel keeps, so
saved-tensor measurements on CPU count what a GPU run holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from boost_titan.boost_llama import BoostModelArgs, BoostTransformer
from boost_titan.boost_llama.strategies import build_plan
from boost_titan.config.errors import ConfigError
from boost_titan.parallelize import apply_plan
from boost_titan.perf.layout import DTYPE_ALIASES
from boost_titan.processes.teardown import end_process_groups
from boost_titan.runtime.torch_internals import replace_rms_norm

TORCH_DTYPES = {short: getattr(torch, name) for name, short in DTYPE_ALIASES.items()}
"""The compute dtypes a measurement builds its model in, by the name the commands take."""


@contextmanager
def fake_tp_mesh(tp: int, *, fsdp_dim: bool = False) -> Iterator[DeviceMesh]:
    """A CPU mesh over a fake process group of `tp` ranks; this process is rank 0. With
    `fsdp_dim` the mesh is (fsdp = 1, tp), its dims named "fsdp" and "tp"."""
    if dist.is_initialized():
        raise ConfigError("a fake TP group needs its own process group; run it outside a job")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=tp)
    try:
        if fsdp_dim:
            yield init_device_mesh("cpu", (1, tp), mesh_dim_names=("fsdp", "tp"))
        else:
            yield init_device_mesh("cpu", (tp,))
    finally:
        end_process_groups(finished=False)


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build modules in `dtype` (`Module.to` does not work under FakeTensorMode)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def shard(
    model: BoostTransformer, mesh: DeviceMesh, strategy: str, **plan_options
) -> BoostTransformer:
    """`model` under the real TP plan of `strategy` (`build_plan` with `plan_options`) on a
    fake group's `mesh` (no broadcast of weights: each rank keeps its own)."""
    plan = build_plan(strategy, model.args, **plan_options)
    return apply_plan(model, mesh, plan, src_data_rank=None)


def parallel_model(
    args: BoostModelArgs,
    strategy: str,
    mesh: DeviceMesh,
    rmsnorm: str = "online",
    group_linears: bool = True,
) -> BoostTransformer:
    """`args`' model, sharded (`shard`)."""
    model = BoostTransformer(args)
    return shard(model, mesh, strategy, rmsnorm=rmsnorm, group_linears=group_linears)


def layer_input_dim(args: BoostModelArgs, strategy: str, tp: int) -> int:
    """The residual width a block sees on one rank: BTP keeps it sharded."""
    return args.dim // tp if strategy == "btp" else args.dim


class _FusedRMSNorm(torch.autograd.Function):
    """`F.rms_norm` over the last dim with the saved tensors of CUDA's `_fused_rms_norm`
    (its derivative keeps the input, the weight and the fp32 rstd [.., 1]). On CPU,
    `rms_norm` decomposes into fp32 ops whose autograd keeps two fp32 copies of the input
    (the upcast for the square, the normalised product for the weight): twice the bytes
    of a bf16 input, which no GPU run holds."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        out = (xf * rstd).to(x.dtype)
        out = out * weight if weight is not None else out
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        xhat, g = x.to(rstd.dtype) * rstd, grad.to(rstd.dtype)
        gw = g * weight.to(rstd.dtype) if weight is not None else g
        dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        dw = None
        if weight is not None:
            dw = (g * xhat).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
        return dx.to(x.dtype), dw, None


@contextmanager
def fused_rms_norm_saves() -> Iterator[None]:
    """Route `F.rms_norm` over one (last) dim of plain tensors through `_FusedRMSNorm`,
    so that saved-tensor measurements on CPU count what a GPU run keeps."""
    original = F.rms_norm

    def rms_norm(x, normalized_shape, weight=None, eps=None):
        plain = not isinstance(x, DTensor) and not isinstance(weight, DTensor)
        if not plain or len(normalized_shape) != 1 or normalized_shape[0] != x.shape[-1]:
            return original(x, normalized_shape, weight, eps)
        return _FusedRMSNorm.apply(x, weight, torch.finfo(x.dtype).eps if eps is None else eps)

    replace_rms_norm(rms_norm)
    try:
        yield
    finally:
        replace_rms_norm(original)
