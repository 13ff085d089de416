"""bf16 compute from fp32 master weights without FSDP2, on layouts that shard no weight.

Where nothing is sharded (which layouts: `runtime.data_parallel`), FSDP2 on a 1-rank
mesh gave mixed precision at the price of its per-unit machinery on every micro-batch
(hooks, the reduce-buffer copy of every gradient): the bf16 step took 1.46x the fp32 one on
the debug model at TP 1 on CPU. `ComputeCopies` does the same arithmetic with autograd alone:

- A training step's first forward casts each fp32 master weight once, with autograd
  recording the cast (`master.to(bf16)`): a unit's (block's) weights when the unit first
  runs, so the casts interleave with the neighbours' GPU work as FSDP2's per-block units
  do, the rest when the root's forward starts. The copies take the masters' places in
  their modules until the step's last backward (activation checkpointing recomputes with
  them). One cast per weight per step, each unit's in one `record_function` range
  (`CAST_RANGE`).
- Every micro-batch's backward runs through the same cast nodes (they save no tensor, so
  they can be run again): each bf16 weight gradient is cast to fp32 and accumulated into
  the master's `.grad` by autograd, g1 + g2 + ... in fp32, in FSDP2's order. In the last
  micro-batch's backward each unit gives its copies back once their gradients exist
  (`release_after_backward`), so a block's copy is freed after its backward, as FSDP2
  frees it.
- Floating-point inputs of each unit (TorchTitan's FSDP2 units: the blocks) are cast to
  bf16 before its forward, as FSDP2's `cast_forward_inputs` does, so both paths compute
  the same bits (`tests/unit/test_accumulation.py`).
- Outside a step (validation, evaluation) a forward of the root casts the weights for that
  call only (under `torch.no_grad()` when gradients are off) and puts the masters back.

At rest the modules hold their fp32 masters: the optimizer, clipping, checkpoints and
`state_dict` see only them. Memory: a block's bf16 copy (2 bytes a weight) lives from a
step's first forward to the block's backward in the last micro-batch, as FSDP2's unsharded
copies did (`perf.memory`, checked against torch's MemTracker by `bench memory`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from functools import partial

import torch
from torch import nn
from torch.autograd.graph import register_multi_grad_hook
from torch.utils._pytree import tree_map

from boost_titan.runtime.torch_internals import set_parameter

CAST_RANGE = "boost::cast_weights"
"""The profiler range around a step's weight casts (counted by `bench step`)."""

_APPLIED: weakref.WeakKeyDictionary[nn.Module, ComputeCopies] = weakref.WeakKeyDictionary()
"""Each model given compute copies: part of the layout the runtime reads its micro-batch
protocol from (`runtime.microbatches.protocol_for`)."""

Slot = tuple[nn.Module, str]
"""Where a weight sits: its module and its name there."""


class ComputeCopies:
    """The compute-dtype copies of a model's fp32 weights (module docstring)."""

    def __init__(self, model: nn.Module, dtype: torch.dtype, units: Iterable[nn.Module]):
        self.dtype = dtype
        self.units = list(units)
        self.unit_slots = {id(unit): _slots(unit) for unit in self.units}
        """Each unit's weights: cast in its first forward of a step, given back after its
        backward in the step's last micro-batch (`release_after_backward`)."""
        in_units = {slot for slots in self.unit_slots.values() for slot in slots}
        self.root_slots = [slot for slot in _slots(model) if slot not in in_units]
        """The weights outside every unit (embedding, final norm, lm_head): cast when the
        root's forward starts."""
        self.master_at: dict[Slot, nn.Parameter] = {}
        """Each swapped slot's master (masters are read at each cast: `to_empty` after this
        replaces the meta-device parameters)."""
        self.copy_of: dict[int, torch.Tensor] = {}
        """This step's copy of each master (by id): a weight shared by two slots, one copy."""
        self.cast_units: set[int] = set()
        self.active = False
        """The root's forward has begun casting (in a step: until `end_step`)."""
        self.held = False
        """A training step holds the copies across its micro-batches."""
        self.releasing = False
        """The step's last micro-batch: units give their copies back after backward."""
        model.register_forward_pre_hook(self._before_root)
        model.register_forward_hook(self._after_root)
        for unit in self.units:
            unit.register_forward_pre_hook(self._before_unit, with_kwargs=True)

    def begin_step(self) -> None:
        """Hold the copies from this step's first forward (each unit's weights cast, with
        autograd recording the cast, when the unit first runs) until `end_step`."""
        self.held = True

    def before_microbatch(self, index: int, count: int) -> None:
        """The step protocol before micro-batch `index` of `count`: the first begins the
        step, the last releases each block's copy after its backward (`end_step` follows
        the last backward)."""
        if index == 0:
            self.begin_step()
        if index == count - 1:
            self.release_after_backward()

    def release_after_backward(self) -> None:
        """Before a step's last forward: each unit puts its masters back as soon as the
        next backward has computed the gradients of all its copies, so that each block's
        copy is freed after its backward, as FSDP2 frees it (activation checkpointing has
        recomputed by then). Units not cast yet register when they are."""
        self.releasing = True
        for unit in self.units:
            if id(unit) in self.cast_units:
                self._register_give_back(unit)

    def end_step(self) -> None:
        """Put the masters back after a step's last backward; their `.grad` is complete."""
        self._swap_out()
        self.held = False

    def _register_give_back(self, unit: nn.Module) -> None:
        slots = self.unit_slots[id(unit)]
        copies = [module._parameters[name] for module, name in slots]
        if copies and all(c.requires_grad for c in copies):
            register_multi_grad_hook(copies, partial(self._give_back, slots), mode="all")

    def _give_back(self, slots: list[Slot], _grads) -> None:
        for module, name in slots:
            master = self.master_at[(module, name)]
            set_parameter(module, name, master)
            self.copy_of.pop(id(master), None)  # the last reference: the copy is freed

    def _swap_in(self, slots: list[Slot]) -> None:
        with torch.profiler.record_function(CAST_RANGE):
            for module, name in slots:
                master = module._parameters[name]
                self.master_at[(module, name)] = master
                copy = self.copy_of.get(id(master))
                if copy is None:
                    copy = self.copy_of[id(master)] = master.to(self.dtype)
                set_parameter(module, name, copy)  # a non-leaf: its grad reaches the master

    def _swap_out(self) -> None:
        for (module, name), master in self.master_at.items():
            set_parameter(module, name, master)
        self.master_at, self.copy_of, self.cast_units = {}, {}, set()
        self.active = self.releasing = False

    def _before_root(self, module: nn.Module, args: tuple) -> None:
        if not self.active:
            self._swap_in(self.root_slots)
            self.active = True

    def _after_root(self, module: nn.Module, args: tuple, output):
        if not self.held:
            self._swap_out()
        return output

    def _before_unit(self, unit: nn.Module, args: tuple, kwargs: dict):
        """Cast the unit's weights in its first forward of the step, and its floating
        inputs (as FSDP2's `cast_forward_inputs`) in every forward."""
        if self.active and id(unit) not in self.cast_units:
            self._swap_in(self.unit_slots[id(unit)])
            self.cast_units.add(id(unit))
            if self.releasing:
                self._register_give_back(unit)

        def cast(x):
            floating = isinstance(x, torch.Tensor) and torch.is_floating_point(x)
            return x.to(self.dtype) if floating else x

        return tree_map(cast, args), tree_map(cast, kwargs)


def _slots(module: nn.Module) -> list[Slot]:
    return [
        (m, name) for m in module.modules() for name, p in m._parameters.items() if p is not None
    ]


def apply_compute_copies(
    model: nn.Module, dtype: torch.dtype, units: Iterable[nn.Module]
) -> ComputeCopies:
    """Give `model` bf16 (`dtype`) compute from its fp32 weights (module docstring)."""
    copies = _APPLIED[model] = ComputeCopies(model, dtype, units)
    return copies


def compute_copies_of(model: nn.Module) -> ComputeCopies | None:
    """The compute copies `apply_compute_copies` gave `model`, or None."""
    return _APPLIED.get(model)


__all__ = ["CAST_RANGE", "ComputeCopies", "apply_compute_copies", "compute_copies_of"]
