"""A seeded mutation fuzzer over a real DCP checkpoint's pickles, metadata, shapes and
archives, run in one child interpreter by `tests/unit/test_checkpoint_fuzz.py`:

    python -m tests.helpers.checkpoint_fuzz RESULTS.json --cases N --seed S [--break G,...]

It writes one small checkpoint (tensors of three dtypes and a 1 MiB one, TorchTitan's
non-tensor items: train state, LR scheduler, a real dataloader state) as a run's `step-3`,
then for each case copies it, mutates it (`MUTATIONS`: byte flips, truncations, spliced
pickle opcodes and hostile pickles in `.metadata`, a byte item's pickle, the dataloader
state's pickle or the raw archives; wrong types, sizes and file names in the metadata;
shapes and sizes changed together, so that DCP's own size check agrees with them; zip
directories whose entries share one record; a tensor split into 2,048 chunks; hash and
opcode floods, compression bombs; the step folder a symlink out) and reads it as the product
resumes from it: `check_loadable` (what `check` and the trainer run before a load), then,
if it passes, the load itself into tensors shaped as its metadata says (as `export`, `eval`
and `generate` build their model): `read_tensors`, through DCP's guarded reads, and the
dataloader state through `CheckpointedDataloader`. A case passes when it loads, or ends in
one `ConfigError` line that does not hide a resource error; and runs no payload (a marker
file), opens no file outside its folder (an audit hook sees every `open`), changes no class,
loads nothing nested deeper than 64 or cyclic and the folder's own step, grows the peak RSS
by at most `CASE_MEMORY_MIB` (`/proc/self/clear_refs` resets it per case), and ends within
its alarm, comparing storage indices at most `COMPARISONS` times. The process runs under
`MEMORY_LIMIT` of address space (`RLIMIT_AS`); run it with `MALLOC_MMAP_THRESHOLD_=131072`
(as the test does) so that a case's large allocations go back to the system when freed.
RESULTS.json: each failing case (seed, mutation, what went wrong), the count of cases per
outcome, and peak RSS; the file is rewritten as cases run (`started`: the case in flight),
so a crash of the interpreter names its case.

`--break G1,G2,...` (names of `checkpoint_guards.GUARDS`): for each guard in turn, switch it
off, fuzz until the first failure (at most `--cases`), switch it back on; `broken` in the
results maps each guard to its first failure (None: not found). `--case-seconds`: the alarm.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import io
import json
import os
import pathlib
import pickle
import random
import resource
import shutil
import signal
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers.fuzzing import OpenWatch, raise_timeout, read_outcome

MEMORY_LIMIT = 3 << 30
"""Address space of the fuzzing process (torch itself maps about 0.7 GiB)."""
CASE_MEMORY_MIB = 400
"""How much one case may raise the peak RSS: the checkpoint is 2 MiB, a pickle's opcode cap
allows about 260 MiB."""
BIG = "big.weight"
"""A 1 MiB tensor (256 x 1024): the record zip entries share, the tensor split in chunks."""
STEP = 3
"""The step the checkpoint is saved at (its folder: `step-3`)."""
MAX_OPCODES = 1 << 20
"""The unpickler's opcode cap in this process (the product's is 16M): the fuzzer's pickles
cost a few thousand, and a flood is then refused in a tenth of a second, not two."""
CASE_SECONDS = 30.0
"""Time cap of one case, wall clock (a case takes milliseconds; a FIFO would block forever,
and the machine may be busy)."""
HIDDEN = ("MemoryError", "RecursionError", "CaseTimeout", "allocate")
"""Failures that a one-line refusal must not hide."""


# ---- the checkpoint -------------------------------------------------------------------------
def write_checkpoint(folder: Path) -> dict:
    """A small DCP checkpoint shaped as TorchTitan's; returns the state to load it into."""
    import torch
    import torch.distributed.checkpoint as dcp

    from boost_titan.data.loader import CheckpointedDataloader

    loader = CheckpointedDataloader(list(range(16)), dp_rank=0, dp_world_size=1, batch_size=2)
    next(iter(loader))
    state = {
        "tok_embeddings.weight": torch.randn(16, 8),
        BIG: torch.randn(256, 1024),
        "norm.weight": torch.randn(8, dtype=torch.bfloat16),
        "output.bias": torch.arange(5),
        "train_state": {"step": STEP, "ntokens_seen": 96},
        "lr_scheduler": {"last_epoch": 3, "base_lrs": [3e-3], "lr_lambdas": [{}]},
        "dataloader": loader.state_dict(),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    return state


def load_target(metadata: Any, state: dict) -> dict:
    """What a load fills: each tensor of `state` shaped and typed as `metadata` says (as
    `export`, `eval` and `generate` build their model from it), the other items as a fresh
    run has them."""
    import torch
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    target: dict[str, Any] = {
        "train_state": {"step": 0, "ntokens_seen": 0},
        "lr_scheduler": {"last_epoch": 0, "base_lrs": [0.0], "lr_lambdas": [{}]},
        "dataloader": {"dp_rank_0": b"", "world_size": 0},
    }
    for fqn, value in state.items():
        entry = metadata.state_dict_metadata.get(fqn)
        if isinstance(value, torch.Tensor):
            if isinstance(entry, TensorStorageMetadata):
                target[fqn] = torch.zeros(entry.size, dtype=entry.properties.dtype)
            else:
                target[fqn] = torch.zeros_like(value)
    return target


# ---- mutations --------------------------------------------------------------------------------
SNIPPETS = [
    b"cposix\nsystem\n",
    b"cbuiltins\neval\n",
    b"\x8c\x05posix\x8c\x06system\x93",
    b"\x8c\x08builtins\x8c\x04exec\x93",
    b"\x8c\x07pathlib\x8c\tPosixPath\x93}\x8c\x04_str\x8c\x01xsb0",
    b"\x8c%torch.distributed.checkpoint.metadata\x8c\x08Metadata\x93}\x8c\x01aK\x01sb0",
    pickle.REDUCE,
    pickle.BUILD,
    pickle.NEWOBJ,
    pickle.INST + b"builtins\neval\n",
    pickle.OBJ,
    pickle.EXT1 + b"\x01",
    pickle.BINPERSID,
    pickle.FRAME + b"\xff" * 8,
    pickle.BINBYTES8 + b"\x00\x00\x00\x00\x00\x00\x00\x10",
    pickle.BYTEARRAY8 + b"\x00\x00\x00\x00\x00\x00\x00\x10",
    pickle.LONG4 + b"\xff\xff\xff\x7f",
    pickle.EMPTY_TUPLE + pickle.TUPLE1 * 5000,
    pickle.EMPTY_LIST * 3000 + pickle.APPEND * 2999,
    b"]\x94h\x00a",  # a list that contains itself
    pickle.MARK,
    pickle.STOP,
    pickle.POP,
    pickle.DUP,
    pickle.SETITEMS,
    b"K\x07",
    b"J\xff\xff\xff\xff",
    b"\x8c\x00",
]
"""Opcodes (and short runs of them) spliced into pickles: calls, class mutations, deep
nesting, cycles, huge declared sizes, and plain structure."""


def mutate_bytes(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """`data` with one random mutation: bit flips, a truncation, a splice, a cut or a copy."""
    kind = rng.choice(["flip", "truncate", "splice", "splice", "cut", "repeat"])
    if not data:
        return rng.choice(SNIPPETS), "splice"
    at = rng.randrange(len(data))
    if kind == "flip":
        out = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return bytes(out), kind
    if kind == "truncate":
        return data[:at], kind
    if kind == "splice":
        snippet = rng.choice(SNIPPETS) if rng.random() < 0.8 else rng.randbytes(rng.randint(1, 9))
        return data[:at] + snippet + data[at:], kind
    end = min(len(data), at + rng.randint(1, 64))
    if kind == "cut":
        return data[:at] + data[end:], kind
    return data[:end] + data[at:end] * rng.randint(1, 50) + data[end:], kind


def hostile(rng: random.Random, marker: Path) -> tuple[bytes, str]:
    from tests.helpers.hostile import hostile_pickles

    name, data = rng.choice(sorted(hostile_pickles(marker).items()))
    return data, f"hostile {name}"


def _metadata(folder: Path) -> Any:
    return pickle.loads((folder / ".metadata").read_bytes())  # the fuzzer's own: trusted


def _byte_items(folder: Path) -> list:
    return [i for i in _metadata(folder).storage_data if i.offset is None]


def _archive(folder: Path, index: Any) -> bytes:
    info = _metadata(folder).storage_data[index]
    with (folder / info.relative_path).open("rb") as f:
        f.seek(info.offset)
        return f.read(info.length)


def _data_pkl(archive: bytes) -> bytes:
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))


def _rezip(archive: bytes, data_pkl: bytes) -> bytes:
    """`archive` (torch.save's) with another `data.pkl`, stored, its CRC right."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as z, zipfile.ZipFile(out, "w") as new:
        for name in z.namelist():
            new.writestr(name, data_pkl if name.endswith("/data.pkl") else z.read(name))
    return out.getvalue()


def mutate_metadata_bytes(rng: random.Random, folder: Path, marker: Path) -> str:
    path = folder / ".metadata"
    if rng.random() < 0.15:
        data, kind = hostile(rng, marker)
    else:
        data, kind = mutate_bytes(rng, path.read_bytes())
    path.write_bytes(data)
    return f".metadata {kind}"


def mutate_item_pickle(rng: random.Random, folder: Path, marker: Path) -> str:
    from tests.helpers.hostile import replace_stored, saved

    if rng.random() < 0.1:
        value = rng.choice([STEP + 4, -1, str(STEP), float(STEP), [STEP]])
        replace_stored(folder, "train_state.step", saved(value))
        return f"train_state.step saved as {value!r}"
    index = rng.choice(_byte_items(folder))
    archive = _archive(folder, index)
    if rng.random() < 0.15:
        data, kind = hostile(rng, marker)
    else:
        data, kind = mutate_bytes(rng, _data_pkl(archive))
    replace_stored(folder, index.fqn, _rezip(archive, data))
    return f"{index.fqn} pickle {kind}"


def mutate_dataloader_pickle(rng: random.Random, folder: Path, marker: Path) -> str:
    from tests.helpers.hostile import replace_stored, saved

    inner = pickle.loads(_data_pkl(_archive(folder, _index(folder, "dataloader.dp_rank_0"))))
    if rng.random() < 0.3:
        data, kind = hostile(rng, marker)
    else:
        data, kind = mutate_bytes(rng, inner)
    replace_stored(folder, "dataloader.dp_rank_0", saved(data))
    return f"dataloader state {kind}"


def _index(folder: Path, fqn: str) -> Any:
    return next(i for i in _metadata(folder).storage_data if i.fqn == fqn)


def mutate_archive_bytes(rng: random.Random, folder: Path, marker: Path) -> str:
    """Flip or zero bytes of an item's archive (a byte item's or a tensor's) in place."""
    metadata = _metadata(folder)
    index = rng.choice(list(metadata.storage_data))
    info = metadata.storage_data[index]
    shard = folder / info.relative_path
    data = bytearray(shard.read_bytes())
    for _ in range(rng.randint(1, 6)):
        at = info.offset + rng.randrange(info.length)
        data[at] = rng.randrange(256) if rng.random() < 0.5 else data[at] ^ 0xFF
    shard.write_bytes(bytes(data))
    return f"{index.fqn} archive bytes"


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


def mutate_metadata_structure(rng: random.Random, folder: Path, marker: Path) -> str:
    """A wrong type, size or file name in `.metadata`, written back as a clean pickle."""
    import torch

    metadata = _metadata(folder)
    storage = metadata.storage_data
    index = rng.choice(list(storage))
    info = storage[index]
    tensors = [k for k, v in metadata.state_dict_metadata.items() if hasattr(v, "chunks")]
    entry = metadata.state_dict_metadata[rng.choice(tensors)]
    outside = folder.parent / "outside.distcp"
    odd = [-1, 1 << 62, "12", 1.5, None, True, [3], b"x"]
    kind = rng.choice(
        ["path", "path", "path", "offset", "length", "size", "chunk", "dtype", "types", "drop"]
    )
    if kind == "path":
        if not (folder / "link.distcp").exists():
            (folder / "link.distcp").symlink_to(outside)
        if not (folder / "fifo").exists():
            os.mkfifo(folder / "fifo")
        choices = [str(outside), "../outside.distcp", "link.distcp", "fifo", "", ".", "nope"]
        choices += ["sub/../__0_0.distcp", "/dev/zero", "/proc/self/mem", str(folder / ".metadata")]
        value = rng.choice(choices)
        _set(info, "relative_path", value)
        if value == "fifo":
            _set(info, "length", 0)
            _set(info, "offset", 0)
        kind = f"relative_path {value!r}"
    elif kind in ("offset", "length"):
        value = rng.choice(odd)
        _set(info, kind, value)
        kind = f"{kind} {value!r}"
    elif kind == "size":
        value = rng.choice([torch.Size([1_000_000, 8]), torch.Size([-1]), 12, torch.Size([])])
        entry.size = value
        kind = f"size {value!r}"
    elif kind == "chunk":
        chunk = entry.chunks[0]
        value = rng.choice([torch.Size([1_000_000, 8]), torch.Size([1]), "x", torch.Size([-4])])
        entry.chunks[0] = dataclasses.replace(chunk, sizes=value)
        kind = f"chunk sizes {value!r}"
    elif kind == "dtype":
        entry.properties.dtype = rng.choice([torch.float64, torch.uint8, "float32", None])
        kind = f"dtype {entry.properties.dtype!r}"
    elif kind == "types":
        target = rng.choice(["storage value", "storage dict", "entries dict", "transform"])
        if target == "storage value":
            storage[index] = rng.choice(odd)
        elif target == "storage dict":
            metadata.storage_data = list(storage.values())
        elif target == "entries dict":
            metadata.state_dict_metadata = rng.choice([7, list(metadata.state_dict_metadata)])
        else:
            _set(info, "transform_descriptors", ["zstd"])
        kind = target
    else:
        del storage[index]
        kind = f"no storage for {index.fqn}"
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    return f".metadata {kind}"


def mutate_shape(rng: random.Random, folder: Path, marker: Path) -> str:
    """A tensor's size and its chunk's changed together (DCP's own size check then agrees):
    rows scaled up, dimensions reversed, or an element type of another width."""
    import torch

    metadata = _metadata(folder)
    fqn = rng.choice(
        sorted(k for k, v in metadata.state_dict_metadata.items() if hasattr(v, "chunks"))
    )
    entry = metadata.state_dict_metadata[fqn]
    kind = rng.choice(["scale", "scale", "reverse", "dtype"])
    if kind == "scale":
        factor = rng.choice([2, 1 << 10, 1 << 32])
        size = torch.Size([entry.size[0] * factor, *entry.size[1:]])
    elif kind == "reverse":
        size = torch.Size(reversed(entry.size))
    else:
        size = entry.size
        entry.properties.dtype = rng.choice([torch.float64, torch.int8, torch.complex128])
    entry.size = size
    entry.chunks = [dataclasses.replace(entry.chunks[0], sizes=size)]
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    return f"{fqn} shape {tuple(size)} {entry.properties.dtype}"


def mutate_zip_records(rng: random.Random, folder: Path, marker: Path) -> str:
    """The 1 MiB tensor's archive with 2 to 600 tensor entries that share its one record."""
    from tests.helpers.hostile import replace_stored, tensor_archive, zip_copies

    count = rng.choice([2, 40, 600])
    replace_stored(folder, BIG, zip_copies(tensor_archive(folder, BIG), count))
    return f"{BIG} archive: {count} zip entries on one record"


SPLIT = (32, 128)
"""The chunk shape `mutate_split` cuts the 1 MiB tensor into: 64 chunks."""
EMPTY_CHUNKS = 192
"""Empty chunks (no rows) `mutate_split` adds, as a sharded save of uneven shards may have:
finding each of the 256 entries' chunk by a scan takes 33,000 comparisons."""
COMPARISONS = 10_000
"""The most times one case may compare two storage indices (`MetadataIndex.__eq__`, counted):
reading a checkpoint costs about one per entry (a dict lookup), a scan per entry its square."""


def mutate_split(rng: random.Random, folder: Path, marker: Path) -> str:
    """The 1 MiB tensor stored as 64 chunks and 192 empty ones, each entry an archive in a
    new file: a layout DCP reads (the product never writes it), slow only if each entry's
    chunk is found by a scan."""
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    metadata = _metadata(folder)
    entry = metadata.state_dict_metadata[BIG]
    for index in [i for i in metadata.storage_data if i.fqn == BIG]:
        del metadata.storage_data[index]
    entry.chunks = []
    chunks, empty = _split_archives(folder.parent.parent / "clean")
    with (folder / "chunks.distcp").open("wb") as f:
        for offsets, sizes, archive in chunks:
            entry.chunks.append(ChunkStorageMetadata(offsets, sizes))
            info = _StorageInfo("chunks.distcp", f.tell(), len(archive))
            metadata.storage_data[MetadataIndex(BIG, offsets)] = info
            f.write(archive)
        at = f.tell()
        f.write(empty)
    rows = entry.size[0]
    for k in range(EMPTY_CHUNKS):
        offsets = torch.Size([k % rows, 1 + k // rows])  # no real chunk's (columns 0, 128...)
        entry.chunks.append(ChunkStorageMetadata(offsets, torch.Size([0, SPLIT[1]])))
        metadata.storage_data[MetadataIndex(BIG, offsets)] = _StorageInfo(
            "chunks.distcp", at, len(empty)
        )
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    return f"{BIG} in {len(entry.chunks)} chunks"


_SPLIT_CACHE: list = []


def _split_archives(clean: Path) -> tuple[list, bytes]:
    """(offsets, sizes, torch.save archive) of each SPLIT chunk of the clean checkpoint's BIG,
    and the archive of an empty chunk."""
    import torch

    def saved(tensor: torch.Tensor) -> bytes:
        buffer = io.BytesIO()
        torch.save(tensor, buffer)
        return buffer.getvalue()

    if not _SPLIT_CACHE:
        full = torch.load(io.BytesIO(_archive(clean, _index(clean, BIG))), weights_only=True)
        rows, cols = SPLIT
        chunks = [
            (torch.Size([r, c]), torch.Size(SPLIT), saved(full[r : r + rows, c : c + cols].clone()))
            for r in range(0, full.shape[0], rows)
            for c in range(0, full.shape[1], cols)
        ]
        _SPLIT_CACHE.append((chunks, saved(torch.empty(0, cols))))
    return _SPLIT_CACHE[0]


def mutate_resource(rng: random.Random, folder: Path, marker: Path) -> str:
    """A pickle that is cheap to read only under the caps: 40,000 int keys of one hash,
    4,000,000 empty sets, or (a byte item's) a deflated 250 MiB pickle."""
    from tests.helpers.hostile import (
        deflate_bomb,
        hash_flood,
        opcode_flood,
        replace_stored,
        saved,
    )

    kind = rng.choice(["hash flood", "opcode flood", "deflate bomb"])
    target = rng.choice([".metadata", "item", "dataloader state"])
    if kind == "deflate bomb":
        replace_stored(folder, "lr_scheduler.last_epoch", deflate_bomb(250 << 20))
        return f"lr_scheduler.last_epoch {kind}"
    data = hash_flood(40_000) if kind == "hash flood" else opcode_flood(4_000_000)
    if target == ".metadata":
        (folder / ".metadata").write_bytes(data)
    elif target == "item":
        index = rng.choice(_byte_items(folder))
        replace_stored(folder, index.fqn, _rezip(_archive(folder, index), data))
    else:
        replace_stored(folder, "dataloader.dp_rank_0", saved(data))
    return f"{target} {kind}"


def mutate_step_link(rng: random.Random, folder: Path, marker: Path) -> str:
    """The run's `step-3` a symlink to a copy of it in another folder."""
    elsewhere = folder.parent.parent / "elsewhere"
    shutil.rmtree(elsewhere, ignore_errors=True)
    elsewhere.mkdir()
    shutil.move(folder, elsewhere / folder.name)
    folder.symlink_to(elsewhere / folder.name)
    return "step folder a symlink out"


MUTATIONS: list[tuple[float, Callable[[random.Random, Path, Path], str]]] = [
    (0.22, mutate_metadata_bytes),
    (0.14, mutate_item_pickle),
    (0.11, mutate_dataloader_pickle),
    (0.08, mutate_archive_bytes),
    (0.2, mutate_metadata_structure),
    (0.1, mutate_shape),
    (0.05, mutate_zip_records),
    (0.01, mutate_split),
    (0.05, mutate_resource),
    (0.03, mutate_step_link),
]


# ---- one case -------------------------------------------------------------------------------
class Watch(OpenWatch):
    """What a case may not do: open a file outside its folder (next to it, or a device),
    change a class."""

    def __init__(self, work: Path) -> None:
        from torch.distributed.checkpoint.metadata import Metadata

        super().__init__(work)
        self.classes = {cls: dict(vars(cls)) for cls in (Metadata, pathlib.PosixPath, Path)}

    def changed(self) -> list[str]:
        """The classes a case changed, each put back as it was (later cases need them)."""
        changed = []
        for cls, was in self.classes.items():
            now = dict(vars(cls))
            if now != was:
                changed.append(cls.__qualname__)
                for name in now.keys() - was.keys():
                    delattr(cls, name)
                for name, value in was.items():
                    if now.get(name) is not value:
                        setattr(cls, name, value)
        return changed


def read_case(folder: Path, state: dict) -> dict:
    """Read the checkpoint as `check`/the trainer and then a load do: what it loaded, or
    raises."""
    from boost_titan.checkpoint.files import check_loadable, read_tensors
    from boost_titan.checkpoint.reads import GuardedReader
    from boost_titan.data.loader import CheckpointedDataloader

    metadata = check_loadable(str(folder), resuming=True)
    loaded = load_target(metadata, state)
    read_tensors(loaded, GuardedReader(str(folder), metadata), "cannot read its tensors ({})")
    loader = CheckpointedDataloader(list(range(16)), dp_rank=0, dp_world_size=1, batch_size=2)
    loader.load_state_dict(loaded["dataloader"])
    return loaded


def shape_of(value: Any, limit: int = 64) -> str | None:
    """What is wrong with a loaded value: nested deeper than `limit`, or cyclic (None: a
    tree no deeper). Walks it without recursion, independently of the product's check."""
    stack: list[tuple[Any, int, frozenset]] = [(value, 0, frozenset())]
    while stack:
        item, depth, above = stack.pop()
        if isinstance(item, dict):
            children = [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple, set, frozenset)):
            children = list(item)
        else:
            continue
        if id(item) in above:
            return "holds a cycle"
        if depth >= limit:
            return f"nests deeper than {limit}"
        below = above | {id(item)}
        stack.extend((child, depth + 1, below) for child in children)
    return None


class Comparisons:
    """Counts `MetadataIndex.__eq__` calls in this process (the work of finding entries)."""

    count = 0

    @classmethod
    def install(cls) -> None:
        from torch.distributed.checkpoint.metadata import MetadataIndex

        equal = MetadataIndex.__eq__

        def counted(self: Any, other: Any) -> Any:
            cls.count += 1
            return equal(self, other)

        MetadataIndex.__eq__ = counted


def _peak_rss_mib(reset: bool = False) -> float:
    """This process's peak RSS since the last reset (Linux's VmHWM), resetting it after."""
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
    if reset:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    return peak


def run_case(
    folder: Path, state: dict, marker: Path, watch: Watch, seconds: float = CASE_SECONDS
) -> tuple[str, str]:
    """(outcome, detail): outcome "ok", "refused" or "FAIL"."""
    _peak_rss_mib(reset=True)
    base = _peak_rss_mib()
    watch.folder = os.path.join(os.path.realpath(folder.parent), folder.name)
    watch.outside = []
    Comparisons.count = 0
    outcome, detail, loaded = read_outcome(lambda: read_case(folder, state), seconds, HIDDEN, watch)
    grown = _peak_rss_mib() - base
    if grown > 100:  # what an exception's traceback cycle holds is freed now, not at random
        gc.collect()
    if loaded is not None:
        step = loaded["train_state"]["step"]
        wrong = shape_of({k: v for k, v in loaded.items() if not hasattr(v, "shape")})
        if wrong:
            outcome, detail = "FAIL", f"a loaded value {wrong}"
        elif type(step) is not int or step != STEP:
            outcome, detail = "FAIL", f"train_state.step loaded as {step!r:.40} in step-{STEP}"
    if Comparisons.count > COMPARISONS:
        outcome, detail = "FAIL", f"compared storage indices {Comparisons.count:,} times ({detail})"
    if grown > CASE_MEMORY_MIB:
        outcome, detail = "FAIL", f"peak RSS grew {grown:,.0f} MiB ({detail[:200]})"
    if marker.exists():
        marker.unlink()
        outcome, detail = "FAIL", f"a payload ran ({detail})"
    if watch.outside:
        outcome, detail = "FAIL", f"opened {watch.outside[0]} outside the folder ({detail})"
    changed = watch.changed()
    if changed:
        outcome, detail = "FAIL", f"changed {changed} ({detail})"
    return outcome, detail


def fuzz(
    ns: argparse.Namespace, work: Path, state: dict, watch: Watch, results: dict, guard: str | None
) -> dict | None:
    """Run `ns.cases` cases (to the first failure when `guard` is switched off); returns
    that first failure."""
    clean, marker = work / "clean", work / "MARKER"
    weights = [w for w, _ in MUTATIONS]
    for case in range(ns.cases):
        rng = random.Random(f"{ns.seed}-{case}")
        folder = work / "run" / f"step-{STEP}"
        if folder.is_symlink():
            folder.unlink()
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(clean, folder)
        mutation = rng.choices([m for _, m in MUTATIONS], weights)[0]
        began = time.monotonic()
        kind = mutation(rng, folder, marker)
        results["started"] = {"case": case, "kind": kind, "guard": guard}
        _write(ns.results, results)
        outcome, detail = run_case(folder, state, marker, watch, ns.case_seconds)
        results["outcomes"][outcome] = results["outcomes"].get(outcome, 0) + 1
        family = kind.split(" ")[0]
        results["kinds"][family] = results["kinds"].get(family, 0) + 1
        took = results["mutation_seconds"]
        took[mutation.__name__] = round(
            took.get(mutation.__name__, 0) + time.monotonic() - began, 2
        )
        if outcome == "FAIL":
            failure = {"case": case, "kind": kind, "detail": detail}
            if guard:
                return failure
            results["failures"].append(failure)
    return None


def main(argv: list[str] | None = None) -> None:
    from tests.helpers.checkpoint_guards import GUARDS

    parser = argparse.ArgumentParser()
    parser.add_argument("results")
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--break", dest="broken", type=lambda text: text.split(","), default=[])
    parser.add_argument("--case-seconds", type=float, default=CASE_SECONDS)
    ns = parser.parse_args(argv)
    unknown = set(ns.broken) - set(GUARDS)
    if unknown:
        parser.error(f"no guard named {sorted(unknown)}; guards: {sorted(GUARDS)}")
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    from boost_titan.checkpoint import safe_load

    safe_load.MAX_OPCODES = MAX_OPCODES
    signal.signal(signal.SIGALRM, raise_timeout)
    work = Path(tempfile.mkdtemp(prefix="checkpoint-fuzz-", dir=Path(ns.results).parent))
    results: dict[str, Any] = {"failures": [], "outcomes": {}, "kinds": {}, "broken": {}}
    results["mutation_seconds"] = {}  # per mutation: its cases' time, to size the budget
    try:
        clean = work / "clean"
        state = write_checkpoint(clean)
        (work / "run").mkdir()
        shutil.copyfile(clean / "__0_0.distcp", work / "run" / "outside.distcp")
        watch = Watch(work)
        Comparisons.install()
        start = time.monotonic()
        for guard in ns.broken:
            undo = GUARDS[guard][0]()
            try:
                results["broken"][guard] = fuzz(ns, work, state, watch, results, guard)
            finally:
                undo()
                gc.collect()  # what the hole left behind, before the next guard
            _write(ns.results, results)
        if not ns.broken:
            fuzz(ns, work, state, watch, results, None)
        results["started"] = None
        results["seconds"] = round(time.monotonic() - start, 1)
        results["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        _write(ns.results, results)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _write(path: str, results: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(results, f)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
