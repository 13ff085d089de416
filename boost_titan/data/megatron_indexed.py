"""Megatron-LM indexed datasets (`PREFIX.bin` + `PREFIX.idx`) read as prepared data.

`training.dataset_path` (or a `[boost] data_mix` source) names either a folder without
`manifest.json` that holds one or more pairs, or (not a folder) a prefix (`DIR/name` for
`DIR/name.bin` and `DIR/name.idx`, as Megatron's `--data-path` does). A folder's pairs:
every `*.idx` directly in it (not in subfolders), in name order, each with its `.bin`; a
`.bin` without its `.idx` is refused.
The pairs' sequences, in order, are one token stream cut into windows of seq_len + 1
tokens, exactly as a prepared folder's shards are (`PreparedDataset`, whose reading this
class inherits: each `.bin` is one shard).

The layout, checked against Megatron-LM's `megatron/core/datasets/indexed_dataset.py`
(NVIDIA/Megatron-LM at 00caa53, `_IndexWriter.__enter__` and `write`, `_IndexReader.__init__`,
`IndexedDatasetBuilder.__init__`/`add_document`/`end_document`, `DType`):
the `.idx` is the 9 bytes `MMIDIDX\\x00\\x00`, the version (little-endian uint64, 1), the
token dtype code (uint8: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32,
8 uint16), the sequence count n and the document-index count d (uint64 each; 34 bytes in
all), then n int32 sequence lengths (tokens), n int64 sequence pointers (byte offsets into
the `.bin`, written as the running sum of length x itemsize from 0), and d int64 document
indices (the builder starts them at [0] and appends the sequence count after each
document: d - 1 documents). A multimodal index adds n int8 sequence modes; it is refused.

What is checked, each failure one ConfigError line: the files are regular files, not
symlinks (only the named `.bin`/`.idx` are opened); the `.idx` is within
`config.files.MEGATRON_INDEX_MAX_BYTES` and exactly as long as its counts say (so no count
allocates anything: the arrays are memory-mapped and read in blocks); magic, version and an
integer dtype code; lengths >= 0; pointers exactly the running sum of the lengths, so
monotone and inside the `.bin`, whose size they must add up to; document indices
nondecreasing from 0 to n. Token ids are checked as a prepared shard's are (`check_ids`,
every shard the loader opens, and `check`'s first `ID_SCAN_BYTES`), against the vocabulary
of `model.hf_assets_path` (and the model's, where known): 0 <= id < vocabulary. Not
checked, because the files do not say: which tokenizer made the ids (Megatron names none),
so a corpus tokenized with another tokenizer of at least the same size trains unnoticed.
"""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path
from typing import Any

import numpy as np

from boost_titan.config.errors import ConfigError
from boost_titan.config.files import MEGATRON_INDEX_MAX_BYTES, regular_size
from boost_titan.data.prepared import ID_BLOCK, MANIFEST, OpenShards, PreparedDataset, Shard

MAGIC = b"MMIDIDX\x00\x00"
HEADER = struct.Struct("<9sQBQQ")
"""Magic, version, dtype code, sequence count, document-index count (34 bytes)."""
DTYPES = {
    1: np.dtype("u1"),
    2: np.dtype("i1"),
    3: np.dtype("<i2"),
    4: np.dtype("<i4"),
    5: np.dtype("<i8"),
    8: np.dtype("<u2"),
}
"""Megatron's integer dtype codes (6 float64 and 7 float32 hold no token ids)."""
FLOAT_CODES = {6: "float64", 7: "float32"}
INDEX_BLOCK = 1 << 20
"""Index entries checked at a time (a few 8 MiB arrays)."""
REDO = "write the dataset again with Megatron-LM's tools/preprocess_data.py"


def is_megatron(path: str | None) -> bool:
    """Whether `path` names a Megatron dataset: a folder without a prepared manifest
    holding an `.idx` file, or (not a folder) a prefix whose `.idx` exists."""
    if not path:
        return False
    where = Path(path).expanduser()
    if not where.is_dir():
        return os.path.lexists(f"{where}.idx")
    if os.path.lexists(where / MANIFEST):
        return False
    with os.scandir(where) as entries:
        return any(e.name.endswith(".idx") for e in entries)


def find_pairs(path: str, field: str) -> list[tuple[Path, Path]]:
    """The (`.idx`, `.bin`) pairs `path` names (see the module doc), none a symlink."""
    where = Path(path).expanduser()
    if not where.is_dir():
        prefixes = [where]
    else:
        with os.scandir(where) as entries:
            names = sorted(e.name for e in entries)
        stems = {n[: -len(".idx")] for n in names if n.endswith(".idx")}
        lone = [n for n in names if n.endswith(".bin") and n[: -len(".bin")] not in stems]
        if lone:
            raise ConfigError(
                f"{field} {path}: {lone[0][:80]} has no {lone[0][:-4][:80]}.idx beside it; a "
                "Megatron dataset is .bin/.idx pairs (move other files out of the folder)"
            )
        prefixes = [where / stem for stem in sorted(stems)]
    pairs = []
    for prefix in prefixes:
        pair = (Path(f"{prefix}.idx"), Path(f"{prefix}.bin"))
        for file in pair:
            if file.is_symlink():
                raise ConfigError(
                    f"{field} {path}: {file.name[:80]} is a symlink; a Megatron dataset "
                    "holds its own files (copy the file in)"
                )
        pairs.append(pair)
    return pairs


def _read_header(index: Path, what: str) -> tuple[np.dtype, int, int]:
    """(token dtype, sequence count, document-index count) of `index`, after checking its
    size against them (one ConfigError line for anything else)."""
    size = regular_size(index, what, MEGATRON_INDEX_MAX_BYTES)
    try:
        fd = os.open(index, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ConfigError(f"{what} is not a regular file; give a file")
            head = f.read(HEADER.size)
    except OSError as e:
        raise ConfigError(f"{what} cannot be read ({e.strerror})") from None
    if len(head) < HEADER.size or not head.startswith(MAGIC):
        raise ConfigError(
            f"{what} is not a Megatron-LM index (no {MAGIC!r} header of {HEADER.size} bytes); "
            f"a folder python -m boost_titan.prepare left without {MANIFEST} is unfinished"
        )
    _, version, code, sequences, documents = HEADER.unpack(head)
    if version != 1:
        raise ConfigError(f"{what} has version {version}, not 1; {REDO}")
    if code in FLOAT_CODES:
        raise ConfigError(f"{what} holds {FLOAT_CODES[code]} values, not token ids")
    if code not in DTYPES:
        raise ConfigError(
            f"{what} has dtype code {code}, not one of Megatron's integer codes "
            f"{', '.join(map(str, DTYPES))}; {REDO}"
        )
    _check_size(what, size, sequences, documents)
    return DTYPES[code], sequences, documents


def _check_size(what: str, size: int, sequences: int, documents: int) -> None:
    """ConfigError unless an index of `size` bytes is exactly what its header's counts
    need, with at least one document index: the arrays are mapped only after this."""
    want = HEADER.size + 12 * sequences + 8 * documents
    if size != want:
        multimodal = size == want + sequences
        raise ConfigError(
            f"{what} is {size:,} bytes but its header's {sequences:,} sequences and "
            f"{documents:,} document indices need {want:,}"
            + ("; multimodal datasets (sequence modes) are not read" if multimodal else f"; {REDO}")
        )
    if documents < 1:
        raise ConfigError(f"{what} has no document indices (Megatron writes at least [0])")


def _check_arrays(index: Path, what: str, dtype: np.dtype, n: int, d: int, data: int) -> int:
    """Check the lengths, pointers and document indices of `index` (see the module doc)
    against a `.bin` of `data` bytes, in blocks of INDEX_BLOCK; the token count."""
    lengths = np.memmap(index, "<i4", "r", HEADER.size, (n,)) if n else np.empty(0, "<i4")
    pointers = np.memmap(index, "<i8", "r", HEADER.size + 4 * n, (n,)) if n else lengths
    ends = np.memmap(index, "<i8", "r", HEADER.size + 12 * n, (d,))
    total = 0
    for start in range(0, n, INDEX_BLOCK):
        block = lengths[start : start + INDEX_BLOCK].astype(np.int64)
        if int(block.min()) < 0:
            raise ConfigError(f"{what} has a negative sequence length; {REDO}")
        steps = np.cumsum(block * dtype.itemsize)
        want = total + np.concatenate(([0], steps[:-1]))
        bad = np.flatnonzero(pointers[start : start + INDEX_BLOCK] != want)
        if bad.size:
            i = start + int(bad[0])
            raise ConfigError(
                f"{what}: sequence {i}'s pointer is {int(pointers[i]):,}, not {int(want[bad[0]]):,}"
                f" (the sum of the lengths before it x {dtype.itemsize} bytes); {REDO}"
            )
        total += int(steps[-1])
        if total > data:
            raise ConfigError(
                f"{what}: the sequences reach byte {total:,}, past the end of the "
                f"{data:,}-byte .bin; {REDO}"
            )
    if total != data:
        raise ConfigError(
            f"{what}: the sequences cover {total:,} bytes but the .bin has {data:,}; {REDO}"
        )
    last = 0
    for start in range(0, d, INDEX_BLOCK):
        block = ends[start : start + INDEX_BLOCK]
        steps = np.diff(block, prepend=last)
        if (start == 0 and int(block[0]) != 0) or int(steps.min()) < 0:
            raise ConfigError(f"{what}: document indices do not rise from 0; {REDO}")
        last = int(block[-1])
    if last != n:
        raise ConfigError(f"{what}: the last document index is {last:,}, not {n:,}; {REDO}")
    return total // dtype.itemsize


class MegatronDataset(PreparedDataset):
    """A Megatron dataset's token stream (see the module doc); `vocab_size` bounds its
    token ids (`check_tokenizer` lowers it to the model's)."""

    def __init__(
        self,
        path: str,
        field: str = "training.dataset_path",
        vocab_size: int | None = None,
        eos_id: int | None = None,
        files: OpenShards | None = None,
    ) -> None:
        """`eos_id`: the tokenizer's, which ends the documents (Megatron's EOD) for
        `[boost]`'s document options; `files`: as `PreparedDataset`'s."""
        self.folder = Path(path).expanduser()
        self.field = field
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.shards, dtypes = [], set()
        for index, data in find_pairs(path, field):
            what = f"{field} {path}: {index.name}"
            dtype, sequences, documents = _read_header(index, what)
            size = regular_size(data, f"{field} {path}: {data.name}", 1 << 62)
            tokens = _check_arrays(index, what, dtype, sequences, documents, size)
            if tokens:
                self.shards.append(Shard(data, tokens, documents - 1))
            dtypes.add(dtype)
        if len(dtypes) > 1:
            raise ConfigError(
                f"{field} {path}: its .idx files name different dtypes "
                f"({', '.join(sorted(t.name for t in dtypes))}); write them with one"
            )
        self.dtype = dtypes.pop()
        self.starts = np.cumsum([0] + [s.tokens for s in self.shards]).tolist()
        self.files = OpenShards() if files is None else files

    @property
    def tokenizer(self) -> dict[str, Any]:
        """What `PreparedDataset.tokenizer` says of the ids, as far as they are known."""
        return {"vocab_size": self.vocab_size, "eos_id": self.eos_id, "separator_id": None}

    def check_tokenizer(
        self, fingerprint: str, assets: str, tokenizer_vocab: int, vocab: int | None
    ) -> None:
        """Token ids must lie below the tokenizer's vocabulary and the model's `vocab`
        (None: unknown); the tokenizer itself cannot be checked (module doc)."""
        self.vocab_size = min(tokenizer_vocab, vocab or tokenizer_vocab)

    def check_ids(self, index: int) -> None:
        """ConfigError when shard `index` holds an id outside 0 .. vocab_size - 1, read in
        blocks of ID_BLOCK tokens."""
        shard = self.shards[index]
        with open(shard.path, "rb") as f:
            for start in range(0, shard.tokens, ID_BLOCK):
                self.check_block(
                    shard, np.fromfile(f, self.dtype, min(ID_BLOCK, shard.tokens - start))
                )

    def check_block(self, shard: Shard, block: np.ndarray) -> None:
        """ConfigError when `block`, tokens of `shard`, holds an id outside 0 .. vocab_size
        - 1 (Megatron's dtypes are signed too); RuntimeError before the vocabulary is known."""
        if self.vocab_size is None:
            raise RuntimeError("a Megatron dataset is read before its vocabulary is known")
        vocab = self.vocab_size
        low, high = (int(block.min()), int(block.max())) if block.size else (0, 0)
        if low < 0 or high >= vocab:
            raise ConfigError(
                f"{self.field} {self.folder}: {shard.path.name} holds token id "
                f"{low if low < 0 else high}, outside the vocabulary of {vocab} tokens "
                "(model.hf_assets_path, and the model's); pass the tokenizer the data "
                "was made with"
            )
