"""Training text, offline: this Python's stdlib sources (default) or the user's local files.

Both are registered in torchtitan's `DATASETS` table, so its text dataset (packing, DP
sharding, checkpointable position) and dataloader are reused (with `[boost] data_order =
"global"`, its dataset is read whole by every rank: `global_order`). Local files are
streamed (`datasets`' `streaming=True`): the first step waits for the first documents,
not for a conversion of the whole corpus. Several files are split between data-parallel
ranks by file when the ranks divide the file count, else by document (rank r of n reads
documents r, r + n, ...). A file that does not parse is found when it is read.

The default corpus is split by file: a file is held out for validation when the SHA-256 of
its path relative to the stdlib root falls in the lowest `HELD_OUT_PERCENT` percent. The
rule looks at the path alone, so a file's side does not depend on which other files a
Python version ships; training (`stdlib`) and the default tokenizer never read a held-out
file, validation (`stdlib_validation`) reads only those.
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
import sysconfig
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import datasets
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.config import JobConfig
from torchtitan.hf_datasets import DatasetConfig
from torchtitan.hf_datasets.text_datasets import DATASETS
from torchtitan.tools.logging import logger

from boost_titan.config.errors import ConfigError
from boost_titan.data.document_masks import collate_for
from boost_titan.data.documents import file_format
from boost_titan.data.global_order import GlobalOrderRows
from boost_titan.data.loader import CheckpointedDataloader
from boost_titan.data.mix import MixedWindows, open_sources, training_sources, window_seed
from boost_titan.data.text_stream import TextDataset, documents, reason

if os.environ.get("HF_DATASETS_OFFLINE", "").upper() in datasets.config.ENV_VARS_TRUE_VALUES:
    # `datasets` reads the variable at import (see boost_titan.data), maybe before us.
    datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
datasets.disable_progress_bars()  # every rank would draw one per local file into the log

STDLIB = "stdlib"
STDLIB_VALIDATION = "stdlib_validation"
LOCAL = "local"
DEFAULT_DATASETS = (STDLIB, "c4_test")
"""Names meaning "the default": ours, and torchtitan's (whose test data is not shipped)."""
DEFAULT_VALIDATION_DATASETS = (STDLIB_VALIDATION, "c4_validation")
"""`validation.dataset` names meaning the default corpus's held-out split (the second is
torchtitan's default, which would stream from the network)."""
HELD_OUT_PERCENT = 2
"""About this percent of the default corpus's files is held out (chosen by path hash)."""

SKIPPED_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
)
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
_SUFFIXES = "/".join(BUILDERS)
_SHUFFLE_SEED = 0


def stdlib_root() -> str:
    """Directory holding the running interpreter's standard-library sources."""
    return sysconfig.get_paths()["stdlib"]


def python_files(root: str) -> list[Path]:
    """Every .py file under `root` outside test and third-party dirs, sorted by path."""
    found = []
    for parent, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        found += [Path(parent, n) for n in names if n.endswith(".py")]
    if not found:  # e.g. a Python shipped as bytecode only
        raise ConfigError(
            f"no .py sources under {root} for the default corpus and tokenizer; "
            "pass --training.dataset_path and --model.hf_assets_path"
        )
    return sorted(found)


def is_held_out(path: Path, root: str) -> bool:
    """Whether a default-corpus file belongs to the validation split (see the module doc)."""
    key = path.relative_to(root).as_posix().encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % 100 < HELD_OUT_PERCENT


def split_files(root: str, held_out: bool) -> list[Path]:
    """The training (`held_out=False`) or validation files of the default corpus, sorted."""
    return [p for p in python_files(root) if is_held_out(p, root) == held_out]


def read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


@functools.lru_cache(maxsize=4)
def load_python_sources(root: str, held_out: bool = False) -> datasets.Dataset:
    """One document per .py file of the training split (or the held-out one) under `root`,
    in a fixed shuffled order (mixes packages across the contiguous DP shards)."""
    files = split_files(root, held_out)
    random.Random(_SHUFFLE_SEED).shuffle(files)
    return datasets.Dataset.from_dict({"text": [read_text(p) for p in files]})


def local_files(path: str, field: str = "training.dataset_path") -> list[Path]:
    """The non-empty supported files at `path` (a file, or a directory searched recursively);
    errors name the option `field`."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(
            f"{field} {path} does not exist; point it at a {_SUFFIXES} file or a directory of them"
        )
    if p.is_file() and p.suffix.lower() not in BUILDERS:
        _refuse_compressed([p], field, path)
        raise ConfigError(
            f"{field} {path} has unsupported extension {p.suffix!r}; use a {_SUFFIXES} file"
        )
    found = (
        [p]
        if p.is_file()
        else sorted(
            f
            for f in p.rglob("*")
            if f.is_file() and f.suffix.lower() in BUILDERS and not f.name.startswith(".")
        )
    )
    files = [f for f in found if f.stat().st_size > 0]
    if not files:
        if p.is_dir():
            _refuse_compressed(sorted(p.rglob("*")), field, path)
        raise ConfigError(
            f"{field} {path} holds no documents (no non-empty {_SUFFIXES} file); add some text"
        )
    return files


def _refuse_compressed(files: list[Path], field: str, path: str) -> None:
    """ConfigError when `files` hold a compressed corpus file, which only `prepare` reads."""
    for f in files:
        try:
            compressed = f.is_file() and (file_format(f) or ("", None))[1] is not None
        except ConfigError:  # a compression prepare refuses too
            compressed = True
        if compressed:
            raise ConfigError(
                f"{field} {path}: {f.name} is compressed, which training reads only prepared; "
                "run python -m boost_titan.prepare on it and pass the prepared folder"
            )


def _load_files(builder: str, files: list[Path], path: str) -> datasets.IterableDataset:
    # .txt: one document per blank-line-separated paragraph
    options: dict[str, Any] = {"sample_by": "paragraph"} if builder == "text" else {}
    try:
        ds = datasets.load_dataset(
            builder, data_files=[str(f) for f in files], split="train", streaming=True, **options
        )
    except Exception as e:  # parser errors surface in several types
        raise ConfigError(
            f"cannot read the {builder} files under {path} ({reason(e)}); fix or remove them"
        ) from e
    if ds.features is None:  # known once read: `documents` checks each record
        return ds
    if "text" not in ds.features:
        raise ConfigError(
            f"{builder} data under {path} has no 'text' field (found {list(ds.features)}); "
            'store each document as "text"'
        )
    if getattr(ds.features["text"], "dtype", None) not in ("string", "large_string"):
        raise ConfigError(
            f"the 'text' field under {path} is not a string; store each document as a string"
        )
    return ds.select_columns(["text"])


@functools.lru_cache(maxsize=4)
def load_local(path: str) -> datasets.IterableDataset:
    """Stream .jsonl/.json ("text" field), .parquet ("text" column) or .txt files, offline:
    nothing is converted or read before the first document is asked for."""
    groups: dict[str, list[Path]] = defaultdict(list)
    for f in local_files(path):
        groups[BUILDERS[f.suffix.lower()]].append(f)
    parts = [_load_files(builder, files, path) for builder, files in sorted(groups.items())]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def _text(sample: dict[str, Any]) -> str:
    return sample["text"]


DATASETS[STDLIB] = DatasetConfig(
    path=stdlib_root(), loader=load_python_sources, sample_processor=_text
)
DATASETS[STDLIB_VALIDATION] = DatasetConfig(
    path=stdlib_root(),
    loader=functools.partial(load_python_sources, held_out=True),
    sample_processor=_text,
)
DATASETS[LOCAL] = DatasetConfig(path="", loader=load_local, sample_processor=_text)


def resolve_dataset(name: str, path: str | None) -> tuple[str, str | None]:
    """(registered name, path) to load: a default name with a path means the local files."""
    name = name.lower()
    if name in DEFAULT_DATASETS:
        name = LOCAL if path else STDLIB
    if name not in DATASETS:
        raise ConfigError(
            f"unknown training.dataset {name!r}; choose one of {', '.join(sorted(DATASETS))}"
        )
    if name == LOCAL and not path:
        raise ConfigError(
            "training.dataset local needs a path; pass --training.dataset_path <file or dir>"
        )
    return name, path


def check_documents(ds: Iterable[dict[str, Any]], where: str, dp_world_size: int) -> None:
    """Refuse data that would starve a rank: fewer documents than ranks, or no text at all.
    Reads only until both are ruled out (the first documents, for a real corpus)."""
    count, text = 0, False
    for document in documents(ds, where):
        count += 1
        text = text or bool(document.strip())
        if text and count >= dp_world_size:
            return
    if count < dp_world_size:
        raise ConfigError(
            f"{where} has {count} documents, fewer than the {dp_world_size} data-parallel "
            "ranks; add documents"
        )
    raise ConfigError(f"every document in {where} is empty; give it some text")


def separator_warning(tokenizer: BaseTokenizer, assets: str) -> str | None:
    """One line when `tokenizer` has neither BOS nor EOS (documents would be packed with
    nothing between them), else None."""
    if getattr(tokenizer, "bos_id", None) is None and getattr(tokenizer, "eos_id", None) is None:
        return (
            f"the tokenizer {assets or 'default'!r} has no BOS or EOS token, so documents are "
            "packed with nothing between them; add a tokenizer_config.json naming its "
            "eos_token, or prepare the corpus with python -m boost_titan.prepare --separator"
        )
    return None


def build_dataloader(
    dp_world_size: int, dp_rank: int, tokenizer: BaseTokenizer, job_config: JobConfig
) -> CheckpointedDataloader:
    """torchtitan's text dataset and dataloader over the resolved dataset, looping forever
    (with `[boost] data_order = "global"`, over this rank's rows of the global stream), or
    this rank's windows of prepared datasets (`data.mix`); the loader's saved state is read
    through the checkpoint allowlist (`data.loader`), its batches marked at document ends as
    `[boost]` asks (`data.document_masks`)."""
    training = job_config.training
    sources = training_sources(training, job_config.boost)
    if sources is not None:
        dataset = MixedWindows(
            sources,
            open_sources(sources, tokenizer.get_vocab_size(), getattr(tokenizer, "eos_id", None)),
            training.seq_len,
            dp_rank,
            dp_world_size,
            training.local_batch_size,
            window_seed(job_config.boost),
        )
        return CheckpointedDataloader(
            dataset,
            dp_rank=dp_rank,
            dp_world_size=dp_world_size,
            **asdict(training.dataloader),
            batch_size=training.local_batch_size,
            **collate_for(
                job_config.boost, [d.tokenizer for d in dataset.datasets], "the prepared data"
            ),
        )
    name, path = resolve_dataset(training.dataset, training.dataset_path)
    if warning := separator_warning(tokenizer, job_config.model.hf_assets_path):
        logger.warning(warning)
    global_order = job_config.boost.data_order == "global"
    if name in (STDLIB, LOCAL):
        config = DATASETS[name]
        where = path or config.path
        check_documents(config.loader(where), where, 1 if global_order else dp_world_size)
    if global_order:
        stream = TextDataset(name, path, tokenizer, training.seq_len, infinite=True)
        dataset = GlobalOrderRows(stream, dp_rank, dp_world_size, training.local_batch_size)
    else:  # as torchtitan's build_text_dataloader
        dataset = TextDataset(
            name,
            path,
            tokenizer,
            training.seq_len,
            dp_rank=dp_rank,
            dp_world_size=dp_world_size,
            infinite=True,
        )
    return CheckpointedDataloader(
        dataset,
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        **asdict(training.dataloader),
        batch_size=training.local_batch_size,
        **collate_for(
            job_config.boost,
            [{"eos_id": getattr(tokenizer, "eos_id", None)}],
            f"the tokenizer {job_config.model.hf_assets_path or 'default'!r}",
        ),
    )
