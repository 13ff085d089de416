"""A Megatron-LM indexed dataset (`PREFIX.bin` + `PREFIX.idx`) written by hand from the
layout Megatron documents (its `_IndexWriter`): not imported from Megatron, so the reader
(`boost_titan.data.megatron_indexed`) is tested against the format, not against itself.

`index_bytes` also builds broken indexes (any header field, pointers or counts given) for
the hostile cases (`scripts/hostile_inputs.py`) and the fuzzer (`input_fuzz.py`)."""

from __future__ import annotations

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
