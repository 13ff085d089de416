"""Tokenizers, chosen by `model.hf_assets_path`.

- `""`, `"default"` or torchtitan's default `./tests/assets/tokenizer`: our default, a
  byte-level BPE (vocab 4096 with `<|bos|>`/`<|eos|>`) trained on the stdlib training split and
  cached under `$BOOST_TITAN_CACHE` (default `~/.cache/boost_titan`);
- a directory with `tokenizer.json` (or that file): a Hugging Face tokenizer;
- a tiktoken BPE file (`tokenizer.model` as shipped with Llama-3, `*.tiktoken`) or a
  directory holding one: loaded with tiktoken, Llama-3's split pattern, and
  `<|begin_of_text|>`/`<|end_of_text|>` appended after the ranks. (torchtitan's
  ConfigManager refuses a path ending in `tokenizer.model`: name its directory.)
"""

from __future__ import annotations

import base64
import functools
import hashlib
import itertools
import json
import logging
import os
import platform
import re
import shutil
import tempfile
from pathlib import Path

import tiktoken
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from torchtitan.components.tokenizer import BaseTokenizer, HuggingFaceTokenizer
from torchtitan.config import JobConfig

from boost_titan.config.errors import ConfigError
from boost_titan.config.files import (
    TIKTOKEN_MAX_BYTES,
    TOKENIZER_MAX_BYTES,
    read_capped,
    regular_size,
)
from boost_titan.data.corpus import read_text, split_files, stdlib_root

DEFAULT_TOKENIZER = "default"
DEFAULT_ASSETS = ("", DEFAULT_TOKENIZER, "./tests/assets/tokenizer")
"""`model.hf_assets_path` values meaning our default tokenizer (the last is torchtitan's)."""

DEFAULT_VOCAB_SIZE = 4096
BOS_TOKEN, EOS_TOKEN = "<|bos|>", "<|eos|>"
RECIPE_VERSION = 2
"""Bump when the default tokenizer's training changes: it renames the cache entry."""

_TRAIN_STRIDE = 4
"""The default BPE trains on every 4th file of the corpus's training split in path order
(about 3 MB); it never sees a held-out file."""

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_MAX_RUN = 25_000
_LONG_RUN = re.compile(rf"\s{{{_MAX_RUN},}}|\S{{{_MAX_RUN},}}")
"""tiktoken's regex overflows its backtracking stack on longer runs of (non-)whitespace."""
MAX_RANK = (1 << 31) - 3
"""The largest tiktoken rank taken: BOS and EOS follow the ranks and every id must fit an
int32 (tiktoken's ranks are uint32; validation windows are int32)."""
_HINT = (
    "give a dir with tokenizer.json or a tiktoken tokenizer.model, a *.tiktoken file, or 'default'"
)


# ---- default tokenizer: trained once, cached ----------------------------------------
def cache_dir() -> Path:
    return Path(os.environ.get("BOOST_TITAN_CACHE") or Path.home() / ".cache" / "boost_titan")


def default_tokenizer_dir() -> Path:
    """Cache entry of the default tokenizer: named by a hash of what determines its bytes."""
    recipe = f"python {platform.python_version()}, vocab {DEFAULT_VOCAB_SIZE}, v{RECIPE_VERSION}"
    return cache_dir() / f"tokenizer-{hashlib.sha256(recipe.encode()).hexdigest()[:16]}"


def train_default_tokenizer() -> Tokenizer:
    """Byte-level BPE on a fixed subset of the stdlib sources; same input, same bytes."""
    texts = [read_text(p) for p in split_files(stdlib_root(), held_out=False)[::_TRAIN_STRIDE]]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=DEFAULT_VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[BOS_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tokenizer


def prepare_default_assets() -> Path:
    """Train and cache the default tokenizer unless cached; returns its directory.

    Call once before workers start. Racing callers are safe: each publishes a complete
    directory with one atomic rename, and all of them produce the same bytes.
    """
    target = default_tokenizer_dir()
    if (target / "tokenizer.json").is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-tokenizer-", dir=target.parent))
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
    except OSError as e:
        raise ConfigError(
            f"cannot write the tokenizer cache {target.parent} ({e}); "
            "set BOOST_TITAN_CACHE to a writable directory"
        ) from e
    try:
        train_default_tokenizer().save(str(tmp / "tokenizer.json"))
        config = {
            "bos_token": BOS_TOKEN,
            "eos_token": EOS_TOKEN,
            "add_bos_token": True,
            "add_eos_token": True,
        }
        (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        os.rename(tmp, target)
    except OSError as e:
        if not (target / "tokenizer.json").is_file():  # else another process won the race
            raise ConfigError(
                f"cannot publish the tokenizer to {target} ({e}); remove that directory and retry"
            ) from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# ---- tiktoken -----------------------------------------------------------------------
def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """Parse `<base64 token> <rank>` lines (what tiktoken.load.load_tiktoken_bpe reads,
    without its copy under /tmp keyed by path, which goes stale when the file changes); a
    regular file of at most TIKTOKEN_MAX_BYTES whose ranks pass `rank_problem`."""
    data = read_capped(path, "tiktoken file", TIKTOKEN_MAX_BYTES)
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError:  # includes binascii.Error
            raise ConfigError(
                f"{path} line {number} is not '<base64 token> <rank>'; give a tiktoken BPE "
                "file (SentencePiece models are not supported)"
            ) from None
    if not ranks:
        raise ConfigError(f"{path} holds no tokens; give a tiktoken BPE file")
    problem = rank_problem(ranks)
    if problem:
        raise ConfigError(f"{path} {problem}; give a complete tiktoken BPE file")
    return ranks


def rank_problem(ranks: dict[bytes, int]) -> str | None:
    """What tiktoken would overflow or panic on, None if nothing: a rank outside
    0..MAX_RANK, a rank given to two tokens, a single byte without a rank (a byte-level
    BPE ranks all 256)."""
    low, high = min(ranks.values()), max(ranks.values())
    if low < 0 or high > MAX_RANK:
        shown = str(low if low < 0 else high)
        return f"has rank {shown[:40]}, outside 0..{MAX_RANK}"
    if len(set(ranks.values())) != len(ranks):
        return "gives a rank to two tokens"
    missing = next((b for b in range(256) if bytes([b]) not in ranks), None)
    if missing is not None:
        return f"has no rank for the byte {missing:#04x}"
    return None


def _cut_long_runs(text: str) -> list[str]:
    """`text` cut inside runs longer than _MAX_RUN only, so no piece holds a longer run."""
    cuts = [
        i
        for run in _LONG_RUN.finditer(text)
        for i in range(run.start() + _MAX_RUN, run.end(), _MAX_RUN)
    ]
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


class TiktokenTokenizer(BaseTokenizer):
    """A tiktoken BPE file with Llama-3's pre-tokenizer and BOS/EOS after the ranks."""

    BOS_TOKEN, EOS_TOKEN = "<|begin_of_text|>", "<|end_of_text|>"

    def __init__(self, path: Path) -> None:
        super().__init__()
        ranks = read_tiktoken_ranks(path)
        self.bos_id = max(ranks.values()) + 1
        self.eos_id = self.bos_id + 1
        try:
            self.encoding = tiktoken.Encoding(
                name=path.name,
                pat_str=LLAMA3_PATTERN,
                mergeable_ranks=ranks,
                special_tokens={self.BOS_TOKEN: self.bos_id, self.EOS_TOKEN: self.eos_id},
            )
        except ValueError as e:
            raise ConfigError(f"tiktoken rejects {path} ({e}); give a valid BPE file") from e

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = True) -> list[int]:
        # special-token text inside documents is ordinary text, not a control token
        ids = [
            i
            for piece in _cut_long_runs(text)
            for i in self.encoding.encode(piece, disallowed_special=())
        ]
        return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

    def decode(self, token_ids: list[int]) -> str:
        return self.encoding.decode(token_ids)

    def get_vocab_size(self) -> int:
        return self.encoding.n_vocab


class DefaultAssetsWarningFilter(logging.Filter):
    """Drops TorchTitan's "HF assets path ... does not exist!" warning when the path is one
    of DEFAULT_ASSETS: our default tokenizer is used then, and that path never is."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(
            message == f"HF assets path {path} does not exist!" for path in DEFAULT_ASSETS
        )


# ---- selection ----------------------------------------------------------------------
def assets_name(assets: str) -> str:
    """How a message names a `model.hf_assets_path` value: 'default' for each of
    DEFAULT_ASSETS (as the docs call it), else the value."""
    return DEFAULT_TOKENIZER if assets.strip() in DEFAULT_ASSETS else assets


def locate_tokenizer(assets: str) -> tuple[str, Path | None]:
    """("default" | "hf" | "tiktoken", where) for a `model.hf_assets_path` value."""
    if assets.strip() in DEFAULT_ASSETS:
        return "default", None
    path = Path(assets).expanduser()
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return "hf", path
        candidates = [path / "tokenizer.model"] if (path / "tokenizer.model").is_file() else []
        candidates = candidates or sorted(path.glob("*.tiktoken"))
        if len(candidates) == 1:
            return "tiktoken", candidates[0]
    elif path.is_file():
        if path.name == "tokenizer.json":
            return "hf", path.parent
        if path.suffix in (".model", ".tiktoken"):
            return "tiktoken", path
    elif not path.exists():
        raise ConfigError(f"model.hf_assets_path {assets} does not exist; {_HINT}")
    raise ConfigError(f"model.hf_assets_path {assets} is no tokenizer we can read; {_HINT}")


HF_FILES = ("tokenizer.json", "tokenizer_config.json")
"""The files of a Hugging Face tokenizer folder that TorchTitan's loader reads."""


def hf_files(folder: Path) -> list[Path]:
    """The HF_FILES present in `folder`, each a regular file within TOKENIZER_MAX_BYTES
    (a symlink is followed: Hugging Face's cache links its files)."""
    present = [folder / name for name in HF_FILES if os.path.lexists(folder / name)]
    for f in present:
        regular_size(f, "tokenizer file", TOKENIZER_MAX_BYTES)
    return present


def load_tokenizer(assets: str) -> BaseTokenizer:
    """The tokenizer for a `model.hf_assets_path` value (trains the default if missing)."""
    kind, path = locate_tokenizer(assets)
    if kind == "tiktoken":
        return TiktokenTokenizer(path)
    path = prepare_default_assets() if kind == "default" else path
    hf_files(path)
    try:
        return HuggingFaceTokenizer(str(path))
    except Exception as e:  # tokenizers raises bare Exception on a malformed file
        raise ConfigError(f"cannot load {path / 'tokenizer.json'} ({e}); {_HINT}") from e


def tokenizer_files(assets: str) -> list[Path]:
    """The files that determine the tokenizer of a `model.hf_assets_path` value (what a
    prepared dataset's fingerprint hashes); trains the default if missing."""
    kind, path = locate_tokenizer(assets)
    if kind == "tiktoken":
        return [path]
    return hf_files(prepare_default_assets() if kind == "default" else path)


def build_tokenizer(job_config: JobConfig) -> BaseTokenizer:
    """TrainSpec `build_tokenizer_fn`: the tokenizer named by `model.hf_assets_path`."""
    return load_tokenizer(job_config.model.hf_assets_path)


@functools.cache
def assets_vocab_size(assets: str) -> int:
    """Vocabulary size of the tokenizer of a `model.hf_assets_path` value (cached)."""
    if locate_tokenizer(assets)[0] == "default":
        return DEFAULT_VOCAB_SIZE  # known without training it
    return load_tokenizer(assets).get_vocab_size()


def tokenizer_vocab_size(job_config: JobConfig) -> int:
    """Vocabulary size of the configured tokenizer (cached per path), for the embedding."""
    return assets_vocab_size(job_config.model.hf_assets_path)


VOCAB_MULTIPLE = 256
"""A vocabulary grown to a tokenizer's is rounded up to a multiple of this (it then splits
over every TP degree that divides 256)."""


def model_vocab_size(tokenizer_vocab: int, flavor_vocab: int, flavor: str) -> int:
    """The model's vocabulary: the flavor's; for a flavor without one (0), the tokenizer's;
    for a tokenizer with more tokens than the flavor's (Llama 3's: 128,002 here), the
    tokenizer's rounded up to a multiple of `VOCAB_MULTIPLE` (128,256), logged."""
    if not flavor_vocab:
        return tokenizer_vocab
    if tokenizer_vocab <= flavor_vocab:
        return flavor_vocab
    grown = -(-tokenizer_vocab // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    logging.getLogger(__name__).info(
        "vocab %d: the %s flavor's %d rows grown to hold the tokenizer's %d tokens",
        grown,
        flavor,
        flavor_vocab,
        tokenizer_vocab,
    )
    return grown
