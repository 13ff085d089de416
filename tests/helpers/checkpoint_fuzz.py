"""A seeded mutation fuzzer over a real DCP checkpoint's pickles and metadata, run in one
child interpreter by `tests/unit/test_checkpoint_fuzz.py`:

    python -m tests.helpers.checkpoint_fuzz RESULTS.json --cases N --seed S [--break WHAT]

It writes one small checkpoint (tensors of three dtypes and TorchTitan's non-tensor items:
train state, LR scheduler, a real dataloader state), then for each case copies it, mutates
it (`MUTATIONS`: byte flips, truncations, spliced pickle opcodes and hostile pickles in
`.metadata`, a byte item's pickle, the dataloader state's pickle or the raw archives;
wrong types, sizes and file names in the metadata), and reads it as the product does:
`check_readable` (what `check` and the trainer run before a load), then, if it passes, the
load itself (`read_tensors`, through DCP's guarded reads, and the dataloader state through
`CheckpointedDataloader`). A case passes when it loads, or ends in one `ConfigError` line
that does not hide a resource error; and runs no payload (a marker file), opens no file
outside its folder (an audit hook sees every `open`), changes no class, and ends within
`CASE_SECONDS` (an alarm). The process runs under `MEMORY_LIMIT` of address space
(`RLIMIT_AS`), so an allocation a checkpoint asks for fails instead of taking the machine.
RESULTS.json: each failing case (seed, mutation, what went wrong), the count of cases per
outcome, and peak RSS; the file is rewritten as cases run (`started`: the case in flight),
so a crash of the interpreter names its case.

`--break allowlist` swaps the restricted unpickler for `pickle.loads`, `--break
confinement` the file checks for a bare size lookup: the fuzzer must then find the hole
(it stops at the first failure). `--case-seconds`: the alarm (default CASE_SECONDS).
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import pathlib
import pickle
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

MEMORY_LIMIT = 3 << 30
"""Address space of the fuzzing process (torch itself maps about 0.7 GiB)."""
CASE_SECONDS = 30.0
"""Time cap of one case, wall clock (a case takes milliseconds; a FIFO would block forever,
and the machine may be busy)."""
HIDDEN = ("MemoryError", "RecursionError", "CaseTimeout")
"""Failures that a one-line refusal must not hide."""


class CaseTimeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout("ran past its alarm")


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
        "norm.weight": torch.randn(8, dtype=torch.bfloat16),
        "output.bias": torch.arange(5),
        "train_state": {"step": 3, "ntokens_seen": 96},
        "lr_scheduler": {"last_epoch": 3, "base_lrs": [3e-3], "lr_lambdas": [{}]},
        "dataloader": loader.state_dict(),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    return state


def empty_like(state: dict) -> dict:
    """What a load fills: the tensors zeroed, the other items as a fresh run has them."""
    import torch

    return {
        "tok_embeddings.weight": torch.zeros(16, 8),
        "norm.weight": torch.zeros(8, dtype=torch.bfloat16),
        "output.bias": torch.zeros(5, dtype=torch.int64),
        "train_state": {"step": 0, "ntokens_seen": 0},
        "lr_scheduler": {"last_epoch": 0, "base_lrs": [0.0], "lr_lambdas": [{}]},
        "dataloader": {"dp_rank_0": b"", "world_size": 0},
    }


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
    from tests.helpers.hostile import replace_byte_item

    index = rng.choice(_byte_items(folder))
    archive = _archive(folder, index)
    if rng.random() < 0.15:
        data, kind = hostile(rng, marker)
    else:
        data, kind = mutate_bytes(rng, _data_pkl(archive))
    replace_byte_item(folder, index.fqn, _rezip(archive, data))
    return f"{index.fqn} pickle {kind}"


def mutate_dataloader_pickle(rng: random.Random, folder: Path, marker: Path) -> str:
    from tests.helpers.hostile import replace_byte_item, saved

    inner = pickle.loads(_data_pkl(_archive(folder, _index(folder, "dataloader.dp_rank_0"))))
    if rng.random() < 0.3:
        data, kind = hostile(rng, marker)
    else:
        data, kind = mutate_bytes(rng, inner)
    replace_byte_item(folder, "dataloader.dp_rank_0", saved(data))
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


MUTATIONS: list[tuple[float, Callable[[random.Random, Path, Path], str]]] = [
    (0.3, mutate_metadata_bytes),
    (0.2, mutate_item_pickle),
    (0.15, mutate_dataloader_pickle),
    (0.1, mutate_archive_bytes),
    (0.25, mutate_metadata_structure),
]


# ---- one case -------------------------------------------------------------------------------
class Watch:
    """What a case may not do: open a file outside its folder (next to it, or a device),
    change a class."""

    def __init__(self, work: Path) -> None:
        from torch.distributed.checkpoint.metadata import Metadata

        self.root = os.path.realpath(work)  # the cases' parent, with a file outside each
        self.folder: str | None = None
        self.outside: list[str] = []
        self.classes = {cls: dict(vars(cls)) for cls in (Metadata, pathlib.PosixPath, Path)}
        sys.addaudithook(self.hook)

    def hook(self, event: str, args: tuple) -> None:
        if event != "open" or self.folder is None or not isinstance(args[0], (str, Path)):
            return
        path = os.path.realpath(args[0])
        within = os.path.commonpath([self.folder, path]) == self.folder
        nearby = os.path.commonpath([self.root, path]) == self.root  # not Python's own files
        if (nearby and not within) or path.startswith(("/dev/", "/proc/")):
            self.outside.append(path)

    def changed(self) -> list[str]:
        return [cls.__qualname__ for cls, was in self.classes.items() if dict(vars(cls)) != was]


def read_case(folder: Path, state: dict) -> str:
    """Read the checkpoint as `check`/the trainer and then a load do: "ok" or raises."""
    from torch.distributed.checkpoint import FileSystemReader

    from boost_titan.data.loader import CheckpointedDataloader
    from boost_titan.runtime.checkpoint_files import check_readable, read_tensors

    check_readable(str(folder), where=f"case {folder}", step=3)
    loaded = empty_like(state)
    read_tensors(loaded, FileSystemReader(str(folder)), "cannot read its tensors ({})")
    loader = CheckpointedDataloader(list(range(16)), dp_rank=0, dp_world_size=1, batch_size=2)
    loader.load_state_dict(loaded["dataloader"])
    return "ok"


def run_case(
    folder: Path, state: dict, marker: Path, watch: Watch, seconds: float = CASE_SECONDS
) -> tuple[str, str]:
    """(outcome, detail): outcome "ok", "refused" or "FAIL"."""
    from boost_titan.config.errors import ConfigError

    watch.folder, watch.outside = os.path.realpath(folder), []
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        outcome, detail = read_case(folder, state), ""
    except ConfigError as e:
        detail = str(e)
        bad = "\n" in detail or any(word in detail for word in HIDDEN)
        outcome = "FAIL" if bad else "refused"
    except BaseException as e:  # every other ending is the failure
        outcome, detail = "FAIL", f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        watch.folder = None
    if marker.exists():
        marker.unlink()
        outcome, detail = "FAIL", f"a payload ran ({detail})"
    if watch.outside:
        outcome, detail = "FAIL", f"opened {watch.outside[0]} outside the folder ({detail})"
    if watch.changed():
        outcome, detail = "FAIL", f"changed {watch.changed()} ({detail})"
    return outcome, detail


def break_on_purpose(what: str) -> None:
    """Switch one defence off, to prove the fuzzer finds the hole."""
    from boost_titan.parallelize import dcp_layout, safe_load

    if what == "allowlist":
        safe_load.unpickle = pickle.loads
    elif what == "confinement":
        dcp_layout.check_file = lambda folder, name: os.path.getsize(os.path.join(folder, name))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("results")
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--break", dest="broken", choices=["allowlist", "confinement"])
    parser.add_argument("--case-seconds", type=float, default=CASE_SECONDS)
    ns = parser.parse_args(argv)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    signal.signal(signal.SIGALRM, _alarm)
    work = Path(tempfile.mkdtemp(prefix="checkpoint-fuzz-", dir=Path(ns.results).parent))
    results: dict[str, Any] = {"failures": [], "outcomes": {}, "kinds": {}}
    try:
        clean = work / "clean"
        state = write_checkpoint(clean)
        shutil.copyfile(clean / "__0_0.distcp", work / "outside.distcp")
        marker = work / "MARKER"
        if ns.broken:
            break_on_purpose(ns.broken)
        watch = Watch(work)
        weights = [w for w, _ in MUTATIONS]
        start = time.monotonic()
        for case in range(ns.cases):
            rng = random.Random(f"{ns.seed}-{case}")
            folder = work / "case"
            shutil.rmtree(folder, ignore_errors=True)
            shutil.copytree(clean, folder)
            mutation = rng.choices([m for _, m in MUTATIONS], weights)[0]
            kind = mutation(rng, folder, marker)
            results["started"] = {"case": case, "kind": kind}
            _write(ns.results, results)
            outcome, detail = run_case(folder, state, marker, watch, ns.case_seconds)
            results["outcomes"][outcome] = results["outcomes"].get(outcome, 0) + 1
            family = kind.split(" ")[0]
            results["kinds"][family] = results["kinds"].get(family, 0) + 1
            if outcome == "FAIL":
                results["failures"].append({"case": case, "kind": kind, "detail": detail})
                if ns.broken:  # the hole is found
                    break
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
