"""Issue 39's hostile checkpoints, rebuilt by hand (not with the test helpers) on a
checkpoint the product wrote, each run through `python -m boost_titan.check` under
`/usr/bin/time -v`: exit status, `error:` lines, wall time, peak RSS, whether the payload
ran. Then `export` of the folders whose entries point outside (must fail, writing nothing),
and `generate` on the 1M-token vocabulary. The figures in docs/reliability.md come from it.

    ./run_train.sh --training.steps 2 --checkpoint.enable --checkpoint.interval 2 \\
        --job.dump_folder /tmp/fresh
    python scripts/hostile_checkpoints.py /tmp/fresh/checkpoint/step-2 /tmp/hostile [PREFIX]

PREFIX: only the cases whose name starts with it (e.g. `0`: the clean checkpoint).
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import MetadataIndex


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
}


def timed(command: list[str]) -> tuple[int, list[str], str, float]:
    """(exit status, stderr lines of the command, wall clock, peak RSS in MiB)."""
    done = subprocess.run(
        ["/usr/bin/time", "-v", *command], capture_output=True, text=True, timeout=300
    )
    report = done.stderr
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", report).group(1))
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", report).group(1)
    status = int(re.search(r"Exit status: (\d+)", report).group(1))
    lines = [
        line
        for line in report.splitlines()
        if line.strip() and not line.startswith("\t") and not line.startswith("Command ")
    ]
    return status, lines, wall, rss / 1024


def main() -> None:
    fresh, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    marker = os.path.join(work, "PAYLOAD-RAN")
    python = [sys.executable, "-W", "ignore", "-m"]
    only = sys.argv[3] if len(sys.argv) > 3 else ""
    from boost_titan.parallelize.safe_load import CheckpointUnpickler

    with open(os.path.join(fresh, ".metadata"), "rb") as f:
        unpickler = CheckpointUnpickler(io.BytesIO(f.read()))
    entries = len(unpickler.load().storage_data)
    cost = unpickler.opcodes
    print(f"the fresh .metadata: {entries:,} storage entries, opcode cost {cost:,}")
    for name, plant in CASES.items():
        if not name.startswith(only):
            continue
        dump = os.path.join(work, re.sub(r"\W+", "_", name))
        shutil.rmtree(dump, ignore_errors=True)
        folder = os.path.join(dump, "checkpoint", "step-2" if plant else "step-0002")
        shutil.copytree(fresh, folder)
        print(name)
        if plant:
            plant(folder, marker)
        check = [*python, "boost_titan.check", "--job.config_file", "train_configs/debug.toml"]
        check += ["--job.dump_folder", dump, "--checkpoint.enable", "--training.steps", "4"]
        status, lines, wall, rss = timed(check)
        ran = os.path.exists(marker)
        print(f"    check: exit {status}, {wall} wall, {rss:,.0f} MiB peak RSS, payload ran: {ran}")
        for line in lines:
            print(f"    {line[:400]}")
        if name.startswith("4 ") or "vocabulary" in name:
            command = "export" if name.startswith("4 ") else "generate"
            out = os.path.join(work, f"{os.path.basename(dump)}-export")
            extra = ["--out", out] if command == "export" else ["--prompt", "hi"]
            status, lines, wall, rss = timed(
                [*python, f"boost_titan.{command}", "--checkpoint", folder, *extra]
            )
            wrote = os.path.exists(out)
            print(f"    {command}: exit {status}, {wall}, {rss:,.0f} MiB, wrote {out}: {wrote}")
            for line in lines:
                print(f"    {line[:400]}")


if __name__ == "__main__":
    main()
