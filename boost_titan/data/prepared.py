"""A prepared dataset: a folder of token shards, read window by window.

Written by `python -m boost_titan.prepare` (`boost_titan.data.prepare_corpus`):

- `manifest.json`: format and version, the tokenizer (its `model.hf_assets_path`,
  fingerprint, vocabulary size, BOS/EOS/separator ids), the sources, and per shard its
  token and document counts; written last, so a folder without it is unfinished;
- `shard-NNNNN.bin`: the tokens of one input chunk's documents, each document framed by
  BOS (where the tokenizer has one) and EOS (or the separator), little-endian uint16 where
  the vocabulary fits, else uint32;
- `shard-NNNNN.idx`: the document index, each document's end offset in the shard (uint64);
- `held_out/shard-NNNNN.jsonl`: the documents held out for validation (chosen by a hash of
  their text, as `boost_titan.data.corpus` does for the default corpus), as JSON lines that
  `--validation.dataset_path` reads.

Training reads the shards' concatenation as one token stream cut into windows of
seq_len + 1 tokens (window k is tokens [k (seq_len + 1), (k + 1) (seq_len + 1))), as
TorchTitan's text dataset packs documents; any window is read without reading the others
(`boost_titan.data.window_order` picks which). A process keeps at most `OPEN_SHARDS`
shard files open whatever the shard count (`OpenShards`, shared by a job's sources).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import stat
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from boost_titan.config.errors import ConfigError
from boost_titan.config.files import MANIFEST_MAX_BYTES, TOKENIZER_MAX_BYTES, inside, read_capped

MANIFEST = "manifest.json"
FORMAT = "boost-titan-prepared"
VERSION = 1
HELD_OUT = "held_out"
TOKEN_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
MAX_SHARD_TOKENS = 1 << 40
"""A shard's token count cap (a shard is one input chunk's tokens)."""
MAX_VOCAB = 1 << 31
"""A prepared vocabulary's cap (ids are read as int64, shards hold uint32 at most)."""
ID_BLOCK = 1 << 24
"""Tokens read at a time when a shard's ids are checked (32 or 64 MiB)."""
OPEN_SHARDS = 64
"""Shard files one process keeps open (`OpenShards`): well under the common soft
RLIMIT_NOFILE (1,024 on Linux, 256 on macOS), whatever the shard count."""


def is_prepared(path: str | None) -> bool:
    """Whether `path` is a prepared dataset folder (holds a manifest, of whatever kind: one
    that is no regular file is refused when read, not taken for raw text)."""
    return bool(path) and os.path.lexists(Path(path).expanduser() / MANIFEST)


def token_dtype(vocab_size: int) -> str:
    """The narrowest shard dtype holding ids below `vocab_size`."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def tokenizer_fingerprint(files: list[Path]) -> str:
    """SHA-256 over the tokenizer's files (names and bytes), in the order given; each a
    regular file within the tokenizer cap (`config.files.TOKENIZER_MAX_BYTES`)."""
    digest = hashlib.sha256()
    for f in files:
        data = read_capped(f, "tokenizer file", TOKENIZER_MAX_BYTES)
        digest.update(f.name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()


def _count(value: object, cap: int) -> bool:
    """An int (not a bool) in [0, cap]."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= cap


def _manifest_problem(manifest: object) -> str | None:
    """What is wrong with a parsed manifest's shape (types, names, counts), None if nothing:
    everything `PreparedDataset` reads is checked here, before it is read."""
    if not isinstance(manifest, dict):
        return f"is a JSON {type(manifest).__name__}, not an object"
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        return f"is not a {FORMAT} v{VERSION} manifest"
    if not isinstance(manifest.get("dtype"), str) or manifest["dtype"] not in TOKEN_DTYPES:
        return f"dtype {str(manifest.get('dtype'))[:40]!r} is not one of {', '.join(TOKEN_DTYPES)}"
    tokenizer = manifest.get("tokenizer")
    if not isinstance(tokenizer, dict):
        return "has no tokenizer object"
    for key in ("assets", "fingerprint"):
        if not isinstance(tokenizer.get(key), str):
            return f"tokenizer {key} is not a string"
    if not (_count(tokenizer.get("vocab_size"), MAX_VOCAB) and tokenizer["vocab_size"]):
        return f"tokenizer vocab_size is not a whole number in 1..{MAX_VOCAB}"
    shards = manifest.get("shards")
    if not isinstance(shards, list):
        return "shards is not a list"
    names = set()
    for i, shard in enumerate(shards):
        if not isinstance(shard, dict) or not isinstance(shard.get("name"), str):
            return f"shard {i} has no name"
        if not (
            _count(shard.get("tokens"), MAX_SHARD_TOKENS)
            and _count(shard.get("documents"), MAX_SHARD_TOKENS)
        ):
            return f"shard {shard['name'][:80]!r} has no whole token and document counts"
        if shard["name"] in names:
            return f"names shard {shard['name'][:80]!r} twice"
        names.add(shard["name"])
    for key in ("held_out_documents", "chunk_bytes"):
        if not _count(manifest.get(key, 0), MAX_SHARD_TOKENS):
            return f"{key} is not a whole number"
    return None


def _parse_json(data: bytes) -> Any:
    """`data` parsed as JSON; nesting too deep for the parser is a ValueError."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deep") from None


def read_manifest(folder: Path, field: str) -> dict[str, Any]:
    """The manifest of the prepared `folder`, its shape checked (`_manifest_problem`);
    ConfigError (one line) for one that is unreadable, too large, too deep or malformed."""
    where = f"{field} {folder}: {MANIFEST}"
    redo = "prepare the folder again with this version's python -m boost_titan.prepare"
    try:
        manifest = _parse_json(read_capped(folder / MANIFEST, MANIFEST, MANIFEST_MAX_BYTES))
    except ConfigError as e:
        raise ConfigError(f"{field}: {e}; {redo}") from None
    except ValueError as e:
        raise ConfigError(f"{where} is not JSON ({str(e)[:200]}); {redo}") from None
    problem = _manifest_problem(manifest)
    if problem is not None:
        raise ConfigError(f"{where} {problem}; {redo}")
    return manifest


HELD_OUT_GROWTH = 8
"""A held-out file is at most this many times its input chunk (`chunk_bytes`) plus 1 MiB:
its documents are a share of the chunk's, JSON-escaped (a control character: 6 bytes)."""


def check_held_out(folder: Path, field: str) -> None:
    """ConfigError when the held-out split of the prepared `folder` reaches outside it (the
    `held_out` folder or a file in it a symlink), holds anything but regular files, or a
    file larger than its input chunk allows (`HELD_OUT_GROWTH`)."""
    held_out = folder / HELD_OUT
    fix = "a prepared folder holds its own files; prepare the folder again"
    if held_out.is_symlink():
        raise ConfigError(f"{field} {folder}: {HELD_OUT} is a symlink; {fix}")
    limit = HELD_OUT_GROWTH * read_manifest(folder, field).get("chunk_bytes", 0) + (1 << 20)
    with os.scandir(held_out) as entries:
        for entry in entries:
            where = f"{field} {folder}: {HELD_OUT}/{entry.name[:80]}"
            if entry.is_symlink() or not entry.is_file(follow_symlinks=False):
                raise ConfigError(f"{where} is a symlink or not a regular file; {fix}")
            if entry.stat(follow_symlinks=False).st_size > limit:
                raise ConfigError(
                    f"{where} is larger than its input chunk allows ({limit:,} bytes); {fix}"
                )


@dataclass(frozen=True)
class Shard:
    path: Path
    tokens: int
    documents: int


class OpenShards:
    """Open shard files, at most `limit`: a file opened past that closes the least recently
    read one. Reading is `os.pread` (no shared offset, no memory map), so a descriptor is
    closed the moment it leaves the cache. A copy sent to another process (a dataloader
    worker) starts empty."""

    def __init__(self, limit: int = OPEN_SHARDS) -> None:
        self.limit = limit
        self._fds: OrderedDict[Path, int] = OrderedDict()

    def fd(self, path: Path) -> int:
        """A descriptor of `path` open for reading, the cache's most recent."""
        fd = self._fds.pop(path, None)
        if fd is None:
            while len(self._fds) >= self.limit:
                os.close(self._fds.popitem(last=False)[1])
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._fds[path] = fd
        return fd

    def close(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])

    def __del__(self) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"limit": self.limit}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["limit"])


class PreparedDataset:
    """A prepared folder's manifest and token stream (see the module doc)."""

    def __init__(
        self, folder: str, field: str = "training.dataset_path", files: OpenShards | None = None
    ) -> None:
        """`files`: the cache of open shards to read through (shared by a job's sources;
        None: one of this dataset's own)."""
        self.folder = Path(folder).expanduser()
        self.field = field
        self.manifest = read_manifest(self.folder, field)
        where = f"{field} {folder}: {MANIFEST}"
        self.dtype = TOKEN_DTYPES[self.manifest["dtype"]]
        self.shards = [
            Shard(
                inside(self.folder, s["name"], ".bin", f"{where} shard"),
                s["tokens"],
                s["documents"],
            )
            for s in self.manifest["shards"]
            if s["tokens"]
        ]
        self.starts = np.cumsum([0] + [s.tokens for s in self.shards]).tolist()
        self.files = OpenShards() if files is None else files

    @property
    def tokens(self) -> int:
        return self.starts[-1]

    @property
    def tokenizer(self) -> dict[str, Any]:
        return self.manifest["tokenizer"]

    def check_shards(self) -> None:
        """ConfigError naming the first shard whose file is missing, not a regular file or
        not its size."""
        for shard in self.shards:
            want = shard.tokens * self.dtype.itemsize
            try:
                info = os.stat(shard.path)
                size = info.st_size if stat.S_ISREG(info.st_mode) else None
            except OSError:
                size = None
            if size != want:
                found = "missing or not a regular file" if size is None else f"{size} bytes"
                raise ConfigError(
                    f"{self.field} {self.folder}: {shard.path.name} is {found}, the manifest "
                    f"says {want} bytes ({shard.tokens} tokens); rerun python -m "
                    "boost_titan.prepare into a new folder"
                )

    def check_tokenizer(
        self, fingerprint: str, assets: str, tokenizer_vocab: int, vocab: int | None
    ) -> None:
        """ConfigError when the shards were made by another tokenizer than `assets` (whose
        vocabulary has `tokenizer_vocab` tokens), or hold ids the model's vocabulary `vocab`
        (None: unknown) has no row for."""
        made_by = self.tokenizer
        if made_by["fingerprint"] != fingerprint:
            raise ConfigError(
                f"{self.field} {self.folder} was prepared with the tokenizer "
                f"{made_by['assets']!r}, not model.hf_assets_path {assets!r} (fingerprints "
                f"differ); pass --model.hf_assets_path {made_by['assets']} or prepare again"
            )
        if vocab is not None and made_by["vocab_size"] > vocab:
            raise ConfigError(
                f"{self.field} {self.folder} holds ids of a {made_by['vocab_size']}-token "
                f"vocabulary but the model has {vocab} rows; use a model vocabulary of at least "
                f"{made_by['vocab_size']} or the tokenizer the model was made for"
            )
        if made_by["vocab_size"] > tokenizer_vocab:
            raise ConfigError(
                f"{self.field} {self.folder}: its manifest says vocab_size "
                f"{made_by['vocab_size']}, but its tokenizer {assets!r} has {tokenizer_vocab} "
                "tokens; prepare the folder again"
            )

    def check_ids(self, index: int) -> None:
        """ConfigError when shard `index` holds an id at or past the manifest's vocab_size
        (which `check_tokenizer` holds to the tokenizer's and the model's): the shard is
        read once, in blocks of ID_BLOCK tokens, max taken by numpy (0.3 s for 200 MB from
        the page cache; nothing to read when the dtype cannot hold such an id). `check`
        runs it; the loader checks each window it reads instead (`check_block`)."""
        shard = self.shards[index]
        if self.tokenizer["vocab_size"] > np.iinfo(self.dtype).max:
            return
        with open(shard.path, "rb") as f:
            for start in range(0, shard.tokens, ID_BLOCK):
                self.check_block(
                    shard, np.fromfile(f, self.dtype, min(ID_BLOCK, shard.tokens - start))
                )

    def check_block(self, shard: Shard, block: np.ndarray) -> None:
        """ConfigError when `block`, tokens of `shard`, holds an id at or past the manifest's
        vocab_size."""
        vocab = self.tokenizer["vocab_size"]
        if block.size and int(block.max()) >= vocab:
            raise ConfigError(
                f"{self.field} {self.folder}: {shard.path.name} holds token id "
                f"{int(block.max())}, past the manifest's vocab_size {vocab}; the "
                "shard is damaged or altered, prepare the folder again"
            )

    def windows(self, width: int) -> int:
        """Windows of `width` tokens in one pass over the stream."""
        return self.tokens // width

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) of the stream, as int64, their ids checked against
        the vocabulary (`check_block`: a max over the window, microseconds)."""
        out = np.empty(length, dtype=np.int64)
        filled = 0
        index = bisect.bisect_right(self.starts, start) - 1
        while filled < length:
            shard = self.shards[index]
            offset = start + filled - self.starts[index]
            take = min(length - filled, shard.tokens - offset)
            size = self.dtype.itemsize
            data = os.pread(self.files.fd(shard.path), take * size, offset * size)
            if len(data) != take * size:
                raise ConfigError(
                    f"{self.field} {self.folder}: {shard.path.name} ends before token "
                    f"{offset + take:,} (the manifest says {shard.tokens:,}): it was cut "
                    "while training read it; prepare the folder again"
                )
            piece = np.frombuffer(data, self.dtype)
            self.check_block(shard, piece)
            out[filled : filled + take] = piece
            filled += take
            index += 1
        return out
