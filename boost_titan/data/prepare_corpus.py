"""Tokenize corpus files into a prepared dataset folder (`boost_titan.data.prepared`).

The inputs are cut into chunks that depend on the files alone (`documents.plan_chunks`);
chunk i becomes shard i, written by whichever worker process takes it, so the folder's
bytes do not depend on the worker count. Each shard is written under a temporary name and
renamed, then its `shard-NNNNN.json` (counts) is renamed into place: a shard with its JSON
is complete. The plan (tokenizer, sources, chunks) is saved first as `plan.json`; a rerun
of the same command into the same folder skips the complete shards, so an interrupted run
finishes where it stopped, with the same bytes. `manifest.json` is written last.

A preparation that ends in a ConfigError (bad data, or no tokens at all) leaves nothing
behind (`discarded_on_error`): the same inputs would fail again. Lone surrogates become
U+FFFD and are counted (`documents.replace_lone_surrogates`).
"""

from __future__ import annotations

import array
import errno
import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np

from boost_titan.config.errors import ConfigError
from boost_titan.data.corpus import HELD_OUT_PERCENT
from boost_titan.data.documents import (
    UTF8_TEXT,
    Chunk,
    Reading,
    expand_inputs,
    first_record_keys,
    plan_chunks,
    records,
    replace_lone_surrogates,
)
from boost_titan.data.prepared import (
    FORMAT,
    HELD_OUT,
    MANIFEST,
    TOKEN_DTYPES,
    VERSION,
    shard_name,
    token_dtype,
    tokenizer_fingerprint,
)
from boost_titan.data.tokenizer import load_tokenizer, tokenizer_files
from boost_titan.data.worker_pool import WorkerDied, run_tasks

PLAN = "plan.json"
CHUNK_MB = 16.0
"""Default input megabytes per shard (a shard is one unit of work)."""
COUNTS = ("tokens", "documents", "held_out_documents", "skipped_records", "lone_surrogates")
"""What each shard's JSON and the manifest count."""
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""A write's errors that mean no room: the disk, a quota, the file size limit."""
ADJUSTABLE = ("max_document_mb",)
"""Plan entries a rerun may change: they decide whether a document is refused, never the
bytes of a shard written (a run killed for memory resumes with a lower cap)."""
BATCH = 64
"""The most chunks a worker is sent at once (`batches`)."""
FLUSH_TOKENS = 1 << 20
"""Tokens a worker holds before appending them to its shard file (the shard's tokens never
sit in memory whole)."""


class Stopped(Exception):
    """A preparation that ended with its finished shards kept for a rerun (a worker's death,
    a full disk); the message is one line."""


def stopped_on_disk_full(error: OSError, out: str) -> Stopped | None:
    """The `Stopped` for a write that found no room (`DISK_FULL`), else None."""
    if error.errno not in DISK_FULL:
        return None
    return Stopped(
        f"--out {out}: no room to write ({os.strerror(error.errno)}); the finished shards are "
        "kept: free space (or give a disk with room) and rerun the same command to resume"
    )


def held_out(text: str, percent: float) -> bool:
    """Whether a document goes to the held-out split: the first 8 bytes of the SHA-256 of
    its text, mod 100, below `percent`."""
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % 100 < percent


def tokenizer_entry(assets: str, separator: str | None) -> dict[str, Any]:
    """What the manifest records of the tokenizer; ConfigError for one that would pack
    documents with nothing between them and no `separator` given."""
    tokenizer = load_tokenizer(assets)
    bos, eos = getattr(tokenizer, "bos_id", None), getattr(tokenizer, "eos_id", None)
    separator_id = None
    if separator is not None and eos is not None:
        raise ConfigError(
            f"--separator {separator!r}: the tokenizer {assets!r} ends every document with its "
            f"EOS token (id {eos}) already; drop --separator"
        )
    if separator is not None:
        inner = getattr(tokenizer, "tokenizer", None)  # the HF Tokenizer of torchtitan's wrapper
        separator_id = inner.token_to_id(separator) if inner is not None else None
        if separator_id is None:
            raise ConfigError(
                f"--separator {separator!r} is not a token of the tokenizer {assets!r}; "
                "name one of its special tokens"
            )
    elif bos is None and eos is None:
        raise ConfigError(
            f"the tokenizer {assets!r} has no BOS or EOS token, so documents would be packed "
            "with nothing between them; add a tokenizer_config.json naming its eos_token, or "
            "pass --separator TOKEN"
        )
    vocab = max(tokenizer.get_vocab_size(), *(i + 1 for i in (bos, eos, separator_id) if i))
    return {
        "assets": assets,
        "fingerprint": tokenizer_fingerprint(tokenizer_files(assets)),
        "vocab_size": vocab,
        "bos_id": bos,
        "eos_id": eos,
        "separator_id": separator_id,
    }


def make_plan(
    inputs: list[str],
    assets: str,
    chunk_mb: float = CHUNK_MB,
    held_out_percent: float = HELD_OUT_PERCENT,
    separator: str | None = None,
    out: str | None = None,
    reading: Reading = UTF8_TEXT,
    skipped: list[Path] | None = None,
) -> dict[str, Any]:
    """Everything that determines the folder's bytes, with its chunk list (files under the
    output folder `out` are no input; prepared folders met in the inputs are added to
    `skipped`)."""
    if not 0 <= held_out_percent < 100:
        raise ConfigError(f"--held-out-percent {held_out_percent} must be in [0, 100)")
    if chunk_mb <= 0:
        raise ConfigError(f"--shard-mb {chunk_mb} must be positive")
    if reading.max_document_mb <= 0:
        raise ConfigError(f"--max-document-mb {reading.max_document_mb} must be positive")
    files = expand_inputs(inputs, skipped)
    if out is not None:
        folder = Path(out).expanduser().resolve()
        files = [f for f in files if folder not in f.parents]
        if not files:
            raise ConfigError(f"the inputs hold no file outside --out {out}; name the corpus")
    chunk_bytes = max(1, int(chunk_mb * (1 << 20)))
    try:
        tokenizer = tokenizer_entry(assets, separator)
    except ConfigError as e:  # name this command's option
        raise ConfigError(str(e).replace("model.hf_assets_path", "--tokenizer", 1)) from None
    return {
        "format": FORMAT,
        "version": VERSION,
        "dtype": token_dtype(tokenizer["vocab_size"]),
        "tokenizer": tokenizer,
        "sources": [{"path": str(f), "bytes": f.stat().st_size} for f in files],
        "chunk_bytes": chunk_bytes,
        "held_out_percent": held_out_percent,
        "text_keys": list(reading.text_keys),
        "encoding": reading.encoding,
        "max_document_mb": reading.max_document_mb,
        "chunks": [[c.path, c.start, c.end] for c in plan_chunks(files, chunk_bytes, reading)],
    }


def _write(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary name and a rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _dumps(value: Any) -> bytes:
    return (json.dumps(value, indent=1) + "\n").encode()


_TOKENIZERS: dict[str, Any] = {}


def _tokenizer(plan: dict[str, Any]) -> Any:
    """The plan's tokenizer, loaded once per process (workers inherit the parent's)."""
    assets = plan["tokenizer"]["assets"]
    if assets not in _TOKENIZERS:
        _TOKENIZERS[assets] = load_tokenizer(assets)
    return _TOKENIZERS[assets]


def _reading(plan: dict[str, Any]) -> Reading:
    return Reading(tuple(plan["text_keys"]), plan["encoding"], plan["max_document_mb"])


def _append(f: IO[bytes], tokens: array.array, vocab_size: int, dtype: np.dtype) -> None:
    """Append `tokens` (uint32) to the shard file `f` in `dtype`; ConfigError for an id past
    the vocabulary."""
    ids = np.frombuffer(tokens, dtype=np.uint32) if tokens else np.empty(0, np.uint32)
    if ids.size and int(ids.max()) >= vocab_size:
        raise ConfigError(f"the tokenizer gave id {int(ids.max())} past its vocabulary")
    f.write(ids.astype(dtype).tobytes())


def _tokenize(
    f: IO[bytes], index: int, plan: dict[str, Any]
) -> tuple[dict[str, int], array.array, list[bytes]]:
    """Append chunk `index`'s tokens to the shard file `f`; (counts, document ends,
    held-out lines)."""
    entry = plan["tokenizer"]
    tokenizer = _tokenizer(plan)
    separator = entry["separator_id"]
    dtype = TOKEN_DTYPES[plan["dtype"]]
    counts = dict.fromkeys(COUNTS, 0)
    batch = array.array("I")  # 4 bytes on every platform numpy and torch run on
    ends = array.array("Q")
    kept: list[bytes] = []
    for text in records(Chunk(*plan["chunks"][index]), _reading(plan)):
        if text is None:
            counts["skipped_records"] += 1
            continue
        text, replaced = replace_lone_surrogates(text)
        counts["lone_surrogates"] += replaced
        if held_out(text, plan["held_out_percent"]):
            kept.append(json.dumps({"text": text}).encode() + b"\n")
            continue
        document = tokenizer.encode(text, add_bos=True, add_eos=True)
        batch.extend(document + ([] if separator is None else [separator]))
        counts["tokens"] += len(document) + (separator is not None)
        ends.append(counts["tokens"])
        if len(batch) >= FLUSH_TOKENS:
            _append(f, batch, entry["vocab_size"], dtype)
            batch = array.array("I")
    _append(f, batch, entry["vocab_size"], dtype)
    return counts, ends, kept


def write_shard(out: Path, index: int, plan: dict[str, Any]) -> dict[str, int]:
    """Tokenize chunk `index` of `plan` into shard `index` under `out`; its counts."""
    name = shard_name(index)
    tmp = out / f".{name}.bin.tmp"
    with open(tmp, "wb") as f:
        counts, ends, kept = _tokenize(f, index, plan)
    os.replace(tmp, out / f"{name}.bin")
    _write(out / f"{name}.idx", np.asarray(ends, dtype="<u8").tobytes())
    if kept:
        (out / HELD_OUT).mkdir(exist_ok=True)
        _write(out / HELD_OUT / f"{name}.jsonl", b"".join(kept))
    counts |= {"documents": len(ends), "held_out_documents": len(kept)}
    _write(out / f"{name}.json", _dumps(counts))
    return counts


def _open_folder(out: Path, plan: dict[str, Any]) -> bool:
    """Create `out` or check it holds this plan; True when it is already complete."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder; give a new folder")
    saved = None
    for name in (MANIFEST, PLAN):
        if (out / name).is_file():
            saved = json.loads((out / name).read_text())
            break
    if saved is not None:
        fixed = [k for k in plan if k not in ADJUSTABLE]
        if any(saved.get(k) != plan[k] for k in fixed):
            raise ConfigError(
                f"--out {out} holds a preparation of other inputs or settings; give a new "
                "folder, or remove that one"
            )
        return (out / MANIFEST).is_file()
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {out} is not empty and holds no preparation; give a new folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(
            f"--out {out}: a folder on its path is a file; give a new folder"
        ) from None
    _write(out / PLAN, _dumps(plan))
    return False


def _in_flight(out: Path) -> list[Path]:
    """The temporary files a stopped preparation left under `out`."""
    return [*out.glob(".shard-*.tmp"), *out.glob(f"{HELD_OUT}/.shard-*.tmp")]


def _input_of(plan: dict[str, Any], index: int) -> str:
    """Chunk `index`'s input, in words: 'shard 3 (/data/a.jsonl, bytes 0-16777216)'."""
    path, start, end = plan["chunks"][index]
    part = f"row group {start}" if path.endswith(".parquet") else f"bytes {start}-{end}"
    return f"shard {index} ({path}, {part})"


def batches(plan: dict[str, Any], todo: list[int]) -> list[list[int]]:
    """`todo` in runs of consecutive chunks sent to a worker together: up to BATCH chunks
    and one shard's bytes (a parquet row group counts as a whole shard), so tiny files go
    many to a message and shard-sized chunks one."""
    runs: list[list[int]] = []
    size = 0
    for i in todo:
        path, start, end = plan["chunks"][i]
        cost = plan["chunk_bytes"] if path.endswith(".parquet") else end - start
        if not runs or size + cost > plan["chunk_bytes"] or len(runs[-1]) >= BATCH:
            runs.append([])
            size = 0
        runs[-1].append(i)
        size += cost
    return runs


def run_chunks(
    out: Path, plan: dict[str, Any], todo: list[int], workers: int
) -> Iterator[tuple[int, dict[str, int]]]:
    """(index, counts) of each chunk in `todo` as it completes: in this process for one
    worker, else on `workers` forked processes that inherit the plan and receive only chunk
    numbers, small chunks many at once (`batches`: a task costs the same at any file
    count). A worker's death is a `Stopped` naming its input; the finished shards stay for
    a rerun."""
    if workers <= 1:
        yield from ((i, write_shard(out, i, plan)) for i in todo)
        return
    _tokenizer(plan)  # loaded before the fork, not once per worker
    try:
        yield from run_tasks(lambda i: write_shard(out, i, plan), batches(plan, todo), workers)
    except WorkerDied as e:
        for path in _in_flight(out):
            path.unlink(missing_ok=True)
        hint = " (the out-of-memory killer sends it: lower --workers)" if e.killed else ""
        raise Stopped(
            f"a worker preparing {_input_of(plan, e.index)} {e.how}{hint}; the finished "
            "shards are kept: rerun the same command to resume"
        ) from None


def pending(plan: dict[str, Any], out: str) -> list[int] | None:
    """Open the folder `out` for `plan` (see `_open_folder`); the chunks still to write,
    None when the folder is complete."""
    folder = Path(out).expanduser()
    try:
        if _open_folder(folder, plan):
            return None
    except OSError as e:
        raise stopped_on_disk_full(e, out) or e from None
    return [
        i for i in range(len(plan["chunks"])) if not (folder / f"{shard_name(i)}.json").is_file()
    ]


def _no_tokens(plan: dict[str, Any], totals: dict[str, int]) -> str:
    """Why a preparation holds no training token, and the fix (one line)."""
    if totals["held_out_documents"]:
        return (
            f"every one of the {totals['held_out_documents']} documents was held out "
            f"(--held-out-percent {plan['held_out_percent']:g}); add documents or lower "
            "--held-out-percent"
        )
    reading = _reading(plan)
    if not totals["skipped_records"]:
        return "the inputs hold no text (every file is blank); name the corpus files"
    keys = first_record_keys([Chunk(*c) for c in plan["chunks"]], reading)
    if keys and set(keys) & set(reading.text_keys):
        return (
            f"the text of each of the inputs' {totals['skipped_records']:,} records is empty "
            "or whitespace; give documents text"
        )
    found = f"; the first record's keys: {', '.join(keys)}" if keys else ""
    return (
        f"none of the inputs' {totals['skipped_records']:,} records has text under "
        f"{reading.keys_named}{found}; pass --text-key with the key that holds the text"
    )


def finish(plan: dict[str, Any], out: str) -> dict[str, Any]:
    """Write (or read) the manifest of a folder whose shards are all complete; ConfigError
    when they hold no training token."""
    folder = Path(out).expanduser()
    if (folder / MANIFEST).is_file():
        return json.loads((folder / MANIFEST).read_text())
    shards = []
    for i in range(len(plan["chunks"])):
        counts = json.loads((folder / f"{shard_name(i)}.json").read_text())
        shards.append({"name": shard_name(i), **counts})
    totals = {k: sum(s[k] for s in shards) for k in COUNTS}
    if not totals["tokens"]:
        raise ConfigError(f"--out {out} would hold no tokens: {_no_tokens(plan, totals)}")
    manifest = {**plan, "shards": shards, **totals}
    _write(folder / MANIFEST, _dumps(manifest))
    (folder / PLAN).unlink()
    return manifest


def discard(plan: dict[str, Any], out: str) -> None:
    """Remove every file a preparation of `plan` writes under `out`, then the folders
    left empty (nothing else: the folder was empty or this plan's when it was opened)."""
    folder = Path(out).expanduser()
    names = [PLAN, MANIFEST]
    for i in range(len(plan["chunks"])):
        shard = shard_name(i)
        names += [f"{shard}.{kind}" for kind in ("bin", "idx", "json")]
        names.append(f"{HELD_OUT}/{shard}.jsonl")
    for name in names:
        path = folder / name
        path.unlink(missing_ok=True)
        path.with_name(f".{path.name}.tmp").unlink(missing_ok=True)
    for empty in (folder / HELD_OUT, folder):
        if empty.is_dir() and not any(empty.iterdir()):
            empty.rmdir()


@contextmanager
def discarded_on_error(plan: dict[str, Any], out: str) -> Iterator[None]:
    """Run the body; on a ConfigError remove what the preparation wrote (`discard`), as
    rerunning the same inputs would fail again. A full disk is a `Stopped`; it, a worker's
    death and an interrupt keep the finished shards to resume."""
    try:
        yield
    except ConfigError:
        discard(plan, out)
        raise
    except OSError as e:
        stopped = stopped_on_disk_full(e, out)
        if stopped is None:
            raise
        for path in _in_flight(Path(out).expanduser()):
            path.unlink(missing_ok=True)
        raise stopped from None


def prepare(plan: dict[str, Any], out: str, workers: int = 1) -> dict[str, Any]:
    """Write the prepared folder `out` for `plan`, resuming a partial one; its manifest."""
    todo = pending(plan, out)
    with discarded_on_error(plan, out):
        if todo:
            for _ in run_chunks(Path(out).expanduser(), plan, todo, workers):
                pass
        return finish(plan, out)
