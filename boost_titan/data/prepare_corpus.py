"""Tokenize corpus files into a prepared dataset folder (`boost_titan.data.prepared`).

The inputs are cut into chunks that depend on the files alone (`documents.plan_chunks`);
chunk i becomes shard i, written by whichever worker process takes it, so the folder's
bytes do not depend on the worker count. Each shard is written under a temporary name and
renamed, then its `shard-NNNNN.json` (counts) is renamed into place: a shard with its JSON
is complete. The plan (tokenizer, sources, chunks) is saved first as `plan.json`; a rerun
of the same command into the same folder skips the complete shards, so an interrupted run
finishes where it stopped, with the same bytes. `manifest.json` is written last.
"""

from __future__ import annotations

import array
import hashlib
import json
import multiprocessing
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from boost_titan.config.errors import ConfigError
from boost_titan.data.corpus import HELD_OUT_PERCENT
from boost_titan.data.documents import Chunk, documents, expand_inputs, plan_chunks
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

PLAN = "plan.json"
CHUNK_MB = 16.0
"""Default input megabytes per shard (a shard is one unit of work)."""


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
) -> dict[str, Any]:
    """Everything that determines the folder's bytes, with its chunk list (files under the
    output folder `out` are no input)."""
    if not 0 <= held_out_percent < 100:
        raise ConfigError(f"--held-out-percent {held_out_percent} must be in [0, 100)")
    if chunk_mb <= 0:
        raise ConfigError(f"--shard-mb {chunk_mb} must be positive")
    files = expand_inputs(inputs)
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
        "chunks": [[c.path, c.start, c.end] for c in plan_chunks(files, chunk_bytes)],
    }


def _write(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary name and a rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _dumps(value: Any) -> bytes:
    return (json.dumps(value, indent=1) + "\n").encode()


_TOKENIZERS: dict[str, Any] = {}


def write_shard(out: Path, index: int, plan: dict[str, Any]) -> dict[str, int]:
    """Tokenize chunk `index` of `plan` into shard `index` under `out`; its counts."""
    entry = plan["tokenizer"]
    if entry["assets"] not in _TOKENIZERS:
        _TOKENIZERS[entry["assets"]] = load_tokenizer(entry["assets"])
    tokenizer = _TOKENIZERS[entry["assets"]]
    separator = entry["separator_id"]
    tokens = array.array("I")  # 4 bytes on every platform numpy and torch run on
    ends = array.array("Q")
    kept: list[bytes] = []
    for text in documents(Chunk(*plan["chunks"][index])):
        if held_out(text, plan["held_out_percent"]):
            kept.append(json.dumps({"text": text}).encode() + b"\n")
            continue
        tokens.extend(tokenizer.encode(text, add_bos=True, add_eos=True))
        if separator is not None:
            tokens.append(separator)
        ends.append(len(tokens))
    name = shard_name(index)
    ids = np.frombuffer(tokens, dtype=np.uint32) if tokens else np.empty(0, np.uint32)
    if ids.size and int(ids.max()) >= entry["vocab_size"]:
        raise ConfigError(f"the tokenizer gave id {int(ids.max())} past its vocabulary")
    _write(out / f"{name}.bin", ids.astype(TOKEN_DTYPES[plan["dtype"]]).tobytes())
    _write(out / f"{name}.idx", np.asarray(ends, dtype="<u8").tobytes())
    if kept:
        (out / HELD_OUT).mkdir(exist_ok=True)
        _write(out / HELD_OUT / f"{name}.jsonl", b"".join(kept))
    counts = {"tokens": len(tokens), "documents": len(ends), "held_out_documents": len(kept)}
    _write(out / f"{name}.json", _dumps(counts))
    return counts


def _open_folder(out: Path, plan: dict[str, Any]) -> bool:
    """Create `out` or check it holds this plan; True when it is already complete."""
    saved = None
    for name in (MANIFEST, PLAN):
        if (out / name).is_file():
            saved = json.loads((out / name).read_text())
            break
    if saved is not None:
        if {k: saved.get(k) for k in plan} != plan:
            raise ConfigError(
                f"--out {out} holds a preparation of other inputs or settings; give a new "
                "folder, or remove that one"
            )
        return (out / MANIFEST).is_file()
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {out} is not empty and holds no preparation; give a new folder")
    out.mkdir(parents=True, exist_ok=True)
    _write(out / PLAN, _dumps(plan))
    return False


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the pool


def _work(task: tuple[Path, int, dict[str, Any]]) -> tuple[int, dict[str, int]]:
    out, index, plan = task
    return index, write_shard(out, index, plan)


def run_chunks(
    out: Path, plan: dict[str, Any], todo: list[int], workers: int
) -> Iterator[tuple[int, dict[str, int]]]:
    """(index, counts) of each chunk in `todo` as it completes: in this process for one
    worker, else in a pool of `workers` processes."""
    tasks = [(out, i, plan) for i in todo]
    if workers <= 1:
        yield from map(_work, tasks)
        return
    pool = multiprocessing.get_context("fork").Pool(workers, initializer=_ignore_sigint)
    try:
        yield from pool.imap_unordered(_work, tasks)
        pool.close()
    finally:
        pool.terminate()
        pool.join()


def pending(plan: dict[str, Any], out: str) -> list[int] | None:
    """Open the folder `out` for `plan` (see `_open_folder`); the chunks still to write,
    None when the folder is complete."""
    folder = Path(out).expanduser()
    if _open_folder(folder, plan):
        return None
    return [
        i for i in range(len(plan["chunks"])) if not (folder / f"{shard_name(i)}.json").is_file()
    ]


def finish(plan: dict[str, Any], out: str) -> dict[str, Any]:
    """Write (or read) the manifest of a folder whose shards are all complete."""
    folder = Path(out).expanduser()
    if (folder / MANIFEST).is_file():
        return json.loads((folder / MANIFEST).read_text())
    shards = []
    for i in range(len(plan["chunks"])):
        counts = json.loads((folder / f"{shard_name(i)}.json").read_text())
        shards.append({"name": shard_name(i), **counts})
    totals = {k: sum(s[k] for s in shards) for k in ("tokens", "documents", "held_out_documents")}
    manifest = {**plan, "shards": shards, **totals}
    _write(folder / MANIFEST, _dumps(manifest))
    (folder / PLAN).unlink()
    return manifest


def prepare(plan: dict[str, Any], out: str, workers: int = 1) -> dict[str, Any]:
    """Write the prepared folder `out` for `plan`, resuming a partial one; its manifest."""
    todo = pending(plan, out)
    if todo:
        for _ in run_chunks(Path(out).expanduser(), plan, todo, workers):
            pass
    return finish(plan, out)
