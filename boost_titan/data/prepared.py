"""A prepared dataset: a folder of token shards read by memory map.

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
TorchTitan's text dataset packs documents; any window is read without reading the others.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from boost_titan.config.errors import ConfigError

MANIFEST = "manifest.json"
FORMAT = "boost-titan-prepared"
VERSION = 1
HELD_OUT = "held_out"
TOKEN_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


def is_prepared(path: str | None) -> bool:
    """Whether `path` is a prepared dataset folder (holds a manifest)."""
    return bool(path) and (Path(path).expanduser() / MANIFEST).is_file()


def token_dtype(vocab_size: int) -> str:
    """The narrowest shard dtype holding ids below `vocab_size`."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def tokenizer_fingerprint(files: list[Path]) -> str:
    """SHA-256 over the tokenizer's files (names and bytes), in the order given."""
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class Shard:
    path: Path
    tokens: int
    documents: int


class PreparedDataset:
    """A prepared folder's manifest and token stream (see the module doc)."""

    def __init__(self, folder: str, field: str = "training.dataset_path") -> None:
        self.folder = Path(folder).expanduser()
        self.field = field
        try:
            self.manifest: dict[str, Any] = json.loads((self.folder / MANIFEST).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"{field} {folder}: cannot read {MANIFEST} ({e}); prepare the folder again "
                "with python -m boost_titan.prepare"
            ) from None
        if self.manifest.get("format") != FORMAT or self.manifest.get("version") != VERSION:
            raise ConfigError(
                f"{field} {folder}: {MANIFEST} is not a {FORMAT} v{VERSION} manifest; prepare "
                "the folder again with this version's python -m boost_titan.prepare"
            )
        self.dtype = TOKEN_DTYPES[self.manifest["dtype"]]
        self.shards = [
            Shard(self.folder / f"{s['name']}.bin", s["tokens"], s["documents"])
            for s in self.manifest["shards"]
            if s["tokens"]
        ]
        self.starts = np.cumsum([0] + [s.tokens for s in self.shards]).tolist()
        self._maps: dict[int, np.memmap] = {}

    @property
    def tokens(self) -> int:
        return self.starts[-1]

    @property
    def tokenizer(self) -> dict[str, Any]:
        return self.manifest["tokenizer"]

    def check_shards(self) -> None:
        """ConfigError naming the first shard whose file is missing or not its size."""
        for shard in self.shards:
            want = shard.tokens * self.dtype.itemsize
            size = shard.path.stat().st_size if shard.path.is_file() else None
            if size != want:
                found = "missing" if size is None else f"{size} bytes"
                raise ConfigError(
                    f"{self.field} {self.folder}: {shard.path.name} is {found}, the manifest "
                    f"says {want} bytes ({shard.tokens} tokens); rerun python -m "
                    "boost_titan.prepare into a new folder"
                )

    def check_tokenizer(self, fingerprint: str, assets: str, vocab: int | None) -> None:
        """ConfigError when the shards were made by another tokenizer than `assets`, or hold
        ids the model's vocabulary `vocab` (None: unknown) has no row for."""
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

    def windows(self, width: int) -> int:
        """Windows of `width` tokens in one pass over the stream."""
        return self.tokens // width

    def _map(self, index: int) -> np.memmap:
        if index not in self._maps:
            shard = self.shards[index]
            self._maps[index] = np.memmap(shard.path, self.dtype, "r", shape=(shard.tokens,))
        return self._maps[index]

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) of the stream, as int64."""
        out = np.empty(length, dtype=np.int64)
        filled = 0
        index = bisect.bisect_right(self.starts, start) - 1
        while filled < length:
            offset = start + filled - self.starts[index]
            take = min(length - filled, self.shards[index].tokens - offset)
            out[filled : filled + take] = self._map(index)[offset : offset + take]
            filled += take
            index += 1
        return out

    @cached_property
    def held_out_folder(self) -> Path | None:
        """The folder of held-out documents, None when none was held out."""
        return self.folder / HELD_OUT if self.manifest.get("held_out_documents") else None
