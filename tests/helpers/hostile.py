"""Hostile checkpoints built by hand, as an attacker would alter a folder the product wrote
(issue 39): pickles that call, mutate classes or nest deep, metadata with wrong types or
files outside the folder, compressed byte items, misnamed step folders. Shared by
`tests/unit/test_hostile_checkpoints.py` (each case through every reader) and the fuzzer
(`tests/helpers/checkpoint_fuzz.py`)."""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import pickle
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# ---- pickles -------------------------------------------------------------------------------


def _unicode(text: str) -> bytes:
    data = text.encode()
    return (
        pickle.SHORT_BINUNICODE + bytes([len(data)]) + data
        if len(data) < 256
        else (pickle.BINUNICODE + struct.pack("<I", len(data)) + data)
    )


def call(module: str, name: str, arg: str, protocol: int) -> bytes:
    """A pickle that calls `module.name(arg)`: protocol 0 text (`cposix\\nsystem\\n(V..\\ntR.`),
    GLOBAL + REDUCE (2), STACK_GLOBAL + REDUCE (4)."""
    if protocol == 0:
        return f"c{module}\n{name}\n(V{arg}\ntR.".encode()
    if protocol < 4:
        head = pickle.PROTO + bytes([protocol]) + pickle.GLOBAL + f"{module}\n{name}\n".encode()
    else:
        head = pickle.PROTO + b"\x04" + _unicode(module) + _unicode(name) + pickle.STACK_GLOBAL
    return head + _unicode(arg) + pickle.TUPLE1 + pickle.REDUCE + pickle.STOP


def inst(module: str, name: str, arg: str) -> bytes:
    """Protocol 0's INST: calls `module.name(arg)` without REDUCE."""
    return f"(V{arg}\ni{module}\n{name}\n.".encode()


def set_class_attribute(module: str, name: str, attribute: str) -> bytes:
    """Opcodes (no PROTO, no STOP) that BUILD on the class `module.name` itself, setting
    `attribute` to an int through BUILD's slot state (None, {attribute: 1}), which any
    unpickler sets with setattr, then POP it: prefixed to a pickle, they mutate the class for
    the whole process (what 83 bytes before `.metadata` did to `Metadata.__getstate__`)."""
    return (
        _unicode(module)
        + _unicode(name)
        + pickle.STACK_GLOBAL
        + pickle.NONE
        + pickle.EMPTY_DICT
        + _unicode(attribute)
        + pickle.BININT1
        + b"\x01"
        + pickle.SETITEM
        + pickle.TUPLE2
        + pickle.BUILD
        + pickle.POP
    )


def prefixed(prefix: bytes, data: bytes) -> bytes:
    """`data` (a protocol >= 2 pickle) with opcodes run before its own."""
    return data[:2] + prefix + data[2:]


def deep_tuple(depth: int) -> bytes:
    """A tuple nested `depth` deep, as a dict key (hashing it recurses in C)."""
    return (
        pickle.PROTO
        + b"\x04"
        + pickle.EMPTY_DICT
        + pickle.EMPTY_TUPLE
        + pickle.TUPLE1 * depth
        + pickle.NONE
        + pickle.SETITEM
        + pickle.STOP
    )


def deep_list(depth: int) -> bytes:
    """A list nested `depth` deep."""
    return pickle.PROTO + b"\x04" + pickle.EMPTY_LIST * depth + pickle.APPEND * (depth - 1) + b"."


def claims(opcode: bytes, size: int) -> bytes:
    """An opcode that declares `size` bytes follow (BINBYTES8, FRAME...) and ends there."""
    return pickle.PROTO + b"\x04" + opcode + struct.pack("<Q", size) + b"x" * 8


def hostile_pickles(marker: Path) -> dict[str, bytes]:
    """name -> a pickle that runs `touch marker` when plainly unpickled, mutates a class,
    or exhausts the stack or memory."""
    touch = f"touch {marker}"
    code = f"open({str(marker)!r}, 'w').close()"
    return {
        "posix.system p0": call("posix", "system", touch, 0),
        "os.system p0": call("os", "system", touch, 0),
        "posix.system p2": call("posix", "system", touch, 2),
        "builtins.exec p4": call("builtins", "exec", code, 4),
        "builtins.eval INST": inst("builtins", "eval", code),
        "Metadata.__getstate__": prefixed(
            set_class_attribute(
                "torch.distributed.checkpoint.metadata", "Metadata", "__getstate__"
            ),
            pickle.dumps({}, protocol=4),
        ),
        "PosixPath._str": prefixed(
            set_class_attribute("pathlib", "PosixPath", "_str"), pickle.dumps({}, protocol=4)
        ),
        "deep tuple": deep_tuple(1_000_000),
        "deep list": deep_list(20_000),
        "BINBYTES8 2**60": claims(pickle.BINBYTES8, 1 << 60),
        "FRAME 2**60": claims(pickle.FRAME, 1 << 60),
    }


# ---- checkpoint folders ----------------------------------------------------------------------


def read_metadata(folder: Path) -> Any:
    """The `.metadata` of a checkpoint this test wrote (trusted: plain pickle)."""
    return pickle.loads((folder / ".metadata").read_bytes())


def write_metadata(folder: Path, metadata: Any) -> None:
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))


def edit_storage(folder: Path, fqn: str, **changes: Any) -> None:
    """Change fields of the storage entry of `fqn` (relative_path, offset, length)."""
    metadata = read_metadata(folder)
    index = next(i for i in metadata.storage_data if i.fqn == fqn)
    info = metadata.storage_data[index]
    for name, value in changes.items():
        object.__setattr__(info, name, value)
    write_metadata(folder, metadata)


def stored_archive(data_pkl: bytes, compress: int = zipfile.ZIP_STORED) -> bytes:
    """A torch.save-shaped archive holding `data_pkl` (compressed with `compress`)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compress) as archive:
        archive.writestr("archive/data.pkl", data_pkl)
        archive.writestr("archive/version", "3\n")
    return buffer.getvalue()


def replace_stored(folder: Path, fqn: str, archive: bytes) -> None:
    """Point the byte item `fqn`, or the first chunk of the tensor `fqn`, at `archive`,
    appended to its shard file."""
    metadata = read_metadata(folder)
    index = next(i for i in metadata.storage_data if i.fqn == fqn)
    info = metadata.storage_data[index]
    shard = folder / info.relative_path
    offset = shard.stat().st_size
    with shard.open("ab") as f:
        f.write(archive)
    metadata.storage_data[index] = dataclasses.replace(info, offset=offset, length=len(archive))
    write_metadata(folder, metadata)


def tensor_archive(folder: Path, fqn: str) -> bytes:
    """The archive of the first chunk of the tensor `fqn`."""
    info = next(v for i, v in read_metadata(folder).storage_data.items() if i.fqn == fqn)
    with (folder / info.relative_path).open("rb") as f:
        f.seek(info.offset)
        return f.read(info.length)


def saved(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def first_tensor(metadata: Any) -> str:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    return next(
        k for k, v in metadata.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)
    )


def claim_vocab(folder: Path, rows: int = 1_000_000) -> str:
    """The first tensor (the embedding) claims `rows` rows, its bytes an 8-byte file."""
    metadata = read_metadata(folder)
    fqn = first_tensor(metadata)
    entry = metadata.state_dict_metadata[fqn]
    size = torch.Size([rows, *entry.size[1:]])
    entry.size = size
    entry.chunks = [
        dataclasses.replace(entry.chunks[0], offsets=torch.Size([0] * len(size)), sizes=size)
    ]
    index = next(i for i in metadata.storage_data if i.fqn == fqn)
    info = metadata.storage_data.pop(index)
    (folder / "tiny.distcp").write_bytes(b"\0" * 8)
    metadata.storage_data[type(index)(fqn, entry.chunks[0].offsets)] = dataclasses.replace(
        info, relative_path="tiny.distcp", offset=0, length=8
    )
    write_metadata(folder, metadata)
    return fqn


def _shard_of(folder: Path) -> str:
    return next(iter(read_metadata(folder).storage_data.values())).relative_path


def _every_path(folder: Path, name: str) -> None:
    metadata = read_metadata(folder)
    for info in metadata.storage_data.values():
        object.__setattr__(info, "relative_path", name)
    write_metadata(folder, metadata)


def _fifo(folder: Path) -> None:
    os.mkfifo(folder / "fifo")
    edit_storage(folder, "train_state.step", relative_path="fifo", offset=0, length=0)


def _symlink_out(folder: Path) -> None:
    outside = folder.parent / f"{folder.name}-outside.distcp"
    outside.write_bytes((folder / _shard_of(folder)).read_bytes())
    (folder / "link.distcp").symlink_to(outside)
    _every_path(folder, "link.distcp")


def _outside(folder: Path, absolute: bool) -> None:
    outside = folder.parent / f"{folder.name}-outside.distcp"
    outside.write_bytes((folder / _shard_of(folder)).read_bytes())
    _every_path(folder, str(outside) if absolute else f"../{outside.name}")


def _types(folder: Path, change: Callable[[Any], None]) -> None:
    metadata = read_metadata(folder)
    change(metadata)
    write_metadata(folder, metadata)


def _storage_ints(metadata: Any) -> None:
    for index in metadata.storage_data:
        metadata.storage_data[index] = 7


def _offset_string(metadata: Any) -> None:
    info = next(iter(metadata.storage_data.values()))
    object.__setattr__(info, "offset", "12")


def _size_int(metadata: Any) -> None:
    metadata.state_dict_metadata[first_tensor(metadata)].size = 12


def _plant_metadata(name: str) -> Callable[[Path, Path], None]:
    def plant(folder: Path, marker: Path) -> None:
        (folder / ".metadata").write_bytes(hostile_pickles(marker)[name])

    return plant


def _prefix_metadata(name: str, attribute: str, module: str) -> Callable[[Path, Path], None]:
    def plant(folder: Path, marker: Path) -> None:
        data = (folder / ".metadata").read_bytes()
        (folder / ".metadata").write_bytes(
            prefixed(set_class_attribute(module, name, attribute), data)
        )

    return plant


def _dataloader(name: str) -> Callable[[Path, Path], None]:
    def plant(folder: Path, marker: Path) -> None:
        replace_stored(folder, "dataloader.dp_rank_0", saved(hostile_pickles(marker)[name]))

    return plant


def _zip_entries(folder: Path, count: int) -> None:
    fqn = first_tensor(read_metadata(folder))
    replace_stored(folder, fqn, zip_copies(tensor_archive(folder, fqn), count))


def _bomb(folder: Path, marker: Path) -> None:
    data = pickle.dumps(b"\0" * (8 << 20), protocol=2)  # 8 MiB, a few hundred bytes compressed
    replace_stored(folder, "train_state.step", stored_archive(data, zipfile.ZIP_BZIP2))


CASES: dict[str, tuple[str, Callable[[Path, Path], None]]] = {
    # name -> (what the refusal says, plant(folder, marker))
    "dataloader protocol-0 os.system": ("asks for posix.system", _dataloader("posix.system p0")),
    "dataloader INST eval": ("asks for builtins.eval", _dataloader("builtins.eval INST")),
    ".metadata BUILD Metadata.__getstate__": (
        "sets the state of a type",
        _prefix_metadata("Metadata", "__getstate__", "torch.distributed.checkpoint.metadata"),
    ),
    ".metadata BUILD PosixPath._str": (
        "sets the state of a type",
        _prefix_metadata("PosixPath", "_str", "pathlib"),
    ),
    ".metadata deep tuple": ("nests tuples deeper than", _plant_metadata("deep tuple")),
    ".metadata deep list": ("nests containers deeper than", _plant_metadata("deep list")),
    ".metadata FRAME 2**60": (".metadata", _plant_metadata("FRAME 2**60")),
    "bzip2 byte item": ("compressed archive", _bomb),
    "1M-token vocabulary, 8-byte shard": ("needs", lambda f, m: claim_vocab(f)),
    "absolute relative_path": ("outside the checkpoint folder", lambda f, m: _outside(f, True)),
    "../ relative_path": ("outside the checkpoint folder", lambda f, m: _outside(f, False)),
    "symlink out": ("outside the checkpoint folder", lambda f, m: _symlink_out(f)),
    "FIFO item": ("fifo is not a regular file", lambda f, m: _fifo(f)),
    "storage entries are ints": (
        "not a file name, offset and length",
        lambda f, m: _types(f, _storage_ints),
    ),
    "offset is a string": (
        "not a file name, offset and length",
        lambda f, m: _types(f, _offset_string),
    ),
    "size is an int": ("is not a tensor or byte entry", lambda f, m: _types(f, _size_int)),
    "train_state.step is a string": (
        "train_state.step is '3'",
        lambda f, m: replace_stored(f, "train_state.step", saved("3")),
    ),
    # issue 46
    "2,000 zip entries on one record": (
        "more than 16 zip records",
        lambda f, m: _zip_entries(f, 2000),
    ),
    ".metadata hash flood": (
        "keys of one hash",
        lambda f, m: (f / ".metadata").write_bytes(hash_flood(40_000)),
    ),
    "dataloader hash flood": (
        "keys of one hash",
        lambda f, m: replace_stored(f, "dataloader.dp_rank_0", saved(hash_flood(40_000))),
    ),
}
"""Each case of issue 39's "what was seen" 1-7 that lives in a checkpoint folder, and issue
46's zip entries and hash floods."""


# ---- resources: memory and time (issue 46) ---------------------------------------------------
ALIKE = (1 << 61) - 1
"""CPython hashes an int modulo this prime: its multiples all hash to 0."""


@functools.cache
def hash_flood(keys: int) -> bytes:
    """A pickle of a dict of `keys` int keys that all hash alike (quadratic to build)."""
    items = b"".join(
        pickle.LONG1 + bytes([len(e)]) + e + pickle.NONE
        for e in (pickle.encode_long(k * ALIKE) for k in range(1, keys + 1))
    )
    return pickle.PROTO + b"\x02" + pickle.EMPTY_DICT + pickle.MARK + items + pickle.SETITEMS + b"."


@functools.cache
def opcode_flood(sets: int) -> bytes:
    """A pickle of a list of `sets` empty sets (about 220 bytes each)."""
    return (
        pickle.PROTO + b"\x04" + pickle.EMPTY_LIST + pickle.MARK + pickle.EMPTY_SET * sets + b"e."
    )


@functools.cache
def deflate_bomb(size: int) -> bytes:
    """A byte item's archive whose deflated data.pkl (a pickle of `size` zero bytes) is a few
    hundred KB."""
    data = pickle.PROTO + b"\x04" + pickle.BINBYTES8 + struct.pack("<Q", size) + bytes(size) + b"."
    return stored_archive(data, zipfile.ZIP_DEFLATED)


def zip_copies(archive: bytes, count: int) -> bytes:
    """A torch.save archive of one tensor made into one of `count` tensors, `data/0` ...
    `data/{count - 1}`, whose zip directory entries all point at the one record `data/0`:
    torch.load reads every one in full."""
    with zipfile.ZipFile(io.BytesIO(archive)) as source:
        names = source.namelist()
        prefix = names[0].split("/")[0]
        tensor = torch.load(io.BytesIO(archive), weights_only=True)
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as copy:
            for name in names:
                data = source.read(name)
                if name.endswith("/data.pkl"):
                    data = _tensors_pickle(tensor, count)
                copy.writestr(name, data)
    return _more_entries(out.getvalue(), f"{prefix}/data/0", count)


def _tensors_pickle(tensor: torch.Tensor, count: int) -> bytes:
    """torch.save's data.pkl of a list of `count` tensors shaped as `tensor`, storage keys
    "0" ... over `tensor`'s dtype."""

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            if isinstance(obj, str) and obj.startswith("storage "):
                kind = getattr(torch, torch.storage._dtype_to_storage_type_map()[tensor.dtype])
                return ("storage", kind, obj.split()[1], "cpu", tensor.numel())
            return None

    class Rebuilt:
        def __init__(self, key: int) -> None:
            self.key = key

        def __reduce__(self) -> Any:
            import collections

            return torch._utils._rebuild_tensor_v2, (
                f"storage {self.key}",
                0,
                tuple(tensor.shape),
                tensor.stride(),
                False,
                collections.OrderedDict(),
            )

    buffer = io.BytesIO()
    Pickler(buffer, protocol=2).dump([Rebuilt(k) for k in range(count)])
    return buffer.getvalue()


def _more_entries(archive: bytes, name: str, count: int) -> bytes:
    """`archive` (a zip without a comment) with `count - 1` more central directory entries,
    copies of `name`'s renamed .../data/1 ..., all pointing at `name`'s record."""
    end = archive.rindex(b"PK\x05\x06")
    entries_count, size, start = struct.unpack("<HII", archive[end + 10 : end + 20])
    directory, entries, at = archive[start : start + size], [], 0
    for _ in range(entries_count):
        name_len, extra_len, comment_len = struct.unpack("<HHH", directory[at + 28 : at + 34])
        entries.append(directory[at : at + 46 + name_len + extra_len + comment_len])
        at += 46 + name_len + extra_len + comment_len
    (original,) = [e for e in entries if e[46 : 46 + len(name)] == name.encode()]
    stem = name.rsplit("/", 1)[0]
    for k in range(1, count):
        new = f"{stem}/{k}".encode()
        entries.append(
            original[:28]
            + struct.pack("<H", len(new))
            + original[30:46]
            + new
            + original[46 + len(name) :]
        )
    directory = b"".join(entries)
    tail = struct.pack("<HHII", len(entries), len(entries), len(directory), start)
    return archive[:start] + directory + archive[end : end + 8] + tail + archive[end + 20 :]
