"""A Megatron-LM indexed dataset (`PREFIX.bin` + `PREFIX.idx`) written by hand from the
layout Megatron documents (its `_IndexWriter`): not imported from Megatron, so the reader
(`boost_titan.data.megatron_indexed`) is tested against the format, not against itself.

`index_bytes` also builds broken indexes (any header field, pointers or counts given) for
the hostile cases (`scripts/hostile_inputs.py`) and the fuzzer (`input_fuzz.py`)."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np

CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint16": 8}
"""Megatron's `DType` codes of the integer dtypes."""


def pointers_of(lengths: Sequence[int], itemsize: int) -> list[int]:
    """Each sequence's byte offset: the running sum of the lengths before it x itemsize."""
    out, running = [], 0
    for length in lengths:
        out.append(running)
        running += length * itemsize
    return out


def index_bytes(
    code: int,
    lengths: Sequence[int],
    document_indices: Sequence[int],
    pointers: Sequence[int] | None = None,
    counts: tuple[int, int] | None = None,
    magic: bytes = b"MMIDIDX\x00\x00",
    version: int = 1,
) -> bytes:
    """An `.idx`: header (magic, version, dtype code, sequence and document-index counts),
    int32 lengths, int64 pointers, int64 document indices. `pointers` default to Megatron's
    (itemsize from `code`); `counts` override the header's counts."""
    itemsize = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}.get(code, 1)
    if pointers is None:
        pointers = pointers_of(lengths, itemsize)
    n, d = counts or (len(lengths), len(document_indices))
    return (
        magic
        + struct.pack("<QBQQ", version, code, n, d)
        + np.asarray(lengths, "<i4").tobytes()
        + np.asarray(pointers, "<i8").tobytes()
        + np.asarray(document_indices, "<i8").tobytes()
    )


def index_fields(prefix: Path) -> dict:
    """The dtype code, lengths, pointers and document indices of a well-formed `prefix.idx`
    (keyword arguments of `index_bytes`: one changed alone leaves the others as they were)."""
    raw = Path(f"{prefix}.idx").read_bytes()
    _, _, code, n, d = struct.unpack_from("<9sQBQQ", raw)
    return {
        "code": code,
        "lengths": np.frombuffer(raw, "<i4", n, 34).tolist(),
        "pointers": np.frombuffer(raw, "<i8", n, 34 + 4 * n).tolist(),
        "document_indices": np.frombuffer(raw, "<i8", d, 34 + 12 * n).tolist(),
    }


def rewrite_index(prefix: Path, **change: object) -> None:
    """`prefix.idx` written again with `change` (`index_bytes`' keywords) over its fields."""
    Path(f"{prefix}.idx").write_bytes(index_bytes(**(index_fields(prefix) | change)))


def write_megatron(
    prefix: Path, documents: Sequence[Sequence[int]], dtype: str = "uint16", split: int = 0
) -> Path:
    """`prefix.bin` and `prefix.idx` holding `documents` (token id lists) in order, each one
    sequence, or two where `split` > 0 and the document is longer (Megatron's sentence
    split: several sequences per document); returns `prefix`."""
    lengths, ends = [], [0]
    for doc in documents:
        parts = [split, len(doc) - split] if 0 < split < len(doc) else [len(doc)]
        lengths += parts
        ends.append(len(lengths))
    tokens = np.asarray([t for doc in documents for t in doc], np.dtype(dtype).newbyteorder("<"))
    Path(f"{prefix}.bin").write_bytes(tokens.tobytes())
    Path(f"{prefix}.idx").write_bytes(index_bytes(CODES[dtype], lengths, ends))
    return prefix


def from_prepared(prepared: Path, out: Path) -> Path:
    """The shards of the prepared folder `prepared` (its manifest's order, each document
    as `prepare` framed it: its `.idx` holds the documents' end offsets) as Megatron pairs
    `out/shard-NNNNN`, uint16; returns `out`."""
    manifest = json.loads((prepared / "manifest.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    for shard in manifest["shards"]:
        tokens = np.fromfile(prepared / f"{shard['name']}.bin", manifest["dtype"])
        ends = np.fromfile(prepared / f"{shard['name']}.idx", "<u8").astype(np.int64)
        write_megatron(out / shard["name"], np.split(tokens, ends[:-1]))
    return out
