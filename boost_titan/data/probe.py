"""Decode the start of every local dataset file as the loader will, before workers start.

`boost_titan.check` calls `probe_files` on the files of `training.dataset_path`, so a file
of random bytes, a JSON line that does not parse, a document that is not a string or a
parquet file without a string "text" column is one line naming the file, not a worker
failure. Each file's first `sample_bytes(n_files)` bytes are read (complete lines for JSON
lines; the footer and first row group for parquet; a JSON array is read whole, as the
loader reads it). Damage past the sample is still found by the workers' loader.
"""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any

from boost_titan.config.errors import ConfigError

MAX_SAMPLE = 1 << 20
MIN_SAMPLE = 64 << 10
TOTAL_SAMPLE = 256 << 20
"""Per file at most 1 MiB, at least 64 KiB, and about 256 MiB over all files."""


def sample_bytes(n_files: int) -> int:
    return max(MIN_SAMPLE, min(MAX_SAMPLE, TOTAL_SAMPLE // max(n_files, 1)))


def _fail(path: Path, problem: str, fix: str = "fix the file or remove it") -> ConfigError:
    return ConfigError(f"training.dataset_path: {path} {problem}; {fix}")


def _head(path: Path, size: int) -> tuple[bytes, bool]:
    """The first `size` bytes (without a UTF-8 BOM) and whether that is the whole file."""
    with open(path, "rb") as f:
        data = f.read(size)
        whole = not f.read(1)
    return data.removeprefix(codecs.BOM_UTF8), whole


def probe_text(path: Path, size: int) -> None:
    """.txt: UTF-8 (the text loader decodes strictly)."""
    data, whole = _head(path, size)
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=whole)
    except UnicodeDecodeError as e:
        raise _fail(
            path,
            f"is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})",
            "convert it to UTF-8 or remove it",
        ) from None


def _check_documents(path: Path, records: list[tuple[str, Any]]) -> None:
    """Each (where, record) is a JSON object whose "text", if any, is a string; at least
    one has a "text"."""
    for where, record in records:
        if not isinstance(record, dict):
            raise _fail(
                path,
                f"{where} is a JSON {type(record).__name__}, not an object",
                'store one {"text": ...} object per document',
            )
        text = record.get("text")
        if text is not None and not isinstance(text, str):
            raise _fail(
                path,
                f'{where} has a "text" of type {type(text).__name__}',
                "store each document as a string",
            )
    if records and not any(isinstance(record.get("text"), str) for _, record in records):
        raise _fail(
            path,
            f'has no "text" field in its first {len(records)} records',
            'store each document as "text"',
        )


def probe_json(path: Path, size: int) -> None:
    """.jsonl/.json: JSON lines of objects, or (the loader reads it whole) a JSON array of
    objects or strings."""
    data, whole = _head(path, size)
    if data.lstrip().startswith(b"["):
        try:
            items = json.loads(path.read_bytes().removeprefix(codecs.BOM_UTF8))
        except ValueError as e:
            raise _fail(path, f"is not a JSON array ({e})") from None
        if not isinstance(items, list):
            raise _fail(path, "is not a JSON array", "give one JSON object per line")
        objects = [(f"item {i}", x) for i, x in enumerate(items) if not isinstance(x, str)]
        _check_documents(path, objects)
        return
    lines = data.splitlines()
    if not whole and len(lines) > 1:
        lines = lines[:-1]  # the last line may be cut by the sample
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append((f"line {number}", json.loads(line)))
        except ValueError as e:  # includes UnicodeDecodeError
            raise _fail(path, f"line {number} is not JSON ({e})") from None
    _check_documents(path, records)


def probe_parquet(path: Path, size: int) -> None:
    """.parquet: a readable footer, a string "text" column, a readable first row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        field = parquet.schema_arrow.field("text") if "text" in parquet.schema_arrow.names else None
        if field is not None and parquet.num_row_groups:
            parquet.read_row_group(0, columns=["text"])
    except (OSError, pa.ArrowException) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise _fail(path, f"is not a readable parquet file ({reason})") from None
    if field is None:
        raise _fail(
            path,
            f'has no "text" column (found {parquet.schema_arrow.names})',
            'store each document in a "text" column',
        )
    if not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
        raise _fail(
            path, f'has a "text" column of type {field.type}', "store each document as a string"
        )


PROBES = {"json": probe_json, "parquet": probe_parquet, "text": probe_text}
"""By the `datasets` builder that `corpus.BUILDERS` picks for a file suffix."""


def probe_files(files: list[Path]) -> None:
    """Raise ConfigError (one line, naming the file) for the first file whose sample the
    loader could not decode."""
    from boost_titan.data.corpus import BUILDERS

    size = sample_bytes(len(files))
    for path in files:
        PROBES[BUILDERS[path.suffix.lower()]](path, size)
