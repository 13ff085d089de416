"""Reading DCP checkpoints without running code from them: every pickle through one allowlist.

A DCP checkpoint folder holds pickles: its `.metadata` (DCP's dataclasses, written with
`pickle.dump`) and one `torch.save` archive per non-tensor value, a "byte item" (step
counters, optimizer and LR settings, TorchTitan's dataloader state, which is itself a
`pickle.dumps` string). Unpickling calls whatever the file names, and DCP reads both with
plain `pickle.load` / `torch.load(weights_only=False)`; only its tensors go through torch's
weights-only loader. That loader cannot stand in for the rest: it does not parse protocol 4,
in which `pickle.dump` writes `.metadata`.

`CheckpointUnpickler` resolves only the globals of `allowed_globals()` (DCP's metadata
classes, `torch.Size`, dtypes and layouts, `pathlib.PosixPath`, and `_codecs.encode`, which
protocol 2 uses for bytes); any other name raises `UnsafeCheckpoint` before anything is
called, and the error names it.

- `guard_dcp()`: every later DCP load in this process (`FileSystemReader.read_metadata`,
  `DefaultLoadPlanner.load_bytes` and their subclasses) reads through the allowlist.
- `read_metadata(path)`, `vet_byte_items(path, metadata)`: read a checkpoint's `.metadata`
  and every byte item (and any pickle inside one) up front, so that a loader can refuse it
  with one message before any load starts.
- `loads(data)`: one pickle (TorchTitan's dataloader state).
"""

from __future__ import annotations

import _compat_pickle
import functools
import io
import os
import pickle
import zipfile
from typing import IO, TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata
    from torch.distributed.checkpoint.planner import ReadItem

METADATA = ".metadata"
PICKLE_PROTOCOLS = range(2, pickle.HIGHEST_PROTOCOL + 1)
"""Protocols whose pickles start with the PROTO opcode (0x80) and this byte."""


class UnsafeCheckpoint(pickle.UnpicklingError):
    """A checkpoint's pickle asks for `name`, a global outside the allowlist; `part` is the
    file (and item) that holds it, when known."""

    def __init__(self, name: str, part: str | None = None) -> None:
        self.name, self.part = name, part
        super().__init__(f"{part or 'a pickle'} asks for {name}")

    def __reduce__(self) -> tuple:  # DCP gathers a rank's exception to the others pickled
        return UnsafeCheckpoint, (self.name, self.part)

    def at(self, part: str) -> UnsafeCheckpoint:
        """The same refusal, naming the file (and item) that holds it."""
        return UnsafeCheckpoint(self.name, part)


@functools.cache
def allowed_globals() -> dict[str, Any]:
    """'module.name' -> object: every global the pickles of a DCP checkpoint need."""
    import _codecs
    import pathlib

    from torch.distributed.checkpoint import metadata as dcp_metadata
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    objects = [
        dcp_metadata.Metadata,
        dcp_metadata.MetadataIndex,
        dcp_metadata.StorageMeta,
        dcp_metadata.TensorStorageMetadata,
        dcp_metadata.BytesStorageMetadata,
        dcp_metadata.ChunkStorageMetadata,
        dcp_metadata.TensorProperties,
        dcp_metadata._MEM_FORMAT_ENCODING,
        _StorageInfo,
        torch.Size,
        torch.serialization._get_layout,  # how torch.layout pickles
        pathlib.PosixPath,  # StorageMeta.checkpoint_id
        _codecs.encode,  # how protocol 2 (torch.save's) pickles bytes
    ]
    allowed = {f"{obj.__module__}.{obj.__qualname__}": obj for obj in objects}
    dtypes = {name: value for name, value in vars(torch).items() if isinstance(value, torch.dtype)}
    allowed.update((f"torch.{name}", dtype) for name, dtype in dtypes.items())
    return allowed


class CheckpointUnpickler(pickle.Unpickler):
    """An unpickler that resolves only `allowed_globals()`: it never reaches a callable the
    allowlist lacks (REDUCE, NEWOBJ and BUILD act on what `find_class` returned)."""

    def find_class(self, module: str, name: str) -> Any:
        # Python 2 names (protocol 2, torch.save's: __builtin__, commands) as Python 3's
        module, name = _compat_pickle.NAME_MAPPING.get(
            (module, name), (_compat_pickle.IMPORT_MAPPING.get(module, module), name)
        )
        found = allowed_globals().get(f"{module}.{name}")
        if found is None:
            raise UnsafeCheckpoint(f"{module}.{name}")
        return found


def loads(data: bytes) -> Any:
    """Unpickle `data` through the allowlist."""
    return CheckpointUnpickler(io.BytesIO(data)).load()


def is_pickle(value: Any) -> bool:
    """Bytes that open like a pickle of protocol 2 or later (TorchTitan's dataloader state)."""
    return (
        isinstance(value, bytes)
        and len(value) > 1
        and value[0] == 0x80
        and value[1] in PICKLE_PROTOCOLS
    )


def load_saved(stream: IO[bytes]) -> Any:
    """A value `torch.save` wrote (a DCP byte item): its archive's `data.pkl` through the
    allowlist. Byte items hold no tensors (DCP stores those apart), so a persistent id,
    torch.save's reference to a tensor's storage, is refused like any other unknown."""
    with zipfile.ZipFile(stream) as archive:
        # torch.save's zip layout: <archive name>/data.pkl, next to the tensors' records
        pickles = [name for name in archive.namelist() if name.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise pickle.UnpicklingError("not a torch.save archive (no single data.pkl)")
        with archive.open(pickles[0]) as data:
            return CheckpointUnpickler(data).load()


def read_metadata(path: str) -> Metadata:
    """The `.metadata` of the DCP checkpoint folder `path`, through the allowlist
    (UnsafeCheckpoint names the file)."""
    with open(os.path.join(path, METADATA), "rb") as file:
        try:
            return CheckpointUnpickler(file).load()
        except UnsafeCheckpoint as e:
            raise e.at(METADATA) from None


class _ByteItemVetter:
    """The planner side of `FileSystemReader.read_data` for `vet_byte_items`: each byte item
    (and a pickle inside one) is unpickled through the allowlist, then dropped."""

    def __init__(self, metadata: Metadata) -> None:
        self.files = {index: info.relative_path for index, info in metadata.storage_data.items()}

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        index = read_item.storage_index
        try:
            loaded = load_saved(value)
            if is_pickle(loaded):
                loads(loaded)
        except UnsafeCheckpoint as e:
            raise e.at(f"{self.files[index]} ({index.fqn})") from None


def vet_byte_items(path: str, metadata: Metadata) -> None:
    """Unpickle every byte item of the checkpoint at `path` (read with DCP's own reader, as a
    load would) through the allowlist; UnsafeCheckpoint names the file and item."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

    at_start = torch.Size([0])
    items = [
        ReadItem(LoadItemType.BYTE_IO, index, at_start, index, at_start, at_start)
        for index in metadata.storage_data
        if isinstance(metadata.state_dict_metadata.get(index.fqn), BytesStorageMetadata)
    ]
    reader = FileSystemReader(path)
    reader.set_up_storage_reader(metadata, is_coordinator=True)
    reader.read_data(LoadPlan(items), _ByteItemVetter(metadata)).wait()


# ---- DCP's own loads ---------------------------------------------------------------------
def _read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
    """`FileSystemReader.read_metadata` through the allowlist."""
    from torch.distributed.checkpoint.metadata import StorageMeta

    path = self._get_metadata_path(kwargs.get("rank"))
    with self.fs.create_stream(path, "rb") as file:
        try:
            metadata = CheckpointUnpickler(file).load()
        except UnsafeCheckpoint as e:
            raise e.at(str(path)) from None
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    metadata.storage_meta.load_id = self.load_id
    return metadata


def _load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
    """`DefaultLoadPlanner.load_bytes` through the allowlist."""
    from torch.distributed.checkpoint._traverse import set_element

    fqn = read_item.dest_index.fqn
    try:
        loaded = load_saved(value)
    except UnsafeCheckpoint as e:
        raise e.at(f"item {fqn}") from None
    if self.flatten_state_dict:
        set_element(self.original_state_dict, self.mappings[fqn], loaded)
    else:
        self.state_dict[fqn] = loaded


def guard_dcp() -> None:
    """Make DCP read every later checkpoint's pickles through the allowlist, in this whole
    process (idempotent): `.metadata` by `FileSystemReader` (and subclasses), byte items by
    `DefaultLoadPlanner` (and subclasses), whoever calls `dcp.load`."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    FileSystemReader.read_metadata = _read_metadata
    DefaultLoadPlanner.load_bytes = _load_bytes
