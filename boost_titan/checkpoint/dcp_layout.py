"""What a DCP checkpoint's `.metadata` may say, checked before anything is read or allocated.

`safe_load` makes sure unpickling `.metadata` runs no code; this module checks what it
says, since every later read trusts it: `check_layout(path, metadata)` raises
`BadCheckpoint` (a one-line reason naming the file) unless

- every entry has DCP's types: tensors (dtype, non-negative sizes, at most
  `MAX_CHUNKS_PER_TENSOR` chunks inside the tensor and covering it), byte items (at most
  `safe_load.MAX_ITEM_BYTES`, which a reader holds in memory), and storage entries
  (`relative_path`, `offset`, `length` as a name and integers, no storage transforms), one
  per chunk and byte item;
- the storage indices of a tensor's chunks do not
  flood one hash (`safe_load.KeyHashes`); each storage entry finds its chunk by index;
- every file an entry names is a relative name without `..` that resolves (symlinks
  included) inside the checkpoint folder (`check_inside`), and is a regular file (a FIFO
  would block its reader), and every entry's bytes lie inside it;
- every tensor chunk's entry is a torch.save archive that torch.load's own zip reader sees
  as one tensor (`records_problem`: at most 16 records, each named once, one tensor record,
  `data/0`, the others small: zip entries that all point at one record would each be
  materialised) holding exactly the chunk's bytes (`size_problem`: shape x dtype size): a
  `.metadata` cannot make a reader allocate a tensor its files do not hold.

`check_confined(path)`: a `step-N` folder a reader picked in a run's folder is not a symlink
to a folder elsewhere.

`read_checked(path)` is all of it with `safe_load`'s reads: what `load_sharded` runs first.
"""

from __future__ import annotations

import io
import math
import os
from typing import TYPE_CHECKING, Any

import torch

from . import safe_load
from .safe_load import MAX_ITEM_BYTES, KeyHashes, UnsafeCheckpoint, shown

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
    )


MAX_CHUNKS_PER_TENSOR = 8192
"""DCP writes one chunk of a tensor per rank that holds a piece of it: a tensor cut into
more pieces than any run of this product has ranks is refused before its chunks are read
(each costs a storage lookup, a file check and a torch.load)."""


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


def check_types(metadata: Metadata) -> dict[MetadataIndex, ChunkStorageMetadata | None]:
    """Every entry of `metadata` has the types DCP writes (see the module docstring).
    Returns the storage index of each tensor chunk (-> its chunk) and byte item (-> None):
    what `storage_data` must hold, no more, no less."""
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
    needed: dict[MetadataIndex, ChunkStorageMetadata | None] = {}
    hashes = KeyHashes()  # chunk offsets are the file's: they may all hash alike

    def need(index: MetadataIndex, chunk: ChunkStorageMetadata | None) -> None:
        if index in needed:  # one storage entry serves both (empty chunks of two ranks)
            return
        try:
            hashes.add([index])
        except UnsafeCheckpoint as e:
            raise BadCheckpoint(f"{where}: {shown(index.fqn)} {e.what}") from None
        needed[index] = chunk

    for fqn, entry in entries.items():
        if type(fqn) is not str:
            raise BadCheckpoint(f"{where} has an entry named by a {type(fqn).__name__}")
        if type(entry) is BytesStorageMetadata:
            need(MetadataIndex(fqn), None)
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
        if len(chunks) > MAX_CHUNKS_PER_TENSOR:
            raise BadCheckpoint(
                f"{where}: {shown(fqn)} is split into {len(chunks):,} chunks (most: "
                f"{MAX_CHUNKS_PER_TENSOR:,}, one per rank holding a piece of it)"
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
            need(MetadataIndex(fqn, offsets), chunk)
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
    missing = [index.fqn for index in needed if index not in storage]
    if missing:
        raise BadCheckpoint(f"{where} stores no bytes for {shown(min(missing))}")
    return needed


def check_inside(folder: str, name: str) -> str:
    """The path of the file `name` inside `folder`; BadCheckpoint when `name` is absolute,
    has a `..` part or resolves (through a symlink) outside `folder`."""
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
    return path


def check_file(folder: str, name: str) -> int:
    """The size of the regular file `name` inside `folder` (`check_inside`); BadCheckpoint
    when it is missing or not a regular file (`safe_load.is_regular`)."""
    path = check_inside(folder, name)
    try:
        info = os.stat(path)
    except OSError:
        raise BadCheckpoint(f"{shown(name)} is missing (its .metadata names it)") from None
    if not safe_load.is_regular(info.st_mode):
        raise BadCheckpoint(f"{shown(name)} is not a regular file")
    return info.st_size


def check_confined(path: str) -> None:
    """The checkpoint folder `path`, which a reader picked in its parent folder (the newest
    `step-N` of a run), resolves to a folder of that parent: a symlink to a folder elsewhere
    is refused (its files would pass every check against their own folder)."""
    parent = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    real = os.path.realpath(path)
    if os.path.dirname(real) != parent:
        raise BadCheckpoint(f"it is a symlink to {shown(real)}, outside {shown(parent)}")


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


MAX_ARCHIVE_RECORDS = 16
"""Records a tensor chunk's archive may hold (torch.save writes 7: data.pkl, the tensor's
data/0, and five small ones)."""
MAX_SMALL_RECORD = 64 << 10
"""The largest record of such an archive besides data/0 (data.pkl of one tensor: ~200 bytes)."""


READ_WHOLE = 1 << 20
"""An archive up to this long is read into memory at once (many small chunks: one read
each); a longer one is read through a window of its file."""


def tensor_records(file: io.BufferedIOBase, offset: int, length: int) -> list[tuple[str, int]]:
    """(name, size) of each record of the torch.save archive at `offset` (`length` bytes) of
    `file`, as torch.load's own zip reader lists them (each one it may materialise, however
    many directory entries point at the same bytes); ValueError when it is no archive."""
    if length <= READ_WHOLE:
        file.seek(offset)
        source: Any = io.BytesIO(file.read(length))
    else:
        source = _Window(file, offset, length)
    try:
        reader = torch._C.PyTorchFileReader(source)
        names = reader.get_all_records()
        names = names[: MAX_ARCHIVE_RECORDS + 1]  # one more: too many
        return [(name, reader.get_record_size(name)) for name in names]
    except Exception:  # a damaged archive fails in many ways
        raise ValueError("no tensor archive") from None


def records_problem(records: list[tuple[str, int]]) -> str | None:
    """What makes `tensor_records` more than one tensor's archive, or None: more than
    MAX_ARCHIVE_RECORDS records, a name twice, other tensor records than `data/0`, another
    record over MAX_SMALL_RECORD. What torch.load allocates is then data/0 and a few KB."""
    names = [name for name, _ in records]
    if len(names) > MAX_ARCHIVE_RECORDS:
        return f"more than {MAX_ARCHIVE_RECORDS} zip records (torch.save writes 7)"
    if len(set(names)) != len(names):
        return "a zip record named twice"
    tensors = [name for name in names if name.startswith("data/")]
    if tensors != ["data/0"]:
        return f"{len(tensors):,} tensor records (a chunk is one, data/0)"
    big = [(n, size) for n, size in records if n != "data/0" and size > MAX_SMALL_RECORD]
    if big:
        return f"a record {shown(big[0][0])} of {big[0][1]:,} bytes"
    return None


def size_problem(records: list[tuple[str, int]], declared: int) -> str | None:
    """None when the archive's tensor record `data/0` holds exactly `declared` bytes (what
    the metadata's shape x dtype says), else what it holds."""
    stored = dict(records).get("data/0")
    if stored == declared:
        return None
    return "no tensor record" if stored is None else f"{stored:,} bytes"


def check_layout(path: str, metadata: Metadata) -> None:
    """`metadata` (of the checkpoint folder `path`) has DCP's types, names only regular
    files inside `path`, and every item lies inside its file; each tensor chunk stores
    exactly its bytes. Raises BadCheckpoint naming the file."""

    chunks = check_types(metadata)
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
                chunk = chunks[index]  # by index: a scan is quadratic in the chunks
                if chunk is None:  # a byte item: safe_load reads it
                    continue
                dtype = entries[index.fqn].properties.dtype
                declared = math.prod(chunk.sizes) * dtype.itemsize
                try:
                    records = tensor_records(file, info.offset, info.length)
                    problem = records_problem(records) or size_problem(records, declared)
                except ValueError as e:
                    problem = str(e)
                if problem:
                    raise BadCheckpoint(
                        f"{shown(name)}: {shown(index.fqn)} {tuple(chunk.sizes)} of {dtype} needs "
                        f"{declared:,} bytes but its entry holds {problem}"
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
