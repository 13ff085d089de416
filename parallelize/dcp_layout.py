"""What a DCP checkpoint's `.metadata` may say, checked before anything is read or allocated.

`safe_load` makes sure unpickling `.metadata` runs no code; this module checks what it
says, since every later read trusts it: `check_layout(path, metadata)` raises
`BadCheckpoint` (a one-line reason naming the file) unless

- every entry has DCP's types: tensors (dtype, non-negative sizes, chunks inside the
  tensor and covering it), byte items (at most `safe_load.MAX_ITEM_BYTES`, which a reader
  holds in memory), and storage entries (`relative_path`, `offset`, `length` as a name and
  integers, no storage transforms), one per chunk and byte item;
- every file an entry names is a relative name without `..` that resolves (symlinks
  included) inside the checkpoint folder, and is a regular file (a FIFO would block its
  reader), and every entry's bytes lie inside it;
- every tensor chunk's entry is a torch.save archive whose uncompressed data holds exactly
  the chunk's bytes (shape x dtype size): a `.metadata` cannot make a reader allocate a
  tensor its files do not hold.

`read_checked(path)` is all of it with `safe_load`'s reads: what `load_sharded` runs first.
"""

from __future__ import annotations

import io
import math
import os
import stat
import zipfile
from typing import TYPE_CHECKING, Any

import torch

from .safe_load import MAX_ITEM_BYTES, shown

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata


class BadCheckpoint(ValueError):
    """A checkpoint whose `.metadata` or files do not hold what DCP wrote; the message
    names the file and what is wrong."""


def _is_int(value: Any) -> bool:
    return type(value) is int and value >= 0


def _is_size(value: Any, dims: int | None = None) -> bool:
    return (
        type(value) is torch.Size
        and all(n >= 0 for n in value)
        and (dims is None or len(value) == dims)
    )


def _field(value: Any, name: str) -> Any:
    """A dataclass field as unpickled (BUILD may leave one out): None when missing."""
    fields = getattr(value, "__dict__", None)
    if type(fields) is not dict or type(value) is type:
        return None
    return fields.get(name, getattr(type(value), name, None))


def check_types(metadata: Metadata) -> None:
    """Every entry of `metadata` has the types DCP writes (see the module docstring)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        StorageMeta,
        TensorProperties,
        TensorStorageMetadata,
    )

    where = ".metadata"
    if type(metadata) is not Metadata:
        raise BadCheckpoint(f"{where} holds a {type(metadata).__name__}, not DCP metadata")
    entries, storage = _field(metadata, "state_dict_metadata"), _field(metadata, "storage_data")
    if type(entries) is not dict or type(storage) is not dict:
        raise BadCheckpoint(f"{where} has no state_dict_metadata and storage_data dicts")
    if type(_field(metadata, "storage_meta")) not in (StorageMeta, type(None)):
        raise BadCheckpoint(f"{where} has a storage_meta that is not DCP's")
    needed: set[MetadataIndex] = set()
    for fqn, entry in entries.items():
        if type(fqn) is not str:
            raise BadCheckpoint(f"{where} has an entry named by a {type(fqn).__name__}")
        if type(entry) is BytesStorageMetadata:
            needed.add(MetadataIndex(fqn))
            continue
        properties = _field(entry, "properties")
        size, chunks = _field(entry, "size"), _field(entry, "chunks")
        if (
            type(entry) is not TensorStorageMetadata
            or type(properties) is not TensorProperties
            or type(_field(properties, "dtype")) is not torch.dtype
            or not _is_size(size)
            or type(chunks) is not list
        ):
            raise BadCheckpoint(
                f"{where}: {shown(fqn)} is not a tensor or byte entry as DCP writes"
            )
        covered = 0
        for chunk in chunks:
            offsets, sizes = _field(chunk, "offsets"), _field(chunk, "sizes")
            if (
                type(chunk) is not ChunkStorageMetadata
                or not _is_size(offsets, len(size))
                or not _is_size(sizes, len(size))
                or any(o + n > s for o, n, s in zip(offsets, sizes, size, strict=True))
            ):
                raise BadCheckpoint(f"{where}: a chunk of {shown(fqn)} does not lie inside {size}")
            covered += math.prod(sizes)
            needed.add(MetadataIndex(fqn, offsets))
        if covered != math.prod(size):
            raise BadCheckpoint(
                f"{where}: the chunks of {shown(fqn)} hold {covered:,} elements, its size {size} "
                f"{math.prod(size):,}"
            )
    for index, info in storage.items():
        if type(index) is not MetadataIndex or index not in needed:
            raise BadCheckpoint(f"{where} has a storage entry for no tensor chunk or item")
        if (
            type(info) is not _StorageInfo
            or type(_field(info, "relative_path")) is not str
            or not _is_int(_field(info, "offset"))
            or not _is_int(_field(info, "length"))
        ):
            raise BadCheckpoint(
                f"{where}: the storage entry of {shown(index.fqn)} is not a file name, offset "
                "and length"
            )
        is_item = type(entries.get(index.fqn)) is BytesStorageMetadata
        if is_item and info.length > MAX_ITEM_BYTES:  # a reader holds it whole in memory
            raise BadCheckpoint(
                f"{where}: the item {shown(index.fqn)} declares {info.length:,} bytes (most: "
                f"{MAX_ITEM_BYTES:,})"
            )
        if _field(info, "transform_descriptors"):  # none in what this product writes
            raise BadCheckpoint(f"{where}: {shown(index.fqn)} is stored through a transform")
    missing = needed - storage.keys()
    if missing:
        raise BadCheckpoint(f"{where} stores no bytes for {shown(min(i.fqn for i in missing))}")


def check_file(folder: str, name: str) -> int:
    """The size of the regular file `name` inside `folder`; BadCheckpoint when `name` is
    absolute, has a `..` part, resolves (through a symlink) outside `folder`, or is not a
    regular file."""
    if "\0" in name or os.path.isabs(name) or ".." in name.replace("\\", "/").split("/"):
        # the kernel resolves `a/../b` through `a` (which may be a symlink, or missing):
        # realpath's textual `..` would not see what an open does
        raise BadCheckpoint(f"its .metadata names {name!r}, a file outside the checkpoint folder")
    root = os.path.realpath(folder)
    path = os.path.realpath(os.path.join(folder, name))
    if os.path.commonpath([root, path]) != root:
        raise BadCheckpoint(
            f"its .metadata names {shown(name)}, which resolves to {shown(path)}, outside "
            "the checkpoint folder"
        )
    try:
        info = os.stat(path)
    except OSError:
        raise BadCheckpoint(f"{shown(name)} is missing (its .metadata names it)") from None
    if not stat.S_ISREG(info.st_mode):
        raise BadCheckpoint(f"{shown(name)} is not a regular file")
    return info.st_size


class _Window(io.RawIOBase):
    """`length` bytes of `file` from `offset`, as a seekable file (what zipfile needs)."""

    def __init__(self, file: io.BufferedIOBase, offset: int, length: int) -> None:
        super().__init__()
        self.file, self.start, self.length, self.position = file, offset, length, 0

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.position, os.SEEK_END: self.length}[whence]
        self.position = min(max(base + offset, 0), self.length)
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer: Any) -> int:
        count = min(len(buffer), self.length - self.position)
        self.file.seek(self.start + self.position)
        data = self.file.read(count)
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)


def stored_tensor_bytes(file: io.BufferedIOBase, offset: int, length: int) -> int | None:
    """The bytes of the tensor a torch.save archive at `offset` holds (its `data/0`), or
    None when it is not an uncompressed single-tensor archive."""
    try:
        with zipfile.ZipFile(_Window(file, offset, length)) as archive:
            data = [i for i in archive.infolist() if i.filename.endswith("/data/0")]
    except Exception:  # zipfile fails in many ways (BadZipFile, NotImplementedError...)
        return None
    if len(data) != 1 or data[0].compress_type != zipfile.ZIP_STORED:
        return None
    return data[0].file_size


def check_layout(path: str, metadata: Metadata) -> None:
    """`metadata` (of the checkpoint folder `path`) has DCP's types, names only regular
    files inside `path`, and every item lies inside its file; each tensor chunk stores
    exactly its bytes. Raises BadCheckpoint naming the file."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    check_types(metadata)
    entries = metadata.state_dict_metadata
    by_file: dict[str, list] = {}
    for index, info in metadata.storage_data.items():
        by_file.setdefault(info.relative_path, []).append((index, info))
    for name, items in sorted(by_file.items()):
        size = check_file(path, name)
        end = max(info.offset + info.length for _, info in items)
        if size < end:
            raise BadCheckpoint(
                f"{shown(name)} is truncated ({size:,} bytes, its .metadata needs {end:,})"
            )
        try:
            file = open(os.path.join(path, name), "rb")  # closed by the with below
        except OSError as e:
            raise BadCheckpoint(f"{shown(name)} cannot be opened ({e.strerror})") from None
        with file:
            for index, info in items:
                entry = entries[index.fqn]
                if type(entry) is not TensorStorageMetadata:
                    continue
                chunk = next(c for c in entry.chunks if c.offsets == index.offset)
                declared = math.prod(chunk.sizes) * entry.properties.dtype.itemsize
                stored = stored_tensor_bytes(file, info.offset, info.length)
                if stored != declared:
                    held = "no tensor" if stored is None else f"{stored:,} bytes"
                    raise BadCheckpoint(
                        f"{shown(name)}: {shown(index.fqn)} {tuple(chunk.sizes)} of "
                        f"{entry.properties.dtype} needs {declared:,} bytes but its entry holds "
                        f"{held}"
                    )


def read_checked(path: str) -> Metadata:
    """The `.metadata` of the checkpoint folder `path` once everything a load reads has
    passed: the file itself (`check_file`), its pickle and every byte item through
    `safe_load`'s allowlist, and `check_layout`. Raises `safe_load.UnsafeCheckpoint` or
    `BadCheckpoint` (one line, naming the file) before any load starts."""
    from . import safe_load

    check_file(path, safe_load.METADATA)
    try:
        metadata = safe_load.read_metadata(path)
    except safe_load.UnsafeCheckpoint:
        raise
    except Exception as e:  # garbage fails in many ways
        raise BadCheckpoint(f".metadata does not unpickle ({type(e).__name__})") from None
    check_layout(path, metadata)
    try:
        safe_load.vet_byte_items(path, metadata)
    except safe_load.UnsafeCheckpoint:
        raise
    except Exception as e:
        raise BadCheckpoint(safe_load.shown(str(e)) or type(e).__name__) from None
    return metadata
