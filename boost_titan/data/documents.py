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
- `.parquet`: one chunk per row group, its "text" column.

Documents without text (missing, null or whitespace only) are skipped.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from boost_titan.config.errors import ConfigError

SUFFIXES = (".jsonl", ".json", ".parquet", ".txt")


@dataclass(frozen=True)
class Chunk:
    """Documents of `path` between byte `start` and `end` (parquet: row group `start`)."""

    path: str
    start: int
    end: int

    @property
    def kind(self) -> str:
        return Path(self.path).suffix.lower()


def expand_inputs(inputs: list[str]) -> list[Path]:
    """The supported files named by `inputs` (files, folders searched recursively, globs),
    each once, sorted by path; ConfigError (one line) for an input that names none."""
    found: set[Path] = set()
    for item in inputs:
        matches = [Path(m) for m in sorted(glob.glob(item, recursive=True))] or [Path(item)]
        files = []
        for match in matches:
            if match.is_dir():
                files += [
                    f
                    for f in match.rglob("*")
                    if f.is_file() and f.suffix.lower() in SUFFIXES and not f.name.startswith(".")
                ]
            elif match.is_file() and match.suffix.lower() in SUFFIXES:
                files.append(match)
        files = [f.resolve() for f in files if f.stat().st_size > 0]
        if not files:
            raise ConfigError(
                f"input {item} names no non-empty {'/'.join(SUFFIXES)} file; give corpus "
                "files, folders or globs"
            )
        found.update(files)
    return sorted(found)


def _is_json_array(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"[")


def plan_chunks(files: list[Path], chunk_bytes: int) -> list[Chunk]:
    """Every file's chunks in file order (see the module doc)."""
    chunks = []
    for path in files:
        suffix = path.suffix.lower()
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            try:
                groups = pq.ParquetFile(path).num_row_groups
            except Exception as e:  # pyarrow raises several types for a damaged file
                raise ConfigError(f"{path} is not a readable parquet file ({e})") from None
            chunks += [Chunk(str(path), g, g + 1) for g in range(groups)]
        elif suffix == ".json" and _is_json_array(path):
            chunks.append(Chunk(str(path), 0, path.stat().st_size))
        else:
            size = path.stat().st_size
            chunks += [
                Chunk(str(path), a, min(a + chunk_bytes, size)) for a in range(0, size, chunk_bytes)
            ]
    return chunks


def _text_of(record: object, where: str) -> str | None:
    if isinstance(record, str):
        return record
    if not isinstance(record, dict):
        raise ConfigError(f'{where} is not a JSON object; store one {{"text": ...}} per line')
    text = record.get("text")
    if text is not None and not isinstance(text, str):
        raise ConfigError(f'{where} has a "text" that is not a string; store text as a string')
    return text


def _lines(f: BinaryIO, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(offset, line) for the lines of `f` that start in [start, end)."""
    if start > 0:
        f.seek(start - 1)
        f.readline()  # the line holding byte start - 1 belongs to the previous chunk
    position = f.tell()
    while position < end:
        line = f.readline()
        if not line:
            return
        yield position, line
        position += len(line)


def _json_lines(chunk: Chunk) -> Iterator[str]:
    with open(chunk.path, "rb") as f:
        for offset, line in _lines(f, chunk.start, chunk.end):
            if offset == 0:
                line = line.removeprefix(b"\xef\xbb\xbf")
            if not line.strip():
                continue
            where = f"{chunk.path} at byte {offset}"
            try:
                text = _text_of(json.loads(line), where)
            except ValueError as e:  # includes UnicodeDecodeError
                raise ConfigError(f"{where} is not a JSON line ({e}); fix the file") from None
            if text is not None:
                yield text


def _json_array(chunk: Chunk) -> Iterator[str]:
    try:
        items = json.loads(Path(chunk.path).read_bytes().removeprefix(b"\xef\xbb\xbf"))
    except ValueError as e:
        raise ConfigError(f"{chunk.path} is not a JSON array ({e}); fix the file") from None
    for i, item in enumerate(items):
        text = _text_of(item, f"{chunk.path} item {i}")
        if text is not None:
            yield text


def _blank(line: bytes) -> bool:
    return not line.strip()


def _after_blank_line(f: BinaryIO, position: int) -> bool:
    """Whether the line ending just before `position` is blank (True at the file start)."""
    if position == 0:
        return True
    end = position - 1  # the newline ending the previous line
    block = 4096
    tail = b""
    while end > 0:
        begin = max(0, end - block)
        f.seek(begin)
        tail = f.read(end - begin) + tail
        newline = tail.rfind(b"\n")
        if newline >= 0:
            return _blank(tail[newline + 1 :])
        if tail.strip():
            return False
        end = begin
    return _blank(tail)


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where} is not UTF-8 text ({e}); convert it to UTF-8") from None


def _paragraphs(chunk: Chunk) -> Iterator[str]:
    with open(chunk.path, "rb") as f:
        lines = _lines(f, chunk.start, chunk.end)
        first = next(lines, None)
        if first is None:
            return
        starts_paragraph = _after_blank_line(f, first[0])
        f.seek(first[0] + len(first[1]))
        paragraph: list[bytes] = []
        offset = first[0]
        line: bytes | None = first[1]
        if not starts_paragraph:  # the paragraph started in the previous chunk
            while line is not None and not _blank(line):
                offset += len(line)
                line = f.readline() or None
        while line is not None:
            if _blank(line):
                if paragraph:
                    yield _decode(b"".join(paragraph).rstrip(b"\r\n"), chunk.path)
                    paragraph = []
            elif paragraph or offset < chunk.end:
                paragraph.append(line.removeprefix(b"\xef\xbb\xbf") if offset == 0 else line)
            else:
                return  # the next paragraph starts in the next chunk
            offset += len(line)
            line = f.readline() or None
        if paragraph:
            yield _decode(b"".join(paragraph).rstrip(b"\r\n"), chunk.path)


def _parquet(chunk: Chunk) -> Iterator[str]:
    import pyarrow.parquet as pq

    table = pq.ParquetFile(chunk.path).read_row_group(chunk.start, columns=["text"])
    for text in table.column("text").to_pylist():
        if text is not None and not isinstance(text, str):
            raise ConfigError(f'{chunk.path} has a "text" column that is not a string')
        if text is not None:
            yield text


def documents(chunk: Chunk) -> Iterator[str]:
    """The non-empty documents of `chunk`, in file order."""
    if chunk.kind == ".parquet":
        reader = _parquet
    elif chunk.kind == ".txt":
        reader = _paragraphs
    elif chunk.kind == ".json" and _is_json_array(Path(chunk.path)):
        reader = _json_array
    else:
        reader = _json_lines
    return (text for text in reader(chunk) if text.strip())
