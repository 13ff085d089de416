"""First-forward check of norm groups: does the model use their outputs as the plan assumes?

A norm group (`groups`) hands its output to the consumers the layout lists and, when
deferred, leaves the ups' input grads partial for the group to reduce. Both are only right
if the model's own code agrees, which no static check can see. So the first training
forward of every block (eager, grad enabled) records the autograd nodes the group's
modules create, and when the block returns, its graph is walked from the block's outputs
back to its inputs:

1. every node that reads the group's output belongs to a listed consumer;
2. (deferred groups) no consumer's latent reaches the block's outputs except through its
   up-projection, and each up's input depends on nothing but its own latent (no
   parameter, no other tensor that needs a grad).

A violation raises `PlanError` naming the module and the fix, before any backward runs.
Once every group of a block passed, its hooks are removed: later forwards cost nothing.
Not seen by this check (use `verify_plan`): uses outside autograd (no_grad code, tensors
kept on modules), and anything the code does that is wrong on a sharded tensor (a mean
over the hidden dim, a head count fixed in a view).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from .styles import PlanError

Node = Any
"""An autograd graph node (`torch.autograd.graph.Node`)."""


@dataclass
class GroupRecord:
    """What one checked forward saw of a group."""

    output: torch.Tensor | None = None
    firsts: dict[int, set[Node]] = field(default_factory=dict)
    """Per consumer: the nodes between its output and the group output."""
    latents: dict[int, Node] = field(default_factory=dict)
    """Per consumer: the node of its output (its latent, under BTP)."""
    ups: dict[int, tuple[Node | None, Node | None]] = field(default_factory=dict)
    """Per consumer: (node of the up's input, node of the up's output)."""


def same_data(a: torch.Tensor, b: torch.Tensor) -> bool:
    """a and b are the same tensor, or aliases of the same memory and layout (module hooks
    may hand a module an identity-wrapped copy of its input)."""
    return a is b or (
        a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
        and a.storage_offset() == b.storage_offset()
        and a.untyped_storage()._cdata == b.untyped_storage()._cdata
    )


def nodes_between(y: torch.Tensor, x: torch.Tensor) -> set[Node]:
    """The autograd nodes of the ops that computed y from x (x's own node excluded)."""
    stop = x.grad_fn
    return set(walk([y.grad_fn], stop={stop})) - {stop} if y.grad_fn is not None else set()


def walk(roots: Iterable[Node | None], stop: set[Node]) -> dict[Node, list[Node]]:
    """Every node reachable from `roots` towards the inputs, without going past the
    nodes in `stop`; maps each to the nodes it was reached from (its readers)."""
    readers: dict[Node, list[Node]] = {r: [] for r in roots if r is not None}
    queue = list(readers)
    while queue:
        node = queue.pop()
        if node in stop:
            continue
        for child, _ in node.next_functions:
            if child is None:
                continue
            if child not in readers:
                readers[child] = []
                queue.append(child)
            readers[child].append(node)
    return readers


def _nodes(tree: Any) -> list[Node]:
    return [t.grad_fn for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and t.grad_fn]


def _is_leaf_node(node: Node) -> bool:
    return type(node).__name__ == "AccumulateGrad"


class WatchedGroup(Protocol):
    """What the check reads of one block's norm group (`groups.GroupInstance`)."""

    spec: Any
    """The group's `NormGroup` (its `consumers`, for messages)."""
    norm_fqn: str
    consumer_fqns: list[str]
    block: nn.Module
    firsts: list[nn.Linear]
    deferred: bool
    record: GroupRecord | None


class BlockCheck:
    """Hooks on one block that check its norm groups on its first training forward."""

    def __init__(self, block: nn.Module) -> None:
        self.groups: list[WatchedGroup] = []
        self.inputs: set[Node] = set()
        self.handles = [
            block.register_forward_pre_hook(self._before, with_kwargs=True),
            block.register_forward_hook(self._after, with_kwargs=True),
        ]

    def _before(self, block, args, kwargs) -> None:
        if torch.compiler.is_compiling() or not torch.is_grad_enabled():
            return
        self.inputs = set(_nodes((args, kwargs)))
        for group in self.groups:
            group.record = GroupRecord()

    def _after(self, block, args, kwargs, output) -> None:
        if torch.compiler.is_compiling() or not any(g.record for g in self.groups):
            return
        try:
            checked = [g for g in self.groups if g.record.output is not None]
            if checked:
                self._check(_nodes(output), checked)
        finally:
            records = [g.record for g in self.groups]
            for group in self.groups:
                group.record = None
        if all(r is not None and r.output is not None for r in records):
            for handle in self.handles:
                handle.remove()
            _CHECKS.pop(block, None)

    def _check(self, outputs: list[Node], groups: list[WatchedGroup]) -> None:
        readers = walk(outputs, stop=self.inputs)
        for g in groups:
            self._check_readers(g, readers)
        deferred = [g for g in groups if g.deferred]
        if deferred:
            ups = {g.record.ups[i][1] for g in deferred for i in g.record.ups}
            latents = {n: (g, i) for g in deferred for i, n in g.record.latents.items()}
            bypass = walk(outputs, stop=self.inputs | ups)
            for node, (g, i) in latents.items():
                if node in bypass:
                    raise PlanError(
                        f"the latent of {g.consumer_fqns[i]} reaches the block's output other "
                        "than through its up-projection, so its partial grad would be "
                        "reduced wrongly; set ModelLayout(defer_latent_grads=False)"
                    )
            for g in deferred:
                for i in g.record.firsts:
                    self._check_self_contained(g, i, latents)

    def _check_readers(self, g: WatchedGroup, readers: dict[Node, list[Node]]) -> None:
        missing = [g.consumer_fqns[i] for i in range(len(g.firsts)) if i not in g.record.firsts]
        if missing:
            raise PlanError(
                f"{missing[0]} is listed as reading {g.norm_fqn}'s output but was not called "
                "with it; fix ModelLayout.shared_inputs"
            )
        output = g.record.output.grad_fn
        allowed = set().union(*g.record.firsts.values())
        others = [r for r in readers.get(output, []) if r not in allowed]
        if output is not None and others:
            raise PlanError(
                f"{g.norm_fqn}'s output is also read by code outside its listed consumers "
                f"({', '.join(c.rsplit('.', 1)[-1] for c in g.spec.consumers)}), by an op "
                f"{others[0].name()}; list every module that reads it in "
                "ModelLayout.shared_inputs"
            )

    def _check_self_contained(
        self, g: WatchedGroup, index: int, latents: dict[Node, tuple[WatchedGroup, int]]
    ) -> None:
        up_input = g.record.ups.get(index, (None, None))[0]
        if up_input is None:
            return
        reached = walk([up_input], stop=set(latents) | self.inputs)
        if any(_is_leaf_node(n) or n in self.inputs for n in reached if n not in latents):
            raise PlanError(
                f"{g.consumer_fqns[index]} computes its up-projection's input from more than "
                "its own latent (a parameter or another tensor between down and up), so that "
                "grad would be left partial; set ModelLayout(defer_latent_grads=False)"
            )


_CHECKS: weakref.WeakKeyDictionary[nn.Module, BlockCheck] = weakref.WeakKeyDictionary()


def watch(group: WatchedGroup) -> None:
    """Check `group` on its block's first training forward."""
    check = _CHECKS.get(group.block)
    if check is None:
        check = _CHECKS[group.block] = BlockCheck(group.block)
    if group not in check.groups:
        check.groups.append(group)
