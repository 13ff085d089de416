"""Issues 39's and 46's hostile checkpoints, rebuilt by hand (not with the test helpers) on a
checkpoint the product wrote, each run through `python -m boost_titan.check` under
`/usr/bin/time -v` (an 8 GiB address-space limit, killed after 300 s): exit status,
`error:` lines, wall time, peak RSS, whether the payload ran. Then `export` and `generate`
where they read the case (entries outside the folder, a 1M-token vocabulary, zip entries
sharing one record, a split embedding). It ends with a table of every run (outcome: `one
line` is exit 2 with one `error:` line within issue 39's caps, 60 s and 1.5 GiB); the
tables in docs/reliability.md come from it.

    ./run_train.sh --training.steps 2 --checkpoint.enable --checkpoint.interval 2 \\
        --job.dump_folder /tmp/fresh
    python scripts/hostile_checkpoints.py /tmp/fresh/checkpoint/step-2 /tmp/hostile [PREFIX...]

PREFIX: only the cases whose name starts with one of them (e.g. `0`: the clean checkpoint;
`8 9 A B`: issue 46's).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import os
import pickle
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex


def _meta(folder: str):
    with open(os.path.join(folder, ".metadata"), "rb") as f:
        return pickle.load(f)  # the fresh checkpoint this script was given: trusted


def _put_meta(folder: str, metadata) -> None:
    with open(os.path.join(folder, ".metadata"), "wb") as f:
        pickle.dump(metadata, f)


def _append_item(folder: str, fqn: str, archive: bytes) -> None:
    """Point the byte item `fqn` at `archive`, appended to its shard."""
    metadata = _meta(folder)
    index = next(i for i in metadata.storage_data if i.fqn == fqn)
    info = metadata.storage_data[index]
    shard = os.path.join(folder, info.relative_path)
    offset = os.path.getsize(shard)
    with open(shard, "ab") as f:
        f.write(archive)
    metadata.storage_data[index] = dataclasses.replace(info, offset=offset, length=len(archive))
    _put_meta(folder, metadata)


def _saved(value) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _text(s: str) -> bytes:
    return b"\x8c" + bytes([len(s)]) + s.encode()


def _prefix_build_on_class(folder: str, module: str, name: str, attribute: str) -> None:
    """BUILD on the class itself, then POP, before `.metadata`'s own opcodes."""
    path = os.path.join(folder, ".metadata")
    data = open(path, "rb").read()
    prefix = _text(module) + _text(name) + b"\x93}" + _text(attribute) + b"K\x01sb0"
    open(path, "wb").write(data[:2] + prefix + data[2:])


def p0_dataloader(folder: str, marker: str) -> None:
    payload = f"cposix\nsystem\n(Vtouch {marker}\ntR.".encode()
    _append_item(folder, "dataloader.dp_rank_0", _saved(payload))


def bzip2_bomb(folder: str, marker: str) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_BZIP2) as archive:
        with archive.open("archive/data.pkl", "w", force_zip64=True) as out:
            chunk = b"\0" * (16 << 20)
            for _ in range(64):  # 1 GiB
                out.write(chunk)
    print(f"    a byte item of {len(buffer.getvalue()):,} bytes declaring 1 GiB")
    _append_item(folder, "train_state.step", buffer.getvalue())


def vocab_1m(folder: str, marker: str) -> None:
    metadata = _meta(folder)
    fqn = "tok_embeddings.weight"
    entry = metadata.state_dict_metadata[fqn]
    entry.size = torch.Size([1_000_000, entry.size[1]])
    origin = torch.Size([0, 0])
    entry.chunks = [dataclasses.replace(entry.chunks[0], offsets=origin, sizes=entry.size)]
    for index in [i for i in metadata.storage_data if i.fqn == fqn]:
        del metadata.storage_data[index]
    with open(os.path.join(folder, "tiny.distcp"), "wb") as f:
        f.write(b"\0" * 8)
    metadata.storage_data[MetadataIndex(fqn, origin)] = _StorageInfo("tiny.distcp", 0, 8)
    _put_meta(folder, metadata)


def outside(absolute: bool) -> Callable[[str, str], None]:
    def plant(folder: str, marker: str) -> None:
        work = os.path.dirname(marker)
        other = os.path.join(work, "other-folder")
        if not os.path.exists(other):
            shutil.copytree(os.path.join(folder, ".."), other)  # another run's step folder
        metadata = _meta(folder)
        for info in metadata.storage_data.values():
            path = os.path.join(other, os.path.basename(folder), info.relative_path)
            relative = os.path.relpath(path, folder)
            object.__setattr__(info, "relative_path", path if absolute else relative)
        _put_meta(folder, metadata)

    return plant


def deep_tuple(folder: str, marker: str) -> None:
    data = b"\x80\x04}" + b")" + b"\x85" * 1_000_000 + b"Ns."
    open(os.path.join(folder, ".metadata"), "wb").write(data)


def fifo(folder: str, marker: str) -> None:
    os.mkfifo(os.path.join(folder, "fifo"))
    metadata = _meta(folder)
    index = next(i for i in metadata.storage_data if i.fqn == "train_state.step")
    for name, value in (("relative_path", "fifo"), ("offset", 0), ("length", 0)):
        object.__setattr__(metadata.storage_data[index], name, value)
    _put_meta(folder, metadata)


def _edit(change: Callable) -> Callable[[str, str], None]:
    def plant(folder: str, marker: str) -> None:
        metadata = _meta(folder)
        change(metadata)
        _put_meta(folder, metadata)

    return plant


def _storage_ints(m) -> None:
    m.storage_data = dict.fromkeys(m.storage_data, 5)


def _offset_string(m) -> None:
    object.__setattr__(next(iter(m.storage_data.values())), "offset", "100")


def _size_int(m) -> None:
    m.state_dict_metadata["tok_embeddings.weight"].size = 2048


# ---- issue 46: memory, time, folders ---------------------------------------------------
def _central_copies(archive: bytes, name: str, names: list[str]) -> bytes:
    """`archive` (a zip without a comment) with central-directory entries `names` added, each
    a copy of `name`'s: every one points at `name`'s single record."""
    end = archive.rindex(b"PK\x05\x06")
    count, size, start = struct.unpack("<HII", archive[end + 10 : end + 20])
    directory, entries, at = archive[start : start + size], [], 0
    for _ in range(count):
        name_len, extra_len, comment_len = struct.unpack("<HHH", directory[at + 28 : at + 34])
        length = 46 + name_len + extra_len + comment_len
        entries.append(directory[at : at + length])
        at += length
    (original,) = [e for e in entries if e[46 : 46 + len(name)] == name.encode()]
    name_len, extra_len = struct.unpack("<HH", original[28:32])
    for new in names:
        encoded = new.encode()
        head = original[:28] + struct.pack("<H", len(encoded)) + original[30:46]
        entries.append(head + encoded + original[46 + name_len :])
    directory = b"".join(entries)
    tail = struct.pack("<HHII", len(entries), len(entries), len(directory), start)
    return archive[:start] + directory + archive[end : end + 8] + tail + archive[end + 20 :]


class _Storage:
    """A storage reference as torch.save pickles it: ('storage', type, key, 'cpu', numel)."""

    def __init__(self, key: str, numel: int) -> None:
        self.key, self.numel = key, numel


class _TensorPickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", torch.FloatStorage, obj.key, "cpu", obj.numel)
        return None


class _Tensor:
    """Pickles as torch.save pickles a float tensor over `storage`."""

    def __init__(self, storage: _Storage, shape: tuple) -> None:
        self.storage, self.shape = storage, shape

    def __reduce__(self):
        stride = tuple(int(torch.Size(self.shape[i + 1 :]).numel()) for i in range(len(self.shape)))
        args = (self.storage, 0, self.shape, stride, False, collections.OrderedDict())
        return torch._utils._rebuild_tensor_v2, args


def zip_entries(count: int) -> Callable[[str, str], None]:
    """The embedding's first chunk becomes an archive whose `count` tensors (data/0 ...) are
    central-directory entries of one 2 MiB record: torch.load reads each in full."""

    def plant(folder: str, marker: str) -> None:
        metadata = _meta(folder)
        fqn = "tok_embeddings.weight"
        index = next(i for i in metadata.storage_data if i.fqn == fqn)
        info = metadata.storage_data[index]
        chunk = next(
            c for c in metadata.state_dict_metadata[fqn].chunks if c.offsets == index.offset
        )
        with open(os.path.join(folder, info.relative_path), "rb") as f:
            f.seek(info.offset)
            original = zipfile.ZipFile(io.BytesIO(f.read(info.length)))
        prefix = original.namelist()[0].split("/")[0]
        shape = tuple(chunk.sizes)
        numel = int(torch.Size(shape).numel())
        tensors = [_Tensor(_Storage(str(k), numel), shape) for k in range(count)]
        data_pkl = io.BytesIO()
        _TensorPickler(data_pkl, protocol=2).dump(tensors)
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            for name in original.namelist():
                data = data_pkl.getvalue() if name.endswith("/data.pkl") else original.read(name)
                archive.writestr(name, data)
        names = [f"{prefix}/data/{k}" for k in range(1, count)]
        archive = _central_copies(buffer.getvalue(), f"{prefix}/data/0", names)
        entries = len(original.namelist()) - 1 + count
        size = f"{len(archive):,}-byte archive"
        print(f"    a {size}: {entries:,} entries, one {numel * 4:,}-byte record")
        shard = os.path.join(folder, info.relative_path)
        offset = os.path.getsize(shard)
        with open(shard, "ab") as f:
            f.write(archive)
        metadata.storage_data[index] = dataclasses.replace(info, offset=offset, length=len(archive))
        _put_meta(folder, metadata)

    return plant


ALIKE = (1 << 61) - 1
"""CPython hashes an int modulo this prime: its multiples all hash to 0."""


def flood_dict(keys: int) -> bytes:
    """Protocol-2 opcodes (no PROTO, no STOP) of a dict of `keys` int keys that all hash to 0,
    written by hand (building it in Python would take as long as reading it)."""
    items = b"".join(
        pickle.LONG1 + bytes([len(e)]) + e + pickle.NONE
        for e in (pickle.encode_long(k * ALIKE) for k in range(1, keys + 1))
    )
    return pickle.EMPTY_DICT + pickle.MARK + items + pickle.SETITEMS


PLACEHOLDER = "FLOOD-PLACEHOLDER"


def flood_metadata(keys: int) -> Callable[[str, str], None]:
    """`.metadata`'s planner_data gains a dict of `keys` int keys that hash alike."""

    def plant(folder: str, marker: str) -> None:
        metadata = _meta(folder)
        metadata.planner_data["flood"] = PLACEHOLDER
        data = pickle.dumps(metadata, protocol=2)  # no frames: opcodes splice in place
        text = PLACEHOLDER.encode()
        spot = pickle.BINUNICODE + struct.pack("<I", len(text)) + text
        assert data.count(spot) == 1
        with open(os.path.join(folder, ".metadata"), "wb") as f:
            f.write(data.replace(spot, flood_dict(keys)))

    return plant


def flood_dataloader(keys: int) -> Callable[[str, str], None]:
    """The dataloader state (a pickle in a byte item) is a dict of `keys` int keys that hash
    alike."""

    def plant(folder: str, marker: str) -> None:
        state = pickle.PROTO + b"\x02" + flood_dict(keys) + pickle.STOP
        _append_item(folder, "dataloader.dp_rank_0", _saved({"dp_rank_0": state}))

    return plant


def split_embedding(chunks: int) -> Callable[[str, str], None]:
    """The embedding (4,096 x 256) stored as `chunks` chunks of whole rows (two columns wide
    when there are more chunks than rows), each its own archive in one new shard file: a
    legitimate layout that the product never writes."""

    def plant(folder: str, marker: str) -> None:
        metadata = _meta(folder)
        fqn = "tok_embeddings.weight"
        entry = metadata.state_dict_metadata[fqn]
        full = torch.zeros(entry.size)
        for index in [i for i in metadata.storage_data if i.fqn == fqn]:
            info = metadata.storage_data.pop(index)
            with open(os.path.join(folder, info.relative_path), "rb") as f:
                f.seek(info.offset)
                part = torch.load(io.BytesIO(f.read(info.length)), weights_only=True)
            rows, cols = index.offset
            full[rows : rows + part.shape[0], cols : cols + part.shape[1]] = part
        height, width = entry.size
        across = max(1, chunks // height)
        tall, wide = height * across // chunks, width // across
        entry.chunks = []
        with open(os.path.join(folder, "chunks.distcp"), "wb") as f:
            for row in range(0, height, tall):
                for col in range(0, width, wide):
                    offsets, sizes = torch.Size([row, col]), torch.Size([tall, wide])
                    data = _saved(full[row : row + tall, col : col + wide].clone())
                    entry.chunks.append(ChunkStorageMetadata(offsets, sizes))
                    info = _StorageInfo("chunks.distcp", f.tell(), len(data))
                    metadata.storage_data[MetadataIndex(fqn, offsets)] = info
                    f.write(data)
        print(f"    {len(entry.chunks):,} chunks of {tall} x {wide}")
        _put_meta(folder, metadata)

    return plant


def step_link(folder: str, marker: str) -> None:
    """`checkpoint/step-2` becomes a symlink to a copy of it in another folder."""
    elsewhere = os.path.join(os.path.dirname(marker), "elsewhere", "step-2")
    shutil.rmtree(os.path.dirname(elsewhere), ignore_errors=True)
    shutil.move(folder, elsewhere)
    os.symlink(elsewhere, folder)


CASES: dict[str, Callable[[str, str], None] | None] = {
    "0 the checkpoint as written (for comparison)": lambda f, m: None,
    "1 protocol-0 os.system in the dataloader state": p0_dataloader,
    "2 BUILD Metadata.__getstate__ before .metadata": lambda f, m: _prefix_build_on_class(
        f, "torch.distributed.checkpoint.metadata", "Metadata", "__getstate__"
    ),
    "2 BUILD PosixPath._str before .metadata": lambda f, m: _prefix_build_on_class(
        f, "pathlib", "PosixPath", "_str"
    ),
    "3 bzip2 byte item declaring 1 GiB": bzip2_bomb,
    "3 1M-token vocabulary, 8-byte shard": vocab_1m,
    "4 absolute relative_path": outside(absolute=True),
    "4 ../ relative_path": outside(absolute=False),
    "5 1M-deep nested tuple in .metadata": deep_tuple,
    "5 FIFO named by an item of length 0": fifo,
    "6 storage entries that are ints": _edit(_storage_ints),
    "6 an offset that is a string": _edit(_offset_string),
    "6 a size that is an int": _edit(_size_int),
    "6 train_state.step holding a string": lambda f, m: _append_item(
        f, "train_state.step", _saved("2")
    ),
    "7 a folder named step-0002": None,
    "8 tensor archive: 2,000 zip entries on one 2 MiB record": zip_entries(2_000),
    "8 tensor archive: 65,535 zip entries on one 2 MiB record": zip_entries(65_535 - 6),
    "9 .metadata: 40,000 int keys that hash alike": flood_metadata(40_000),
    "9 .metadata: 150,000 int keys that hash alike": flood_metadata(150_000),
    "9 dataloader state: 40,000 int keys that hash alike": flood_dataloader(40_000),
    "A embedding in 8,192 chunks": split_embedding(8_192),
    "A embedding in 16,384 chunks": split_embedding(16_384),
    "A embedding in 65,536 chunks": split_embedding(65_536),
    "B checkpoint/step-2 a symlink to a folder elsewhere": step_link,
}


MEMORY_LIMIT = 8 << 30
"""Address space of each command run (a case that asks for more fails there, not the machine)."""
TIMEOUT = 300
"""Seconds a command may run before it is killed (reported as `killed`)."""
CAPS = (60.0, 1536.0)
"""Issue 39's caps on each command: wall seconds, peak RSS in MiB."""
ALSO = {"4 ": ["export"], "3 1M": ["generate"], "8 ": ["export", "generate"], "A ": ["export"]}
"""Case name prefix -> the commands run after `check` on its folder."""


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def timed(command: list[str]) -> tuple[int | None, list[str], float, float]:
    """(exit status, None when killed at TIMEOUT; stderr lines of the command; wall seconds;
    peak RSS in MiB)."""
    with tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(
            ["/usr/bin/time", "-v", *command],
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
            start_new_session=True,
            preexec_fn=_limit,
        )
        start = time.monotonic()
        try:
            process.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return None, [], time.monotonic() - start, float("nan")
        err.seek(0)
        report = err.read()
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", report).group(1))
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", report).group(1)
    status = int(re.search(r"Exit status: (\d+)", report).group(1))
    seconds = sum(float(part) * 60**i for i, part in enumerate(reversed(wall.split(":"))))
    lines = [
        line
        for line in report.splitlines()
        if line.strip() and not line.startswith("\t") and not line.startswith("Command ")
    ]
    return status, lines, seconds, rss / 1024


def verdict(status: int | None, lines: list[str], seconds: float, rss: float) -> str:
    """`one line` (exit 2, one `error:` line, within CAPS), `ok` (exit 0) or what is wrong."""
    if status is None:
        return f"killed at {TIMEOUT} s"
    if status == 0:
        return "ok" if seconds <= CAPS[0] and rss <= CAPS[1] else "ok, past the caps"
    one = status == 2 and len(lines) == 1 and lines[0].startswith("error: ")
    within = seconds <= CAPS[0] and rss <= CAPS[1]
    return ("one line" if one else f"exit {status}, {len(lines)} lines") + (
        "" if within else ", past the caps"
    )


def main() -> None:
    fresh, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    marker = os.path.join(work, "PAYLOAD-RAN")
    python = [sys.executable, "-W", "ignore", "-m"]
    only = tuple(sys.argv[3:]) or ("",)
    from boost_titan.checkpoint.safe_load import CheckpointUnpickler

    with open(os.path.join(fresh, ".metadata"), "rb") as f:
        unpickler = CheckpointUnpickler(io.BytesIO(f.read()))
    entries = len(unpickler.load().storage_data)
    cost = unpickler.opcodes
    print(f"the fresh .metadata: {entries:,} storage entries, opcode cost {cost:,}")
    table = []
    for name, plant in CASES.items():
        if not name.startswith(only):
            continue
        dump = os.path.join(work, re.sub(r"\W+", "_", name))
        shutil.rmtree(dump, ignore_errors=True)
        folder = os.path.join(dump, "checkpoint", "step-2" if plant else "step-0002")
        shutil.copytree(fresh, folder)
        print(name, flush=True)
        if plant:
            plant(folder, marker)
        check = [*python, "boost_titan.check", "--job.config_file", "train_configs/debug.toml"]
        check += ["--job.dump_folder", dump, "--checkpoint.enable", "--training.steps", "4"]
        runs = {"check": check}
        for command in next((c for p, c in ALSO.items() if name.startswith(p)), []):
            out = os.path.join(work, f"{os.path.basename(dump)}-export")
            extra = ["--out", out] if command == "export" else ["--prompt", "hi"]
            extra += ["--arch", "cola"]  # debug.toml's [boost] arch
            runs[command] = [*python, f"boost_titan.{command}", "--checkpoint", folder, *extra]
        for command, argv in runs.items():
            status, lines, seconds, rss = timed(argv)
            said = verdict(status, lines, seconds, rss)
            ran = os.path.exists(marker)
            print(f"    {command}: {said}, exit {status}, {seconds:.1f} s, {rss:,.0f} MiB peak RSS")
            print(f"    payload ran: {ran}" if ran else "", end="")
            for line in lines:
                print(f"    {line[:400]}")
            table.append((name, command, said, seconds, rss))
        shutil.rmtree(dump, ignore_errors=True)
    print("\n| case | command | outcome | wall s | peak RSS MiB |\n|---|---|---|---|---|")
    for name, command, said, seconds, rss in table:
        print(f"| {name[2:]} | {command} | {said} | {seconds:.1f} | {rss:,.0f} |")


if __name__ == "__main__":
    main()
