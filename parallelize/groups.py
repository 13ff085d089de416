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
* whatever the model does next (an activation, nothing, LaX's crossing) runs as written,
  with one exception: when every consumer is a pair that names the activation it applies
  straight to its down's output (`down_activation`, as `LowRankLinear` without crossing
  does: CoLA's SiLU) and they all apply the same elementwise one, the group applies it
  ONCE to its whole contiguous output (forward and backward: one SiLU for q/k/v instead
  of three strided ones) and each activation module hands back its input, its columns
  of the activated output (`GroupActivation`). An activation written inline in a
  model's forward (``F.silu(self.down(x))``) is not seen and runs as written.

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

This module holds the group (`NormGroup`) and its instance in one block (`GroupInstance`);
the styles are in `group_norms` (the norm's: `BottleneckGroupNorm`, `ReplicatedGroupNorm`)
and `group_members` (the consumers': `GroupMember`, `GroupUp`).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from boost_titan.kernels.float8 import Float8

from . import comm, group_check
from .styles import (
    Gemm,
    PlanError,
    TPStyle,
    is_rmsnorm_like,
    linear,
    local,
    norm_dim,
)


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


SHARED_ACTIVATIONS = {nn.SiLU: F.silu}
"""Elementwise activation modules a group applies once to its whole output, each with the
function that does it."""


def _down_activation(pair: nn.Module) -> nn.Module | None:
    """The activation module `pair` applies straight to its down's output, if it says so."""
    act = getattr(pair, "down_activation", None)
    return act if isinstance(act, nn.Module) else None


def _self_contained(pair: nn.Module, down: nn.Linear, up: nn.Linear) -> bool:
    """No parameter of the pair lives outside its down and up (nothing trainable between),
    and its latent is not relayed to the next block (`to_low_rank(crossing=True)`'s
    `LatentRelay`: a path the first forward's graph check cannot see)."""
    own = {id(p) for m in (down, up) for p in m.parameters()}
    relayed = getattr(pair, "relay", None) is not None  # `LowRankLinear.relay`, if set
    return not relayed and all(id(p) in own for p in pair.parameters())


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
    acts: list[nn.Module | None]
    """Each consumer's activation module applied straight to its down's output, or None."""
    norm_style: TPStyle | None = None
    activation: nn.Module | None = None
    """The consumers' shared activation, applied by the group to its whole output (set
    when the norm's style is applied: `shared_activation`)."""
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
    stashed: dict[int, torch.Tensor] = field(default_factory=dict)
    """The current forward call's local weights of those linears, by consumer index: each
    converted from its DTensor once, for the all-reduce and the linear both."""
    record: group_check.GroupRecord | None = None

    @classmethod
    def resolve(
        cls, spec: NormGroup, block: nn.Module, norm: nn.Module, prefix: str
    ) -> GroupInstance:
        firsts: list[nn.Linear] = []
        seconds: list[nn.Linear | None] = []
        acts: list[nn.Module | None] = []
        contained = True
        for consumer in spec.consumers:
            module = _submodule(block, consumer, prefix)
            if spec.low_rank:
                down, up = _pair(module, prefix + consumer)
                contained &= _self_contained(module, down, up)
                firsts.append(down)
                seconds.append(up)
                acts.append(_down_activation(module))
            else:
                if not isinstance(module, nn.Linear):
                    raise PlanError(
                        f"{prefix}{consumer} is a {type(module).__name__}, not an nn.Linear; "
                        "use a low-rank plan (btp, vanilla) for down/up pairs or fix the FQN"
                    )
                firsts.append(module)
                seconds.append(None)
                acts.append(None)
        return cls(
            spec,
            prefix + spec.norm,
            [prefix + c for c in spec.consumers],
            block,
            norm,
            firsts,
            seconds,
            contained,
            acts,
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

    def shared_activation(self) -> nn.Module | None:
        """The activation the group can apply once to its output: every consumer applies
        the same `SHARED_ACTIVATIONS` module (same settings) straight to its columns of
        it, each its own module that nothing else in the block holds (a module reused
        elsewhere must keep activating there). None when the output is the plain norm
        output (each consumer's own GEMM)."""
        first = self.acts[0]
        if not self.computes_firsts or type(first) not in SHARED_ACTIVATIONS:
            return None
        same = all(
            type(a) is type(first) and a.extra_repr() == first.extra_repr() for a in self.acts
        )
        held = [m for m in self.block.modules(remove_duplicate=False) if type(m) is type(first)]
        own = all(sum(m is a for m in held) == 1 for a in self.acts)
        return first if same and own else None

    def activate(self, out: torch.Tensor) -> torch.Tensor:
        """The group output with the consumers' shared activation applied (if any)."""
        if self.activation is None:
            return out
        return SHARED_ACTIVATIONS[type(self.activation)](out)

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
        self.stashed = {}
        return self.stash

    def stashed_weights(
        self, linears: Sequence[nn.Linear], members: Sequence[int]
    ) -> dict[int, torch.Tensor]:
        """Consumer index -> local weight of those `linears` whose weight grads wait for
        the group's all-reduce (none without a stash)."""
        weights = {} if self.stash is None else {i: local(linears[i].weight) for i in members}
        self.stashed.update(weights)
        return weights

    def deferred_linear(
        self, x: torch.Tensor, module: nn.Linear, index: int, f8: Float8 | None
    ) -> torch.Tensor:
        """A consumer linear whose input grad the group reduces: its weight grad waits
        for the group's all-reduce (with a stash). `f8`: its GEMMs in float8."""
        if self.stash is None:
            return linear(x, module, f8)
        weight = self.stashed.pop(index, None)
        weight = local(module.weight) if weight is None else weight
        y = comm.stashed_linear(x, weight, self.stash, index, f8)
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

    def record_activation(self, index: int, z: torch.Tensor) -> None:
        if self.record is None or torch.compiler.is_compiling():
            return
        output, (start, width) = self.record.output, self.spans[index]
        if output is None or not group_check.same_data(z, output.narrow(-1, start, width)):
            raise PlanError(
                f"{self.consumer_fqns[index]}'s activation was called on another tensor "
                "than its down's output, but its down_activation says it runs straight on "
                "it (the group applies it once for all consumers); fix down_activation"
            )

    def record_up(self, index: int, h: torch.Tensor, y: torch.Tensor) -> None:
        if self.record is not None and not torch.compiler.is_compiling():
            self.record.ups[index] = (h.grad_fn, y.grad_fn)


_INSTANCES: weakref.WeakKeyDictionary[nn.Module, GroupInstance] = weakref.WeakKeyDictionary()


class GroupBound:
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
