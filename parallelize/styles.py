"""ParallelStyles for single modules: linears, embeddings and norms.

Every style shards the module's parameters as DTensors on the TP mesh (so FSDP2, DCP
checkpoints and resharding see ordinary DTensors) and swaps in a forward that computes on
the local shards with explicit, autograd-aware collectives from `comm`. Activations
between modules are plain local tensors, in one of three layouts:

  * replicated : every rank holds the full tensor
  * sharded    : each rank holds its contiguous slice of the last dim
  * partial    : each rank holds a summand of the full tensor

The two linear styles are the two halves of every TP scheme:

==================  ==============  ==============  ===========================
scheme              first linear    second linear   sync point
==================  ==============  ==============  ===========================
Megatron (full)     ColumnParallel  RowParallel     all-reduce at d (per pair)
vanilla low-rank    ColumnParallel  RowParallel     all-reduce at d_out (per pair)
BTP                 RowParallel     ColumnParallel  all-reduce at r
==================  ==============  ==============  ===========================

Styles that need to see several modules at once (a pre-norm and its consumers) live in
`groups`. Every style can `validate` a module before anything is touched and `describe`
what it does to it (one row of `describe.plan_table`).
"""

from __future__ import annotations

import copy
import types
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Placement,
    Replicate,
    Shard,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import ParallelStyle

from boost_titan.kernels import float8
from boost_titan.kernels.float8 import Float8

from . import comm
from .norms import sync_rmsnorm

Collective = tuple[str, int]
"""(kind, elements per token of each rank's input buffer), e.g. ("all_reduce", 97)."""


class PlanError(ValueError):
    """A plan does not fit a model; the message names the module and the fix in one line.

    Raised by the plan builders, `resolve_plan`, `apply_plan`, `plan_table`,
    `verify_plan` and, while the model runs, by the styles themselves (a module called
    with another input than the layout says). A ValueError: catch it to report the line
    without a traceback.

    Example::

        >>> from boost_titan.examples.own_model import Decoder
        >>> from boost_titan.parallelize import PlanError, btp_plan, resolve_plan
        >>> try:  # the default layout names TorchTitan's Llama modules
        ...     resolve_plan(Decoder(), btp_plan(), tp=2)
        ... except PlanError as e:
        ...     print(e)
        plan key 'tok_embeddings' matches no module of Decoder; fix the FQN in ModelLayout
    """


@dataclass(frozen=True)
class Role:
    """What a style does to one module: one row of the plan table."""

    style: str
    weights: str
    inputs: str
    output: str
    forward: tuple[Collective, ...] = ()
    backward: tuple[Collective, ...] = ()
    weight_grads: tuple[Collective, ...] = ()
    """Backward collectives of weight grads: (kind, elements per call, NOT per token)."""


@dataclass(frozen=True)
class Gemm:
    """One weight GEMM a style runs on each rank: the modules it computes (several for a
    group's concatenated weight) and the local weight shape [out_features, in_features]."""

    fqns: tuple[str, ...]
    out_features: int
    in_features: int


def local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (differentiable), or the tensor itself."""
    return t.to_local() if isinstance(t, DTensor) else t


NORM_EPS_ATTRIBUTES = ("eps", "variance_epsilon")
"""Where RMSNorm-like modules keep their epsilon (torch's nn.RMSNorm; Hugging Face's)."""


def is_rmsnorm_like(module: nn.Module) -> bool:
    """nn.RMSNorm, or any module with a 1-D `weight` and an epsilon attribute and no bias:
    its output is taken to be ``x / rms(x) * weight`` over the last dim."""
    weight = getattr(module, "weight", None)
    return (
        isinstance(weight, torch.Tensor)
        and weight.dim() == 1
        and getattr(module, "bias", None) is None
        and any(hasattr(module, a) for a in NORM_EPS_ATTRIBUTES)
    )


def norm_eps(module: nn.Module, x: torch.Tensor) -> float:
    """The epsilon of an RMSNorm-like module (None: the dtype's machine epsilon, as
    nn.RMSNorm does)."""
    for attribute in NORM_EPS_ATTRIBUTES:
        if hasattr(module, attribute):
            eps = getattr(module, attribute)
            return torch.finfo(x.dtype).eps if eps is None else float(eps)
    raise AttributeError(f"{type(module).__name__} has no epsilon attribute")


def norm_dim(module: nn.Module) -> int:
    """The full (unsharded) hidden size an RMSNorm-like module normalises over."""
    return module.weight.shape[0]


def describe_placements(module: nn.Module, placements: dict[str, Placement]) -> str:
    names = [n for n, _ in module.named_parameters(recurse=False)]
    if not names:
        return "-"
    return ", ".join(f"{n} {placements.get(n, Replicate())}" for n in names)


class TPStyle(ParallelStyle):
    """Distributes a module's own parameters with `placements` (Replicate by default) and
    installs a forward on local tensors. Subclasses set `module_kinds` and implement
    `_local_forward` and `role`."""

    placements: dict[str, Placement] = {}
    module_kinds: tuple[type, ...] = (nn.Linear,)
    fqn: str = ""
    """The module this copy of the style is for (set by `bind`), named in errors."""
    overlap_chunks: int = 1
    """Row blocks of the collectives this style overlaps with its GEMMs (`apply_plan` sets it)."""
    f8s: tuple[Float8 | None, ...] = ()
    """A float8 recipe or None per GEMM of `gemms` (`parallelize.float8.apply_float8` sets
    it after the plan is applied); empty: all in high precision."""

    def bind(self, root: nn.Module, fqn: str) -> TPStyle:
        """This style for module `fqn` of `root` (`resolve_plan` binds every match)."""
        bound = copy.copy(self)
        bound.fqn = fqn
        return bound

    # ---- checks and description, before anything is touched ----------------------------
    def kind_ok(self, module: nn.Module) -> bool:
        return isinstance(module, self.module_kinds)

    def kind_names(self) -> str:
        return " or ".join(t.__name__ for t in self.module_kinds)

    def validate(self, module: nn.Module, tp: int) -> None:
        """Raise PlanError (message without the FQN) if this style cannot shard `module`."""
        if not self.kind_ok(module):
            raise PlanError(
                f"{type(self).__name__} applies to {self.kind_names()}, "
                f"not {type(module).__name__}; fix the layout's FQN or the module"
            )
        for name, param in module.named_parameters(recurse=False):
            placement = self.placements.get(name, Replicate())
            if isinstance(placement, Shard) and param.shape[placement.dim] % tp:
                raise PlanError(
                    f"{name} dim {placement.dim} of size {param.shape[placement.dim]} does "
                    f"not split over TP {tp}; choose a TP degree that divides it"
                )

    def role(self, module: nn.Module, tp: int) -> Role:
        raise NotImplementedError

    def gemms(self, module: nn.Module) -> list[Gemm]:
        """The weight GEMMs this style runs for `module` on this rank (after `_apply`)."""
        return []

    def f8(self, index: int = 0) -> Float8 | None:
        """The float8 recipe of GEMM `index` of `gemms`, or None."""
        return self.f8s[index] if self.f8s else None

    def check_input(self, x: torch.Tensor, features: int) -> None:
        """Raise PlanError unless x holds `features` per rank: the model feeds this module
        another tensor than the layout says (e.g. a norm output it does not list)."""
        if x.shape[-1] != features:
            raise PlanError(
                f"{self.fqn or type(self).__name__} takes {features} input features per rank "
                f"under this plan but got {x.shape[-1]}: its input is not what ModelLayout "
                "says; list every module that reads a norm's output in shared_inputs"
            )

    # ---- application --------------------------------------------------------------------
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
        _APPLIED[module] = self
        return module


_APPLIED: weakref.WeakKeyDictionary[nn.Module, TPStyle] = weakref.WeakKeyDictionary()


def applied_style(module: nn.Module) -> TPStyle | None:
    """The style that `apply_plan` applied to `module`, if any."""
    return _APPLIED.get(module)


def own_gemm(style: TPStyle, module: nn.Module) -> list[Gemm]:
    """The one GEMM of a style that runs `module`'s own (local) weight."""
    return [Gemm((style.fqn,), *local(module.weight).shape)]


def linear(x: torch.Tensor, module: nn.Linear, f8: Float8 | None = None) -> torch.Tensor:
    """F.linear with the module's local weight and bias shards (in float8 with `f8`)."""
    if f8 is None:
        bias = local(module.bias) if module.bias is not None else None
        return F.linear(x, local(module.weight), bias)
    y = float8.linear(x, local(module.weight), f8)
    return y + local(module.bias) if module.bias is not None else y


class ColumnParallel(TPStyle):
    """nn.Linear with its output features sharded (weight and bias Shard(0)).

    In: replicated. Out: sharded along the last dim. Backward: the input grad is a
    partial sum. Megatron's first linear, BTP's B (``up``).

    Args:
        reduce_input_grad (bool): all-reduce the input grad here, overlapped with the
            weight-grad GEMM. Turn it off when the producer of the input reduces it (a
            norm group, or an all-gather whose backward reduce-scatters). Default: True.
        gather_output (bool): all-gather the output, so it is replicated.
            Default: False.
        output_dtensor (bool): return the output as a ``DTensor(Shard(-1))``, for a
            loss-parallel cross-entropy. Default: False.
        head_dim (int | None): the outputs are attention heads of that size, which must
            split evenly over the ranks (0: of a size not given, refused under TP).
            Default: None.

    Example::

        >>> import torch
        >>> import torch.distributed as dist
        >>> from torch import nn
        >>> from torch.distributed.device_mesh import init_device_mesh
        >>> from boost_titan.parallelize import ColumnParallel, RowParallel, apply_plan
        >>> mlp = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16))
        >>> x = torch.randn(4, 16)
        >>> want = mlp(x)
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> mesh = init_device_mesh("cpu", (1,))  # under torchrun: ("cuda", (tp,))
        >>> mlp = apply_plan(mlp, mesh, {"0": ColumnParallel(), "2": RowParallel()})
        >>> mlp[0].weight.placements, mlp[0].bias.placements
        ((Shard(dim=0),), (Shard(dim=0),))
        >>> torch.allclose(mlp(x), want)
        True
        >>> dist.destroy_process_group()
    """

    placements = {"weight": Shard(0), "bias": Shard(0)}

    def __init__(
        self,
        *,
        reduce_input_grad: bool = True,
        gather_output: bool = False,
        output_dtensor: bool = False,
        head_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.reduce_input_grad = reduce_input_grad
        self.gather_output = gather_output
        self.output_dtensor = output_dtensor
        self.head_dim = head_dim

    def validate(self, module: nn.Module, tp: int) -> None:
        super().validate(module, tp)
        check_heads(module.out_features, self.head_dim, tp)

    def role(self, module: nn.Module, tp: int) -> Role:
        n_in, n_out = module.in_features, module.out_features
        output = "sharded"
        forward: tuple[Collective, ...] = ()
        if self.gather_output:
            output, forward = "replicated", (("all_gather", n_out // tp),)
        elif self.output_dtensor:
            output = "DTensor Shard(-1)"
        backward = (("all_reduce", n_in),) if self.reduce_input_grad else ()
        inputs = "replicated" if self.reduce_input_grad else "replicated (grad reduced by producer)"
        return Role(
            "ColumnParallel",
            describe_placements(module, self.placements),
            inputs,
            output,
            forward,
            backward,
        )

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        self.mesh = device_mesh
        return super()._apply(module, device_mesh)

    def gemms(self, module: nn.Module) -> list[Gemm]:
        return own_gemm(self, module)

    def _local_forward(self, module, group, x):
        x = local(x)
        self.check_input(x, module.in_features)
        if self.reduce_input_grad:
            (y,) = comm.column_linears(
                x, [local(module.weight)], group, chunks=self.overlap_chunks, f8s=self.f8s
            )
            y = y + local(module.bias) if module.bias is not None else y
        else:
            y = linear(x, module, self.f8())
        if self.gather_output:
            return comm.gather_last(y, group)
        if self.output_dtensor:
            return DTensor.from_local(y, self.mesh, [Shard(-1)], run_check=False)
        return y


class RowParallel(TPStyle):
    """nn.Linear with its input features sharded (weight Shard(1), bias Replicate).

    In: sharded. Out: replicated, through one all-reduce of the partial products.
    Backward: no collective (the replicated output grad is every partial's grad).
    Megatron's second linear, BTP's A (``down``): there the all-reduce is r wide.

    Args:
        split_input (bool): the input is replicated; take this rank's slice of it (its
            backward all-gathers the input grad). Default: False.
        head_dim (int | None): the inputs are attention heads of that size, which must
            split evenly over the ranks. Default: None.

    Example::

        >>> from torch import nn
        >>> from boost_titan.parallelize import ColumnParallel, RowParallel, plan_table
        >>> pair = nn.Sequential(nn.Linear(64, 8, bias=False), nn.Linear(8, 64, bias=False))
        >>> print(plan_table(pair, {"0": RowParallel(), "1": ColumnParallel()}, tp=2))
        module  style           weights      in          out         forward       backward
        ------  --------------  -----------  ----------  ----------  ------------  ------------
        0       RowParallel     weight S(1)  sharded     replicated  all-reduce 8  -
        1       ColumnParallel  weight S(0)  replicated  sharded     -             all-reduce 8
    """

    placements = {"weight": Shard(1), "bias": Replicate()}

    def __init__(self, *, split_input: bool = False, head_dim: int | None = None) -> None:
        super().__init__()
        self.split_input = split_input
        self.head_dim = head_dim

    def validate(self, module: nn.Module, tp: int) -> None:
        super().validate(module, tp)
        check_heads(module.in_features, self.head_dim, tp)

    def role(self, module: nn.Module, tp: int) -> Role:
        n_in, n_out = module.in_features, module.out_features
        inputs = "replicated (own slice taken)" if self.split_input else "sharded"
        backward = (("all_gather", n_in // tp),) if self.split_input else ()
        return Role(
            "RowParallel",
            describe_placements(module, self.placements),
            inputs,
            "replicated",
            (("all_reduce", n_out),),
            backward,
        )

    def gemms(self, module: nn.Module) -> list[Gemm]:
        return own_gemm(self, module)

    def _local_forward(self, module, group, x):
        x, weight = local(x), local(module.weight)
        self.check_input(x, module.in_features if self.split_input else weight.shape[1])
        if self.split_input:
            x = comm.split_last(x, group)
        y = comm.row_linear(x, weight, group, self.overlap_chunks, self.f8())
        return y + local(module.bias) if module.bias is not None else y


class Replicated(TPStyle):
    """Parameters replicated on every rank; the module runs on local tensors, no collective.

    Supports nn.Linear, nn.Embedding, nn.LayerNorm and RMSNorm-like modules. Use it only
    where the input and its gradient are replicated too (otherwise the weight grad would
    be partial): the embedding and final norm of megatron and vanilla plans.

    Args:
        optional (bool): the plan key may match no module (LaX's crossing modules, absent
            from the first block). Default: False.

    Example::

        >>> from torch import nn
        >>> from boost_titan.parallelize import ColumnParallel, Replicated, plan_table
        >>> model = nn.Sequential(
        ...     nn.Embedding(32, 16), nn.RMSNorm(16), nn.Linear(16, 32, bias=False)
        ... )
        >>> plan = {"0": Replicated(), "1": Replicated(), "2": ColumnParallel(gather_output=True)}
        >>> print(plan_table(model, plan, tp=2))
        module  style           weights      in          out         forward        backward
        ------  --------------  -----------  ----------  ----------  -------------  -------------
        0       Replicated      weight R     tokens      replicated  -              -
        1       Replicated      weight R     replicated  replicated  -              -
        2       ColumnParallel  weight S(0)  replicated  replicated  all-gather 16  all-reduce 16
    """

    module_kinds = (nn.Linear, nn.Embedding, nn.LayerNorm)

    def __init__(self, *, optional: bool = False) -> None:
        super().__init__()
        self.optional = optional

    def kind_ok(self, module: nn.Module) -> bool:
        return super().kind_ok(module) or is_rmsnorm_like(module)

    def kind_names(self) -> str:
        return super().kind_names() + " or an RMSNorm-like module"

    def role(self, module: nn.Module, tp: int) -> Role:
        inputs = "tokens" if isinstance(module, nn.Embedding) else "replicated"
        return Role(
            "Replicated", describe_placements(module, self.placements), inputs, "replicated"
        )

    def gemms(self, module: nn.Module) -> list[Gemm]:
        return own_gemm(self, module) if isinstance(module, nn.Linear) else []

    def _local_forward(self, module, group, x, *args):
        x = local(x)
        if isinstance(module, nn.Linear):
            return linear(x, module, self.f8())
        if isinstance(module, nn.Embedding):
            return F.embedding(x, local(module.weight))
        if isinstance(module, nn.LayerNorm):
            weight = local(module.weight) if module.weight is not None else None
            bias = local(module.bias) if module.bias is not None else None
            return F.layer_norm(x, module.normalized_shape, weight, bias, module.eps)
        return F.rms_norm(x, (norm_dim(module),), local(module.weight), norm_eps(module, x))


class HeadNorm(TPStyle):
    """An RMSNorm-like module applied to each attention head (Qwen3's q_norm, k_norm: weight
    [head_dim]) where the heads are sharded over the ranks (megatron, BTP).

    Weight Replicate. In: this rank's heads. Out: the same heads normalised; no activation
    collective. Each rank's weight grad sums over its own heads only, so it is all-reduced
    in backward (``comm.reduce_grad`` on the weight: head_dim elements per call, whatever
    the number of tokens; `Role.weight_grads`). Where every rank holds all heads (vanilla)
    the norm is `Replicated`. Takes no arguments.

    Example::

        >>> import torch
        >>> import torch.distributed as dist
        >>> from torch import nn
        >>> from torch.distributed.device_mesh import init_device_mesh
        >>> from boost_titan.parallelize import HeadNorm, apply_plan, plan_table
        >>> norm = nn.Sequential(nn.RMSNorm(8))  # e.g. Qwen3's self_attn.q_norm
        >>> print(plan_table(norm, {"0": HeadNorm()}, tp=2))
        module  style     weights   in       out      forward  backward
        ------  --------  --------  -------  -------  -------  --------------------------
        0       HeadNorm  weight R  sharded  sharded  -        all-reduce 8 (weight grad)
        >>> heads = torch.randn(2, 5, 4, 8)  # [batch, seq, heads, head_dim]
        >>> want = norm(heads)
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> norm = apply_plan(norm, init_device_mesh("cpu", (1,)), {"0": HeadNorm()})
        >>> torch.allclose(norm(heads), want)
        True
        >>> dist.destroy_process_group()
    """

    def kind_ok(self, module: nn.Module) -> bool:
        return is_rmsnorm_like(module)

    def kind_names(self) -> str:
        return "an RMSNorm-like module (1-D weight, eps, no bias)"

    def role(self, module: nn.Module, tp: int) -> Role:
        return Role(
            "HeadNorm",
            describe_placements(module, self.placements),
            "sharded",
            "sharded",
            weight_grads=(("all_reduce", norm_dim(module)),),
        )

    def _local_forward(self, module, group, x):
        x = local(x)
        weight = comm.reduce_grad(local(module.weight), group)
        return F.rms_norm(x, (norm_dim(module),), weight, norm_eps(module, x))


class ShardedEmbedding(TPStyle):
    """nn.Embedding sharded along the embedding dim (weight Shard(1)).

    In: replicated token ids. Out: the hidden state sharded along its last dim, looked up
    locally: no collective forward or backward. This is how BTP's residual stream enters.
    Takes no arguments.

    Example::

        >>> from torch import nn
        >>> from boost_titan.parallelize import ShardedEmbedding, ShardedRMSNorm, plan_table
        >>> model = nn.Sequential(nn.Embedding(32, 16), nn.RMSNorm(16))
        >>> print(plan_table(model, {"0": ShardedEmbedding(), "1": ShardedRMSNorm()}, tp=2))
        module  style             weights      in       out      forward       backward
        ------  ----------------  -----------  -------  -------  ------------  ------------
        0       ShardedEmbedding  weight S(1)  tokens   sharded  -             -
        1       ShardedRMSNorm    weight S(0)  sharded  sharded  all-reduce 1  all-reduce 1
    """

    placements = {"weight": Shard(1)}
    module_kinds = (nn.Embedding,)

    def role(self, module: nn.Module, tp: int) -> Role:
        return Role(
            "ShardedEmbedding", describe_placements(module, self.placements), "tokens", "sharded"
        )

    def _local_forward(self, module, group, tokens):
        return F.embedding(local(tokens), local(module.weight))


class ShardedRMSNorm(TPStyle):
    """An RMSNorm-like module over a sharded hidden dim (weight Shard(0)), sync flavour.

    In: sharded. Out: sharded. Collectives: the [tokens, 1] sum of squares, all-reduced
    forward and backward. BTP's final norm.

    Args:
        gather_output (bool): make the output replicated through one all-gather whose
            backward is a reduce-scatter (the consumer is column-parallel, so its grad is
            partial). Default: False.

    Example::

        >>> import torch
        >>> import torch.distributed as dist
        >>> from torch import nn
        >>> from torch.distributed.device_mesh import init_device_mesh
        >>> from boost_titan.parallelize import (
        ...     ColumnParallel, ShardedEmbedding, ShardedRMSNorm, apply_plan
        ... )
        >>> model = nn.Sequential(nn.Embedding(32, 16), nn.RMSNorm(16), nn.Linear(16, 32))
        >>> tokens = torch.randint(0, 32, (2, 8))
        >>> want = model(tokens)
        >>> plan = {  # how BTP's residual stream enters and leaves
        ...     "0": ShardedEmbedding(),
        ...     "1": ShardedRMSNorm(gather_output=True),
        ...     "2": ColumnParallel(reduce_input_grad=False, gather_output=True),
        ... }
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> model = apply_plan(model, init_device_mesh("cpu", (1,)), plan)
        >>> torch.allclose(model(tokens), want)
        True
        >>> dist.destroy_process_group()
    """

    placements = {"weight": Shard(0)}

    def __init__(self, *, gather_output: bool = False) -> None:
        super().__init__()
        self.gather_output = gather_output

    def kind_ok(self, module: nn.Module) -> bool:
        return is_rmsnorm_like(module)

    def kind_names(self) -> str:
        return "an RMSNorm-like module (1-D weight, eps, no bias)"

    def role(self, module: nn.Module, tp: int) -> Role:
        d = norm_dim(module)
        forward: tuple[Collective, ...] = (("all_reduce", 1),)
        backward: tuple[Collective, ...] = (("all_reduce", 1),)
        output = "sharded"
        if self.gather_output:
            output = "replicated"
            forward += (("all_gather", d // tp),)
            backward += (("reduce_scatter", d),)
        return Role(
            "ShardedRMSNorm",
            describe_placements(module, self.placements),
            "sharded",
            output,
            forward,
            backward,
        )

    def _local_forward(self, module, group, x):
        x = local(x)
        y = sync_rmsnorm(x, local(module.weight), norm_dim(module), norm_eps(module, x), group)
        return comm.gather_last_reduce_scatter_grad(y, group) if self.gather_output else y


def check_heads(features: int, head_dim: int | None, tp: int) -> None:
    """Attention heads of `head_dim` in `features` must split evenly over `tp` ranks
    (None: no attention heads; 0: heads of an unknown size, refused under TP)."""
    if head_dim is None or tp == 1:
        return
    if head_dim == 0:
        raise PlanError(
            f"its attention heads cannot be checked to split over TP {tp}: ModelLayout.head_dim "
            "is 0; set it to the size of one head (hf_layout reads it from a transformers config)"
        )
    if features % head_dim:
        raise PlanError(
            f"{features} features are not a whole number of heads of {head_dim}; "
            "fix ModelLayout.head_dim"
        )
    heads = features // head_dim
    if heads % tp:
        raise PlanError(
            f"{heads} attention heads do not split over TP {tp}; "
            "choose a TP degree that divides the number of heads (and of kv heads)"
        )
