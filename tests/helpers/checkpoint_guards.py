"""Every checkpoint guard, and how to switch it off in the fuzzing child
(`tests.helpers.checkpoint_fuzz --break NAME,...`): the fuzzer, not told which is off, must
then report a failure that shows the hole (`SIGNS`: words of its failure line). Each
switch-off patches the product's own objects in this process and returns its undo.

Guards not listed here are second layers whose removal no read can show, since the first
layer refuses the same input before: DCP's own reads through the allowlist
(`reads.GuardedReader`, `reads.GuardedPlanner`, which also vets the dataloader state before
TorchTitan's loader gets it: the whole checkpoint is vetted before any load), the unpickler's
refusal of persistent ids (CPython's unpickler refuses them by itself), the check that a
MetadataIndex key holds a name, offsets and an int (its fields nest no deeper than the tuple
depth allows), a file shorter than its entries (the archive or pickle read from it is then
refused), and the byte caps `MAX_PICKLE_BYTES` / `MAX_ITEM_BYTES` (a cap on what a file
holds: the fuzzer's files are small)."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from typing import Any

Undo = Callable[[], None]


def _patch(owner: Any, name: str, value: Any) -> Undo:
    """Set `owner.name` (or `owner[name]` for a dict) to `value`; returns its undo."""
    if isinstance(owner, dict):
        old = owner[name]
        owner[name] = value
        return lambda: owner.__setitem__(name, old)
    old = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, value)
    return lambda: setattr(owner, name, old)


def _all(*undos: Undo) -> Undo:
    return lambda: [undo() for undo in reversed(undos)]


class _Everything:
    def __contains__(self, item: Any) -> bool:
        return True


def _plain_opcode(op: bytes, load: Callable) -> Undo:
    """The unpickler's handler of `op` as CPython's reference unpickler has it (counted)."""
    from boost_titan.checkpoint import safe_load

    dispatch = safe_load.CheckpointUnpickler.dispatch
    return _patch(dispatch, op[0], safe_load._counted(load, 1))


def allowlist() -> Undo:
    """Any global resolves and any callable may be called."""
    from boost_titan.checkpoint import safe_load

    unpickler = safe_load.CheckpointUnpickler
    return _all(
        _patch(unpickler, "find_class", pickle._Unpickler.find_class),
        _patch(safe_load, "_callables", lambda: _Everything()),
    )


def build() -> Undo:
    """BUILD sets the state of anything (a class included)."""
    return _plain_opcode(pickle.BUILD, pickle._Unpickler.load_build)


def opcode_cap() -> Undo:
    from boost_titan.checkpoint import safe_load

    return _patch(safe_load, "MAX_OPCODES", 1 << 62)


def tuple_depth() -> Undo:
    from boost_titan.checkpoint import safe_load

    return _patch(safe_load.CheckpointUnpickler, "_made", lambda self, container: None)


def nesting() -> Undo:
    from boost_titan.checkpoint import safe_load

    return _patch(safe_load, "check_nesting", lambda value: None)


def bytearray8() -> Undo:
    return _plain_opcode(pickle.BYTEARRAY8, pickle._Unpickler.load_bytearray8)


def hash_flood() -> Undo:
    from boost_titan.checkpoint import safe_load

    return _all(
        _patch(safe_load.KeyHashes, "add", lambda self, keys: len(list(keys))),
        _plain_opcode(pickle.PUT, pickle._Unpickler.load_put),
    )


def stored_items() -> Undo:
    from boost_titan.checkpoint import safe_load

    return _patch(safe_load, "check_stored", lambda info: None)


def types() -> Undo:
    """`.metadata`'s entries taken as they come: the chunk map built without a check."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    from boost_titan.checkpoint import dcp_layout

    def unchecked(metadata: Any) -> dict:
        found: dict = {}
        for fqn, entry in metadata.state_dict_metadata.items():
            for chunk in getattr(entry, "chunks", [None]):
                found[MetadataIndex(fqn, getattr(chunk, "offsets", None))] = chunk
        return found

    return _patch(dcp_layout, "check_types", unchecked)


def confinement() -> Undo:
    from boost_titan.checkpoint import dcp_layout

    return _patch(dcp_layout, "check_inside", lambda folder, name: os.path.join(folder, name))


def special_files() -> Undo:
    from boost_titan.checkpoint import safe_load

    return _patch(safe_load, "is_regular", lambda mode: True)


def declared_bytes() -> Undo:
    from boost_titan.checkpoint import dcp_layout

    return _patch(dcp_layout, "size_problem", lambda records, declared: None)


def zip_records() -> Undo:
    from boost_titan.checkpoint import dcp_layout

    return _patch(dcp_layout, "records_problem", lambda records: None)


class _Scan(dict):
    """A dict whose lookups scan its items (as `check_layout` found chunks before)."""

    def __getitem__(self, key: Any) -> Any:
        return next(value for index, value in self.items() if index == key)


def chunk_index() -> Undo:
    from boost_titan.checkpoint import dcp_layout

    checked = dcp_layout.check_types
    return _patch(dcp_layout, "check_types", lambda metadata: _Scan(checked(metadata)))


def step_folder() -> Undo:
    from boost_titan.checkpoint import dcp_layout

    return _patch(dcp_layout, "check_confined", lambda path: None)


def train_step() -> Undo:
    from boost_titan.checkpoint import files as checkpoint_files

    return _patch(checkpoint_files, "TRAIN_STEP", "no such item")


TIMEOUT, MEMORY = ("CaseTimeout", "crashed"), ("MemoryError", "peak RSS", "allocate", "crashed")
TRACEBACK = ("AttributeError", "TypeError", "KeyError", "ValueError", "IndexError")
GUARDS: dict[str, tuple[Callable[[], Undo], tuple[str, ...]]] = {
    # name -> (switch it off, words one of which the fuzzer's failure line then holds)
    "allowlist": (allowlist, ("a payload ran",)),
    "BUILD": (build, ("changed",)),
    "opcode cap": (opcode_cap, TIMEOUT + MEMORY),
    "tuple depth": (tuple_depth, ("RecursionError",) + MEMORY + TIMEOUT),
    "nesting": (nesting, ("nests", "cycle", "RecursionError")),
    "BYTEARRAY8": (bytearray8, MEMORY),
    "hash flood": (hash_flood, TIMEOUT),
    "stored byte items": (stored_items, TIMEOUT + MEMORY),
    "metadata types": (types, TRACEBACK),
    "confinement": (confinement, ("outside the folder",)),
    "special files": (special_files, TIMEOUT),
    "declared bytes": (declared_bytes, MEMORY),
    "zip records": (zip_records, MEMORY),
    "chunk index": (chunk_index, ("compared storage indices",) + TIMEOUT),
    "step folder": (step_folder, ("outside the folder",)),
    "train step": (train_step, ("train_state.step",)),
}
"""Every checkpoint guard the fuzzer must find switched off (see the module docstring for
the second layers it cannot)."""
