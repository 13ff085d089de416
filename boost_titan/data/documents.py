"""The documents of corpus files, read in fixed chunks without loading a file whole.

`python -m boost_titan.prepare` cuts its inputs into chunks (`plan_chunks`) that depend on
the files and `chunk_bytes` alone, never on the worker count, so the chunk order, hence the
document order, is the same however many workers read them:

- `.jsonl` (and `.json` files of JSON lines): byte ranges; a chunk holds the lines that
  start inside its range; each line is an object whose "text" is a document;
- `.json` holding one JSON array (of objects with "text", or strings): the whole file;
- `.txt`: byte ranges; a document is a paragraph (a run of lines that are not blank; blank
  or whitespace-only lines separate documents), and a chunk holds the paragraphs that start
  inside its range;
- `.parquet`: one chunk per row group, its "text" column;
- `.jsonl.gz`, `.json.gz`, `.txt.gz` (also `.bz2`, `.xz`, `.zst`): one chunk per file (a
  compressed stream cannot be entered in the middle), read as a stream.

`Reading` says where a record keeps its text (`text_keys`: the first key the record holds
with a non-null value wins; parquet: the first key that is a column) and how bytes decode
(`encoding`, ASCII-compatible; parquet strings are UTF-8 by format) and how long a document
may be (`max_document_mb`: a longer one is a ConfigError naming it, found without reading
more of it than the limit; tokenizing a document takes about 200 bytes of memory per byte).
Records without text (no key, null, or whitespace only) are skipped and counted by the
caller (`records`). A folder holding a prepared dataset (`manifest.json` or `plan.json`) is
no input (`expand_inputs`).
"""

from __future__ import annotations

import bz2
import codecs
import glob
import gzip
import json
import lzma
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from boost_titan.config.errors import ConfigError
from boost_titan.data.zstd_stream import open_zstd

SUFFIXES = (".jsonl", ".json", ".parquet", ".txt")
COMPRESSIONS: dict[str, Callable[[str], IO[bytes]]] = {
    ".gz": gzip.open,
    ".bz2": bz2.open,
    ".xz": lzma.open,
    ".zst": open_zstd,
    ".zstd": open_zstd,
}
"""Compressions read, by suffix (after a text format's suffix): the standard library's, and
zstd (`zstandard`)."""
UNREAD_COMPRESSIONS = {".lz4": "lz4", ".br": "brotli", ".sz": "snappy"}
"""Compressed corpora refused in one line rather than skipped (docs/datasets.md)."""
NAMES = "/".join(SUFFIXES) + " (text formats also " + "/".join(COMPRESSIONS) + "-compressed)"
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_DOCUMENT_MB = 16.0
"""The default longest document, in MB (`--max-document-mb`)."""
PREPARED_MARKERS = ("manifest.json", "plan.json")
"""Files that make a folder a prepared dataset (whole, or being written)."""
_BROKEN_STREAM = (OSError, EOFError, zlib.error, lzma.LZMAError)
"""What a damaged compressed file raises while it is read (gzip.BadGzipFile is an OSError)."""


def replace_lone_surrogates(text: str) -> tuple[str, int]:
    """`text` with each lone UTF-16 surrogate (a JSON escape such as "\\ud800" that pairs
    with nothing; no tokenizer encodes it) replaced by U+FFFD, and how many there were."""
    return _LONE_SURROGATE.subn("\ufffd", text)


def file_format(path: Path) -> tuple[str, str | None] | None:
    """(format suffix, compression suffix or None) of a corpus file, None if not one;
    ConfigError for a compressed corpus file this module cannot read."""
    suffixes = [s.lower() for s in path.suffixes[-2:]]
    if not suffixes:
        return None
    last, inner = suffixes[-1], (suffixes[0] if len(suffixes) == 2 else "")
    if last in SUFFIXES:
        return last, None
    if last in UNREAD_COMPRESSIONS and inner in SUFFIXES:
        raise ConfigError(
            f"{path} is {UNREAD_COMPRESSIONS[last]}-compressed, which prepare does not read; "
            f"decompress it, or recompress it with gzip (read: {NAMES})"
        )
    if last in COMPRESSIONS and inner in SUFFIXES:
        if inner == ".parquet":
            raise ConfigError(
                f"{path}: parquet compresses its own columns; decompress the file to .parquet"
            )
        return inner, last
    return None


@dataclass(frozen=True)
class Reading:
    """Where records keep their text and how bytes decode (see the module doc)."""

    text_keys: tuple[str, ...] = ("text",)
    encoding: str = "utf-8"
    max_document_mb: float = MAX_DOCUMENT_MB

    @property
    def max_bytes(self) -> int:
        return max(1, int(self.max_document_mb * (1 << 20)))

    def too_long(self, where: str) -> ConfigError:
        """The refusal of the document at `where` (one line)."""
        return ConfigError(
            f"{where} holds a document longer than --max-document-mb {self.max_document_mb:g}; "
            "split it, or raise --max-document-mb (tokenizing takes about 200 bytes of memory "
            "per byte of a document)"
        )

    @property
    def keys_named(self) -> str:
        return ", ".join(repr(k) for k in self.text_keys)


UTF8_TEXT = Reading()
"""The default: UTF-8, the text under "text"."""


def parse_text_keys(value: str) -> tuple[str, ...]:
    """`--text-key`: one key or a comma list, first present wins; ConfigError for none."""
    keys = tuple(k.strip() for k in value.split(","))
    if not all(keys):
        raise ConfigError(
            f"--text-key {value!r} holds an empty key; give one key or a comma list "
            "(--text-key content,text)"
        )
    return keys


def check_encoding(name: str) -> str:
    """The codec name of `--encoding`; ConfigError for an unknown one or one that is not
    ASCII-compatible (lines and JSON are split on ASCII bytes before decoding)."""
    try:
        codec = codecs.lookup(name)
    except LookupError:
        raise ConfigError(
            f"--encoding {name!r} is not an encoding Python knows; name one such as utf-8, "
            "latin-1 or cp1252"
        ) from None
    probe = '\n\r {}[]":,\\ azAZ09'
    try:
        compatible = codec.encode(probe)[0] == probe.encode("ascii")
    except UnicodeError:
        compatible = False
    if not compatible:
        raise ConfigError(
            f"--encoding {name} is not ASCII-compatible, so lines and JSON cannot be split "
            f"before decoding; convert the files to UTF-8 (iconv -f {name} -t utf-8)"
        )
    return codec.name


@dataclass(frozen=True)
class Chunk:
    """Documents of `path` between byte `start` and `end` (parquet: row group `start`)."""

    path: str
    start: int
    end: int

    @property
    def kind(self) -> str:
        """The format's suffix (`.jsonl` for `x.jsonl.gz`)."""
        return _format(Path(self.path))[0]

    @property
    def compressed(self) -> bool:
        return _format(Path(self.path))[1] is not None

    def open(self) -> IO[bytes]:
        """The file's bytes (decompressed)."""
        compression = _format(Path(self.path))[1]
        if compression is None:
            return open(self.path, "rb")
        return COMPRESSIONS[compression](self.path)

    @property
    def bounds(self) -> tuple[int, float]:
        """The byte range to read: a compressed file's is the whole stream."""
        return (0, float("inf")) if self.compressed else (self.start, self.end)


def _format(path: Path) -> tuple[str, str | None]:
    found = file_format(path)
    if found is None:
        raise ConfigError(f"{path} is not a {NAMES} file")
    return found


def prepared_folders(folder: Path) -> list[Path]:
    """The folders under `folder` (itself included) that hold a prepared dataset."""
    return sorted(
        {m.parent for name in PREPARED_MARKERS for m in folder.rglob(name) if m.is_file()}
    )


def expand_inputs(inputs: list[str], skipped: list[Path] | None = None) -> list[Path]:
    """The supported files named by `inputs` (files, folders searched recursively, globs),
    each once, sorted by path; a prepared folder met in a search is left out and added to
    `skipped`. ConfigError (one line) for an input that names none."""
    found: set[Path] = set()
    for item in inputs:
        matches = [Path(m) for m in sorted(glob.glob(item, recursive=True))] or [Path(item)]
        files = []
        for match in matches:
            if match.is_dir():
                prepared = prepared_folders(match)
                if skipped is not None:
                    skipped += [p for p in prepared if p not in skipped]
                files += [
                    f
                    for f in match.rglob("*")
                    if f.is_file()
                    and not f.name.startswith(".")
                    and file_format(f)
                    and not any(p == f.parent or p in f.parents for p in prepared)
                ]
            elif match.is_file() and file_format(match):
                files.append(match)
        files = [f.resolve() for f in files if f.stat().st_size > 0]
        if not files:
            raise ConfigError(
                f"input {item} names no non-empty {NAMES} file; give corpus files, folders or globs"
            )
        found.update(files)
    return sorted(found)


def _is_json_array(chunk: Chunk) -> bool:
    with _reading(chunk) as f:
        return f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"[")


class _reading:
    """`chunk.open()`; a damaged compressed stream (found while reading) is a ConfigError."""

    def __init__(self, chunk: Chunk) -> None:
        self.chunk = chunk

    def __enter__(self) -> IO[bytes]:
        self.file = self.chunk.open()
        return self.file

    def __exit__(self, kind: type | None, error: BaseException | None, _: object) -> None:
        self.file.close()
        if self.chunk.compressed and isinstance(error, _BROKEN_STREAM):
            raise ConfigError(
                f"{self.chunk.path} is not a readable compressed file ({error}); fix or remove it"
            ) from None


def _parquet_column(path: Path, reading: Reading) -> tuple[int, str]:
    """(row groups, the text column) of a parquet file; ConfigError if none of the text
    keys is a column."""
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise ConfigError(f"{path} is not a readable parquet file ({e})") from None
    columns = file.schema_arrow.names
    column = next((k for k in reading.text_keys if k in columns), None)
    if column is None:
        raise ConfigError(
            f"{path} has no column {reading.keys_named} (its columns: {', '.join(columns)}); "
            "pass --text-key with the column that holds the text"
        )
    return file.num_row_groups, column


def plan_chunks(files: list[Path], chunk_bytes: int, reading: Reading = UTF8_TEXT) -> list[Chunk]:
    """Every file's chunks in file order (see the module doc)."""
    chunks = []
    for path in files:
        whole = Chunk(str(path), 0, path.stat().st_size)
        if whole.kind == ".parquet":
            groups, _ = _parquet_column(path, reading)
            chunks += [Chunk(str(path), g, g + 1) for g in range(groups)]
        elif whole.compressed or (whole.kind == ".json" and _is_json_array(whole)):
            chunks.append(whole)
        else:
            size = path.stat().st_size
            chunks += [
                Chunk(str(path), a, min(a + chunk_bytes, size)) for a in range(0, size, chunk_bytes)
            ]
    return chunks


def _text_of(record: object, where: str, reading: Reading) -> str | None:
    if isinstance(record, str):
        return record
    if not isinstance(record, dict):
        raise ConfigError(f'{where} is not a JSON object; store one {{"text": ...}} per line')
    key = next((k for k in reading.text_keys if record.get(k) is not None), None)
    if key is None:
        return None
    if not isinstance(record[key], str):
        raise ConfigError(f"{where} has a {key!r} that is not a string; store text as a string")
    return record[key]


def _readline(f: BinaryIO, offset: int, path: str, reading: Reading) -> bytes:
    """The line of `f` at byte `offset`; ConfigError (`Reading.too_long`) for one longer
    than `reading.max_bytes`, found after reading that many bytes of it."""
    line = f.readline(reading.max_bytes + 1)
    if len(line) > reading.max_bytes and not line.endswith(b"\n"):
        raise reading.too_long(f"{path} at byte {offset}")
    return line


def _skip_line(f: BinaryIO) -> None:
    """Read past the end of the current line, 1 MB at a time."""
    while (block := f.readline(1 << 20)) and not block.endswith(b"\n"):
        pass


def _lines(
    f: BinaryIO, start: int, end: float, path: str, reading: Reading
) -> Iterator[tuple[int, bytes]]:
    """(offset, line) for the lines of `f` that start in [start, end) (`_readline`)."""
    position = 0  # (a zstd stream cannot tell)
    if start > 0:
        f.seek(start - 1)
        _skip_line(f)  # the line holding byte start - 1 belongs to the previous chunk
        position = f.tell()
    while position < end:
        line = _readline(f, position, path, reading)
        if not line:
            return
        yield position, line
        position += len(line)


def _decode(data: bytes, where: str, reading: Reading) -> str:
    try:
        return data.decode(reading.encoding)
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{where} is not {reading.encoding} text ({e}); pass --encoding (such as "
            "--encoding latin-1) or convert it to UTF-8"
        ) from None


def _without_bom(data: bytes, reading: Reading) -> bytes:
    """`data` (a file's start) less a UTF-8 byte-order mark, when reading UTF-8."""
    return data.removeprefix(b"\xef\xbb\xbf") if reading.encoding == "utf-8" else data


def _json_lines(chunk: Chunk, reading: Reading) -> Iterator[str | None]:
    with _reading(chunk) as f:
        for offset, line in _lines(f, *chunk.bounds, chunk.path, reading):
            if offset == 0:
                line = _without_bom(line, reading)
            if not line.strip():
                continue
            where = f"{chunk.path} at byte {offset}"
            try:
                record = json.loads(_decode(line, where, reading))
            except ValueError as e:
                raise ConfigError(f"{where} is not a JSON line ({e}); fix the file") from None
            yield _text_of(record, where, reading)


def _json_array(chunk: Chunk, reading: Reading) -> Iterator[str | None]:
    with _reading(chunk) as f:
        data = _without_bom(f.read(), reading)
    try:
        items = json.loads(_decode(data, chunk.path, reading))
    except ValueError as e:
        raise ConfigError(f"{chunk.path} is not a JSON array ({e}); fix the file") from None
    for i, item in enumerate(items):
        yield _text_of(item, f"{chunk.path} item {i}", reading)


def _blank(line: bytes) -> bool:
    return not line.strip()


def _after_blank_line(f: BinaryIO, position: int) -> bool:
    """Whether the line ending just before `position` is blank (True at the file start)."""
    if position == 0:
        return True
    end = position - 1  # the newline ending the previous line
    while end > 0:  # back 4 KB at a time, up to that line's first non-blank byte
        begin = max(0, end - 4096)
        f.seek(begin)
        block = f.read(end - begin)
        newline = block.rfind(b"\n")
        if not _blank(block[newline + 1 :]):
            return False
        if newline >= 0:
            return True
        end = begin
    return True


def _paragraphs(chunk: Chunk, reading: Reading) -> Iterator[str | None]:
    start, end = chunk.bounds
    with _reading(chunk) as f:
        lines = _lines(f, start, end, chunk.path, reading)
        first = next(lines, None)
        if first is None:
            return
        starts_paragraph = True
        if first[0] > 0:  # (a compressed stream, which cannot seek, starts at 0)
            starts_paragraph = _after_blank_line(f, first[0])
            f.seek(first[0] + len(first[1]))
        paragraph: list[bytes] = []
        offset = first[0]
        line: bytes | None = first[1]
        if not starts_paragraph:  # the paragraph started in the previous chunk
            while line is not None and not _blank(line):
                offset += len(line)
                line = _readline(f, offset, chunk.path, reading) or None
        size, begins = 0, offset
        while line is not None:
            if _blank(line):
                if paragraph:
                    yield _decode(b"".join(paragraph).rstrip(b"\r\n"), chunk.path, reading)
                    paragraph, size = [], 0
            elif paragraph or offset < end:
                if not paragraph:
                    begins = offset
                size += len(line)
                if size > reading.max_bytes + 2:  # (its line ends are no text)
                    raise reading.too_long(f"{chunk.path} at byte {begins}")
                paragraph.append(_without_bom(line, reading) if offset == 0 else line)
            else:
                return  # the next paragraph starts in the next chunk
            offset += len(line)
            line = _readline(f, offset, chunk.path, reading) or None
        if paragraph:
            yield _decode(b"".join(paragraph).rstrip(b"\r\n"), chunk.path, reading)


def _parquet(chunk: Chunk, reading: Reading) -> Iterator[str | None]:
    import pyarrow.parquet as pq

    _, column = _parquet_column(Path(chunk.path), reading)
    table = pq.ParquetFile(chunk.path).read_row_group(chunk.start, columns=[column])
    for text in table.column(column).to_pylist():
        if text is not None and not isinstance(text, str):
            raise ConfigError(f"{chunk.path} has a {column!r} column that is not a string")
        yield text


def records(chunk: Chunk, reading: Reading = UTF8_TEXT) -> Iterator[str | None]:
    """Each record's text in file order, None for a record without text (see the module
    doc; a `.txt` paragraph always has text)."""
    if chunk.kind == ".parquet":
        reader = _parquet
    elif chunk.kind == ".txt":
        reader = _paragraphs
    elif chunk.kind == ".json" and _is_json_array(chunk):
        reader = _json_array
    else:
        reader = _json_lines
    for text in reader(chunk, reading):
        if text is not None and len(text) > reading.max_bytes:  # parquet, a JSON array
            group = f" row group {chunk.start}" if reader is _parquet else ""
            raise reading.too_long(chunk.path + group)
        yield text if text is None or text.strip() else None


def documents(chunk: Chunk, reading: Reading = UTF8_TEXT) -> Iterator[str]:
    """The documents with text of `chunk`, in file order."""
    return (text for text in records(chunk, reading) if text is not None)


def first_record_keys(chunks: list[Chunk], reading: Reading) -> list[str] | None:
    """The keys of the first JSON object record among `chunks` (a hint for `--text-key`)."""
    for chunk in chunks:
        if chunk.kind not in (".jsonl", ".json") or _is_json_array(chunk):
            continue
        with _reading(chunk) as f:
            for offset, line in _lines(f, *chunk.bounds, chunk.path, reading):
                if not line.strip():
                    continue
                try:
                    line = _without_bom(line, reading) if offset == 0 else line
                    record = json.loads(_decode(line, chunk.path, reading))
                except (ValueError, ConfigError):
                    return None
                if isinstance(record, dict):
                    return list(record)
    return None
