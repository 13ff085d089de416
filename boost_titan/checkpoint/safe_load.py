"""Reading DCP checkpoints without running code from them: every pickle through one allowlist.

A DCP checkpoint folder holds pickles: its `.metadata` (DCP's dataclasses, written with
`pickle.dump`) and one `torch.save` archive per non-tensor value, a "byte item" (step
counters, optimizer and LR settings, TorchTitan's dataloader state, which is itself a
`pickle.dumps` string). Unpickling calls whatever the file names, and DCP reads both with
plain `pickle.load` / `torch.load(weights_only=False)`; only its tensors go through torch's
weights-only loader.

Why not torch's weights-only unpickler (`torch._weights_only_unpickler`, with
`torch.serialization.safe_globals`) for the rest: on torch 2.13 it implements the opcodes of
protocol 2 only, and `.metadata` is protocol 4 (`pickle.dump`'s default): it stops at the
first FRAME ("Unsupported operand 149"), and lacks MEMOIZE, STACK_GLOBAL, SHORT_BINUNICODE,
BINBYTES and the text opcodes of protocols 0/1 that a dataloader state may hold.
`CheckpointUnpickler` is instead CPython's own reference unpickler (`pickle._Unpickler`:
its opcode table, iterative, any protocol) with every opcode that can call, import or
mutate replaced:

- GLOBAL / STACK_GLOBAL / EXT*: only `allowed_globals()` (DCP's metadata classes,
  `torch.Size`, dtypes and layouts, `pathlib.PosixPath`, latin-1 `_codecs.encode`, which
  protocol 2 uses for bytes); anything else raises `UnsafeCheckpoint` naming it.
- REDUCE / NEWOBJ / NEWOBJ_EX call only those objects, as do INST / OBJ (protocol 0/1
  calls, whose class `find_class` resolves); persistent ids (torch.save's references to
  tensors, which byte items do not hold) are refused.
- BUILD: only on an instance of a DCP metadata class (never on a class or any other
  object), setting only that class's dataclass fields (torch's own weights-only loader
  allows BUILD on tensors, parameters and OrderedDicts alone, for the same reason).
- Sizes: a pickle is read whole into memory first (at most `MAX_PICKLE_BYTES`), allocates
  nothing larger than what it holds (BYTEARRAY8 preallocated its declared length), runs at
  most `MAX_OPCODES` opcodes weighted by what they keep (`OPCODE_COST`: a flood of
  empty sets, dicts or memo entries costs more), builds no tuple nested deeper than
  `MAX_DEPTH` (a dict key is hashed recursively, in C) and, once loaded, is walked without
  recursion: no container deeper than `MAX_DEPTH`, no cycle.
- Hash flooding: a dict, set or frozenset may hold at most `MAX_SAME_HASH` keys of one
  hash (`KeyHashes`), counted before they are inserted, so no insert probes more than that
  (and a PUT index stays below `MAX_MEMO_INDEX`); `KeyHashes` serves any container a reader
  builds from a checkpoint's values too (`dcp_layout`'s chunk index).

- `read_metadata(path)`, `vet_byte_items(path, metadata)`: read a checkpoint's `.metadata`
  and every byte item (and the pickle that every bytes value in one holds) up front, so
  that a loader can refuse it with one message before any load starts.
- `loads(data)`: one pickle (TorchTitan's dataloader state).

DCP's own loads read through the same allowlist with `reads.GuardedReader` and
`reads.GuardedPlanner`, passed to each `dcp.load` (nothing of torch is patched).
"""

from __future__ import annotations

import _compat_pickle
import dataclasses
import functools
import io
import os
import pickle
import stat
import struct
import zipfile
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.distributed.checkpoint.metadata import Metadata
    from torch.distributed.checkpoint.planner import ReadItem

METADATA = ".metadata"
MAX_PICKLE_BYTES = 256 << 20
"""The largest pickle read (a `.metadata` or a byte item's `data.pkl`)."""
MAX_ITEM_BYTES = 256 << 20
"""The largest byte item (a torch.save archive) a `.metadata` may declare (`dcp_layout`):
DCP reads one whole into memory."""
MAX_OPCODES = 16_000_000
"""What one pickle may run, in opcodes weighted by what they keep (`OPCODE_COST`); a DCP
`.metadata` costs about 110 per storage entry (scripts/hostile_checkpoints.py prints it)."""
OPCODE_COST = {
    **dict.fromkeys([pickle.EMPTY_SET, pickle.FROZENSET], 16),  # a set: about 220 bytes
    **dict.fromkeys(
        [pickle.EMPTY_DICT, pickle.DICT, pickle.EMPTY_LIST, pickle.LIST, pickle.MEMOIZE]
        + [pickle.BINPUT, pickle.LONG_BINPUT, pickle.PUT],
        4,  # a dict, list or memo entry: about 60-100 bytes
    ),
}
"""Opcodes that keep more than a small object (an int, a pointer: weight 1)."""
MAX_DEPTH = 64
"""How deep containers may nest (DCP's metadata nests about 8 deep)."""
MAX_SAME_HASH = 8
"""The most keys of one dict or set whose hashes are equal: each insert compares a
key with every earlier one of its hash, so a flood of alike keys (ints that are multiples of
2**61 - 1 all hash to 0) is quadratic however few opcodes build it."""
COUNTED_FROM = 16
"""Keys a dict or set holds before its hashes are counted (a smaller one cannot flood)."""
KEY_COST = 2
"""What each counted key costs against `MAX_OPCODES` (its hash is kept: about 70 bytes)."""
MAX_MEMO_INDEX = 1 << 32
"""PUT's text index may be any int, and ints from 2**61 - 1 on hash alike (the memo is a
dict): it is kept to LONG_BINPUT's 4-byte range."""


class UnsafeCheckpoint(pickle.UnpicklingError):
    """A checkpoint's pickle does `what` (asks for a global outside the allowlist, sets the
    state of a class, nests too deep...); `part` is the file (and item) that holds it."""

    def __init__(self, what: str, part: str | None = None) -> None:
        self.what, self.part = what, part
        super().__init__(f"{part or 'a pickle'} {what}")

    def __reduce__(self) -> tuple:  # DCP gathers a rank's exception to the others pickled
        return UnsafeCheckpoint, (self.what, self.part)

    def at(self, part: str) -> UnsafeCheckpoint:
        """The same refusal, naming the file (and item) that holds it."""
        return UnsafeCheckpoint(self.what, part)


def shown(text: str, limit: int = 120) -> str:
    """A name from a file, fit for a one-line message: as is when printable, else its repr;
    cut at `limit` characters."""
    text = text if text.isprintable() else repr(text)
    return text if len(text) <= limit else f"{text[:limit]}..."


def _latin1(text: str, encoding: str) -> bytes:
    """`_codecs.encode` as protocol 2 uses it for bytes: latin-1 text only (another codec
    name would import a codec module)."""
    if type(text) is not str or encoding != "latin1":
        raise UnsafeCheckpoint(f"asks for _codecs.encode({type(text).__name__}, {encoding!r})")
    return text.encode("latin1")


@functools.cache
def buildable() -> frozenset[type]:
    """The classes whose instances BUILD may fill: DCP's metadata dataclasses."""
    from torch.distributed.checkpoint import metadata as dcp_metadata
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    return frozenset(
        {
            dcp_metadata.Metadata,
            dcp_metadata.MetadataIndex,
            dcp_metadata.StorageMeta,
            dcp_metadata.TensorStorageMetadata,
            dcp_metadata.BytesStorageMetadata,
            dcp_metadata.ChunkStorageMetadata,
            dcp_metadata.TensorProperties,
            _StorageInfo,
        }
    )


@functools.cache
def allowed_globals() -> dict[str, Any]:
    """'module.name' -> object: every global the pickles of a DCP checkpoint need."""
    import pathlib

    from torch.distributed.checkpoint import metadata as dcp_metadata

    objects = [
        *buildable(),
        dcp_metadata._MEM_FORMAT_ENCODING,
        torch.Size,
        torch.serialization._get_layout,  # how torch.layout pickles
        pathlib.PosixPath,  # StorageMeta.checkpoint_id
    ]
    allowed = {f"{obj.__module__}.{obj.__qualname__}": obj for obj in objects}
    allowed["_codecs.encode"] = _latin1  # how protocol 2 (torch.save's) pickles bytes
    dtypes = {name: value for name, value in vars(torch).items() if isinstance(value, torch.dtype)}
    allowed.update((f"torch.{name}", dtype) for name, dtype in dtypes.items())
    return allowed


@functools.cache
def _callables() -> frozenset[int]:
    """ids of the allowlisted objects that REDUCE / NEWOBJ may call."""
    return frozenset(id(obj) for obj in allowed_globals().values() if callable(obj))


class KeyHashes:
    """The hashes of the keys put into one dict or set, counted as they come: more than
    `MAX_SAME_HASH` alike is a hash flood (UnsafeCheckpoint), refused before it is inserted."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}  # a hash is an int that hashes to itself

    def add(self, keys: Any) -> int:
        """Count `keys`; returns how many."""
        counts, added = self.counts, 0
        for key in keys:
            try:
                code = hash(key)
            except TypeError:
                raise pickle.UnpicklingError("an unhashable dict key or set member") from None
            seen = counts.get(code, 0) + 1
            if seen > MAX_SAME_HASH:
                raise UnsafeCheckpoint(
                    f"holds more than {MAX_SAME_HASH} keys of one hash in a dict or set (a hash "
                    "flood: each insert would compare with every one)"
                )
            counts[code] = seen
            added += 1
        return added


def _check_key(value: Any) -> Any:
    """`value`, refused if it is a dict key (MetadataIndex, hashed through its fields) whose
    fields are not a name, a torch.Size and an int: a key nested in a key would hash
    recursively, in C."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    if type(value) is MetadataIndex:
        fields = vars(value)
        if (
            type(fields.get("fqn", "")) is not str
            or type(fields.get("offset")) not in (torch.Size, type(None))
            or type(fields.get("index")) not in (int, type(None))
        ):
            raise pickle.UnpicklingError("a MetadataIndex that is not (name, offsets, index)")
    return value


def _counted(load: Callable, cost: int) -> Callable:
    """An opcode's handler that counts `cost` against `MAX_OPCODES`."""

    def run(self: CheckpointUnpickler) -> None:
        self.opcodes += cost
        if self.opcodes > MAX_OPCODES:
            raise UnsafeCheckpoint(f"runs more than {MAX_OPCODES:,} pickle opcodes")
        load(self)

    return run


class CheckpointUnpickler(pickle._Unpickler):
    """CPython's reference unpickler resolving only `allowed_globals()`, calling only them,
    filling only instances of `buildable()` classes, and capped in size and depth (see the
    module docstring). Read a whole pickle with `unpickle`."""

    def __init__(self, file: IO[bytes]) -> None:
        super().__init__(file)
        self.opcodes = 0
        self.tuple_depth: dict[int, tuple[Any, int]] = {}  # id -> (tuple, depth), kept alive
        self.key_hashes: dict[int, tuple[Any, KeyHashes]] = {}  # id -> (container, its hashes)

    def find_class(self, module: str, name: str) -> Any:
        # Python 2 names (protocol 2, torch.save's: __builtin__, commands) as Python 3's
        module, name = _compat_pickle.NAME_MAPPING.get(
            (module, name), (_compat_pickle.IMPORT_MAPPING.get(module, module), name)
        )
        found = allowed_globals().get(f"{module}.{name}")
        if found is None:
            raise UnsafeCheckpoint(f"asks for {shown(f'{module}.{name}')}")
        return found

    def _call(self, function: Any, args: Any, kwargs: Any = None) -> Any:
        if id(function) not in _callables():
            raise UnsafeCheckpoint(f"calls a {type(function).__name__}, not an allowed global")
        if type(args) is not tuple or (kwargs is not None and type(kwargs) is not dict):
            raise pickle.UnpicklingError("call arguments are not a tuple")
        return function(*args, **(kwargs or {}))

    def _instantiate(self, klass: Any, args: list) -> None:  # INST and OBJ
        if id(klass) not in _callables():
            raise UnsafeCheckpoint(f"calls a {type(klass).__name__}, not an allowed global")
        super()._instantiate(klass, args)

    def load_reduce(self) -> None:
        args = self.stack.pop()
        self.stack[-1] = _check_key(self._call(self.stack[-1], args))

    def _new(self, cls: Any, args: Any, kwargs: Any = None) -> Any:
        if not isinstance(cls, type) or id(cls) not in _callables():
            raise UnsafeCheckpoint(f"creates a {type(cls).__name__}, not an allowed class")
        if type(args) is not tuple or (kwargs is not None and type(kwargs) is not dict):
            raise pickle.UnpicklingError("NEWOBJ arguments are not a tuple")
        return cls.__new__(cls, *args, **(kwargs or {}))

    def load_newobj(self) -> None:
        args = self.stack.pop()
        self.stack[-1] = self._new(self.stack[-1], args)

    def load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        self.stack[-1] = self._new(self.stack[-1], args, kwargs)

    def load_build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        cls = type(inst)
        if isinstance(inst, type) or cls not in buildable():
            raise UnsafeCheckpoint(f"sets the state of a {cls.__qualname__} (BUILD)")
        if "__setstate__" in vars(cls):  # TensorProperties: a tuple of its fields
            if type(state) is not tuple or len(state) != len(dataclasses.fields(cls)):
                raise pickle.UnpicklingError(f"bad state for {cls.__qualname__}")
            cls.__setstate__(inst, state)
            return
        names = {field.name for field in dataclasses.fields(cls)}
        if type(state) is not dict or not all(type(k) is str and k in names for k in state):
            raise UnsafeCheckpoint(f"sets other attributes than {cls.__qualname__}'s fields")
        inst.__dict__.update(state)
        _check_key(inst)

    def _depth_of(self, value: Any) -> int:
        """How deep a tuple or frozenset made by this pickle nests (0 for anything else)."""
        known = self.tuple_depth.get(id(value))
        return 0 if known is None or known[0] is not value else known[1]

    def _made(self, container: tuple | frozenset) -> None:
        """Record a new tuple / frozenset's depth; refuse one deeper than MAX_DEPTH."""
        depth = 1 + max(map(self._depth_of, container), default=0)
        if depth > MAX_DEPTH:
            raise UnsafeCheckpoint(f"nests tuples deeper than {MAX_DEPTH}")
        self.tuple_depth[id(container)] = (container, depth)

    def load_tuple(self) -> None:
        super().load_tuple()
        self._made(self.stack[-1])

    def load_tuple1(self) -> None:
        super().load_tuple1()
        self._made(self.stack[-1])

    def load_tuple2(self) -> None:
        super().load_tuple2()
        self._made(self.stack[-1])

    def load_tuple3(self) -> None:
        super().load_tuple3()
        self._made(self.stack[-1])

    def load_frozenset(self) -> None:
        items = self.pop_mark()
        self._admit(None, items)
        frozen = frozenset(items)
        self._made(frozen)
        self.append(frozen)

    def _admit(self, container: Any, keys: list) -> None:
        """Count the hashes of `keys`, about to go into `container` (a dict or set; None: a
        frozenset about to be made of them), once it holds COUNTED_FROM keys; each counted
        key costs KEY_COST opcodes."""
        known = self.key_hashes.get(id(container))
        if known is None or known[0] is not container:
            held = 0 if container is None else len(container)
            if type(container) not in (dict, set, type(None)) or held + len(keys) < COUNTED_FROM:
                return
            known = (container, KeyHashes())
            if container is not None:  # its later inserts are counted on top
                self.key_hashes[id(container)] = known
            keys = [*(container or ()), *keys]  # the keys it holds already: counted now
        self.opcodes += KEY_COST * known[1].add(keys)
        if self.opcodes > MAX_OPCODES:
            raise UnsafeCheckpoint(f"runs more than {MAX_OPCODES:,} pickle opcodes")

    def load_dict(self) -> None:
        items = self.pop_mark()
        made: dict = {}
        self._admit(made, items[::2])
        made.update(zip(items[::2], items[1::2], strict=True))
        self.append(made)

    def load_setitem(self) -> None:
        self._admit(self.stack[-3], [self.stack[-2]])
        super().load_setitem()

    def load_setitems(self) -> None:
        items = self.pop_mark()
        self._admit(self.stack[-1], items[::2])
        for key, value in zip(items[::2], items[1::2], strict=True):
            self.stack[-1][key] = value

    def load_additems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if type(target) is not set:  # dict.update would take pairs, unchecked
            raise pickle.UnpicklingError(f"ADDITEMS on a {type(target).__name__}, not a set")
        self._admit(target, items)
        target.update(items)

    def load_put(self) -> None:
        index = int(self.readline()[:-1])
        if not 0 <= index < MAX_MEMO_INDEX:
            raise pickle.UnpicklingError(f"a PUT index outside 0..{MAX_MEMO_INDEX - 1}")
        self.memo[index] = self.stack[-1]

    def load_bytearray8(self) -> None:
        # pickle._Unpickler allocates the declared length first, whatever the data holds
        (size,) = struct.unpack("<Q", self.read(8))
        data = self.read(min(size, MAX_PICKLE_BYTES + 1))
        if len(data) != size:
            raise pickle.UnpicklingError("BYTEARRAY8 declares more bytes than the pickle holds")
        self.append(bytearray(data))

    def load_persid(self) -> None:
        raise pickle.UnpicklingError("a persistent id (a tensor reference) in a byte item")

    dispatch = dict(pickle._Unpickler.dispatch)
    for _op, _name in (
        (pickle.REDUCE, "load_reduce"),
        (pickle.NEWOBJ, "load_newobj"),
        (pickle.NEWOBJ_EX, "load_newobj_ex"),
        (pickle.BUILD, "load_build"),
        (pickle.TUPLE, "load_tuple"),
        (pickle.TUPLE1, "load_tuple1"),
        (pickle.TUPLE2, "load_tuple2"),
        (pickle.TUPLE3, "load_tuple3"),
        (pickle.FROZENSET, "load_frozenset"),
        (pickle.BYTEARRAY8, "load_bytearray8"),
        (pickle.DICT, "load_dict"),
        (pickle.SETITEM, "load_setitem"),
        (pickle.SETITEMS, "load_setitems"),
        (pickle.ADDITEMS, "load_additems"),
        (pickle.PUT, "load_put"),
        (pickle.PERSID, "load_persid"),
        (pickle.BINPERSID, "load_persid"),
    ):
        dispatch[_op[0]] = locals()[_name]
    dispatch = {
        op: _counted(load, OPCODE_COST.get(bytes([op]), 1)) for op, load in dispatch.items()
    }
    del _op, _name


def _children(value: Any) -> Any:
    """What a loaded value holds (none for a leaf)."""
    kind = type(value)
    if kind in (tuple, list, set, frozenset):
        return value
    if kind is dict:
        return [*value.keys(), *value.values()]
    if kind in buildable():
        return list(vars(value).values())
    return ()


def check_nesting(value: Any) -> None:
    """Refuse a loaded value that nests containers deeper than MAX_DEPTH or holds a
    cycle; walks each container once, without recursion."""
    done: set[int] = set()
    path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, leaving = stack.pop()
        key = id(item)
        if leaving:
            path.discard(key)
            done.add(key)
            continue
        children = _children(item)
        if not children or key in done:
            continue
        if key in path:
            raise UnsafeCheckpoint("holds a container that contains itself")
        path.add(key)
        if len(path) > MAX_DEPTH:
            raise UnsafeCheckpoint(f"nests containers deeper than {MAX_DEPTH}")
        stack.append((item, True))
        stack.extend((child, False) for child in children)


def unpickle(data: bytes) -> Any:
    """One pickle's value through `CheckpointUnpickler`, its nesting checked."""
    if len(data) > MAX_PICKLE_BYTES:
        raise UnsafeCheckpoint(f"is a pickle of {len(data):,} bytes (most: {MAX_PICKLE_BYTES:,})")
    try:
        value = CheckpointUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError:
        raise
    except Exception as e:  # garbage fails in many ways (EOFError, KeyError, ValueError...)
        raise pickle.UnpicklingError(f"not a pickle it can read ({type(e).__name__})") from None
    check_nesting(value)
    return value


def loads(data: bytes) -> Any:
    """Unpickle `data` through the allowlist (any protocol)."""
    if not isinstance(data, bytes):
        raise pickle.UnpicklingError(f"a {type(data).__name__}, not the bytes of a pickle")
    return unpickle(data)


def check_stored(info: zipfile.ZipInfo) -> None:
    """A byte item's `data.pkl` is stored, as torch.save writes it: a compressed one (a
    1 KB bzip2 member may inflate to 256 MiB) is refused before it is read."""
    if info.compress_type != zipfile.ZIP_STORED:
        raise UnsafeCheckpoint("is a compressed archive (torch.save writes them stored)")


def is_regular(mode: int) -> bool:
    """Whether a file of `st_mode` `mode` may be read: a regular file (a FIFO blocks its
    reader, a device never ends)."""
    return stat.S_ISREG(mode)


def load_saved(stream: IO[bytes]) -> Any:
    """A value `torch.save` wrote (a DCP byte item): its archive's `data.pkl` through the
    allowlist. Byte items hold no tensors (DCP stores those apart), so a persistent id,
    torch.save's reference to a tensor's storage, is refused like any other unknown; a
    compressed member (torch.save stores them uncompressed) is refused before it is read."""
    with zipfile.ZipFile(stream) as archive:
        # torch.save's zip layout: <archive name>/data.pkl, next to the tensors' records
        pickles = [info for info in archive.infolist() if info.filename.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise pickle.UnpicklingError("not a torch.save archive (no single data.pkl)")
        info = pickles[0]
        check_stored(info)
        if info.file_size > MAX_PICKLE_BYTES:
            raise UnsafeCheckpoint(f"holds a pickle of {info.file_size:,} bytes")
        with archive.open(info) as data:
            return unpickle(data.read(MAX_PICKLE_BYTES + 1))


def read_file(path: str, limit: int) -> bytes:
    """A regular file's bytes (at most `limit`): opened without blocking (a FIFO would
    wait for a writer) and checked to be a regular file before it is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not is_regular(info.st_mode):
            raise UnsafeCheckpoint("is not a regular file")
        if info.st_size > limit:
            raise UnsafeCheckpoint(f"holds {info.st_size:,} bytes (most: {limit:,})")
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read(limit + 1)
    finally:
        os.close(fd)


def read_metadata(path: str) -> Metadata:
    """The `.metadata` of the DCP checkpoint folder `path`, through the allowlist
    (UnsafeCheckpoint names the file)."""
    try:
        return unpickle(read_file(os.path.join(path, METADATA), MAX_PICKLE_BYTES))
    except UnsafeCheckpoint as e:
        raise e.at(METADATA) from None


def vet_value(value: Any) -> None:
    """Every bytes value a byte item holds is a pickle (TorchTitan's dataloader state,
    whatever its first byte): it must unpickle through the allowlist too."""
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is bytes:
            loads(item)
        else:
            stack.extend(_children(item))


class _ByteItemVetter:
    """The planner side of `FileSystemReader.read_data` for `vet_byte_items`: each byte item
    (and the pickle in each bytes value of one) is unpickled through the allowlist."""

    def __init__(self, metadata: Metadata) -> None:
        self.files = {index: info.relative_path for index, info in metadata.storage_data.items()}
        self.values: dict[str, Any] = {}

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        index = read_item.storage_index
        part = f"{shown(self.files[index])} ({shown(index.fqn)})"
        try:
            loaded = load_saved(value)
            vet_value(loaded)
        except UnsafeCheckpoint as e:
            raise e.at(part) from None
        except Exception as e:  # a damaged archive or pickle fails in many ways
            reason = shown(str(e)) if isinstance(e, pickle.UnpicklingError) else type(e).__name__
            raise pickle.UnpicklingError(f"{part} does not unpickle: {reason}") from None
        self.values[index.fqn] = loaded


def vet_byte_items(path: str, metadata: Metadata) -> dict[str, Any]:
    """Unpickle every byte item of the checkpoint at `path` (read with DCP's own reader, as a
    load would) through the allowlist; UnsafeCheckpoint names the file and item. Returns
    fqn -> value."""
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
    vetter = _ByteItemVetter(metadata)
    reader.read_data(LoadPlan(items), vetter).wait()
    return vetter.values
