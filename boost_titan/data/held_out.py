"""Validation data: which documents, packed once into windows, cut into per-rank batches.

`validation_data(job_config)` resolves `[validation] dataset / dataset_path`: the default
corpus's held-out split (`stdlib_validation`; torchtitan's default name `c4_validation`
means it too), or local files in the training formats; a run on a prepared dataset
(`data.prepared`) validates on the documents `prepare` held out. Any other run on its own
training data without `validation.dataset_path` has no held-out documents: `None`.

`ValidationBatches` packs documents as torchtitan's text dataset packs training data (BOS +
text + EOS, concatenated, cut into windows of seq_len + 1 tokens, the remainder dropped),
keeps the first `steps` global batches (all windows for steps = -1) and hands each
data-parallel rank its rows of every global batch. The last global batch is padded with
rows whose labels are ignored, so every rank runs the same number of batches and the
windows evaluated, hence the token-weighted loss, do not depend on the data-parallel
degree (nor on the batch size when every window is used).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.hf_datasets.text_datasets import DATASETS

from boost_titan.config.errors import ConfigError
from boost_titan.data.corpus import (
    DEFAULT_VALIDATION_DATASETS,
    LOCAL,
    STDLIB,
    STDLIB_VALIDATION,
    check_documents,
    documents,
    local_files,
    resolve_dataset,
)
from boost_titan.data.prepared import HELD_OUT, check_held_out, is_prepared

Batch = tuple[dict[str, torch.Tensor], torch.Tensor]
"""({"input": tokens}, labels), as torchtitan's dataloaders yield them."""


@dataclass(frozen=True)
class ValidationData:
    """A registered dataset (`corpus` names) and the path its loader reads."""

    name: str
    path: str
    field: str = "validation.dataset_path"
    """The option that chose `path`, named in error messages."""

    def describe(self) -> str:
        if self.name == STDLIB_VALIDATION:
            return "the default corpus's held-out split"
        return f"{self.field} {self.path}"

    def texts(self) -> Iterator[str]:
        """The documents' texts in the loader's (fixed) order; ConfigError if all are empty."""
        records = DATASETS[self.name].loader(self.path)
        check_documents(records, self.describe(), 1)
        return documents(records, self.describe())


def data_at(path: str | None, field: str) -> ValidationData:
    """Local files at `path` (checked), or the held-out split when `path` is empty."""
    if not path:
        return ValidationData(STDLIB_VALIDATION, DATASETS[STDLIB_VALIDATION].path)
    local_files(path, field)
    return ValidationData(LOCAL, path, field)


def point_titan_validation_at_held_out(job_config) -> None:
    """TorchTitan's own validator (TorchTitan's models, a user's TrainSpec) loads
    `validation.dataset` from TorchTitan's registry, where the default name `c4_validation`
    is C4 on the Hugging Face Hub. A job training on the default corpus validates on that
    corpus's held-out split there too, as ours does (module docstring): nothing is
    downloaded at run time. Another name or a `validation.dataset_path` is left as given."""
    validation, training = job_config.validation, job_config.training
    if (
        validation.dataset.lower() == DEFAULT_VALIDATION_DATASETS[1]
        and not validation.dataset_path
        and training.dataset.lower() == STDLIB
        and not training.dataset_path
    ):
        validation.dataset = STDLIB_VALIDATION


def validation_data(job_config) -> ValidationData | None:
    """The job's validation documents; None when it trains on its own data and names no
    validation documents (the default held-out split would be another domain)."""
    validation, training = job_config.validation, job_config.training
    name, path = validation.dataset.lower(), validation.dataset_path
    if name in DEFAULT_VALIDATION_DATASETS:
        if not path and is_prepared(training.dataset_path):
            folder = Path(training.dataset_path).expanduser()
            held_out = folder / HELD_OUT
            if not held_out.is_dir():
                return None
            check_held_out(folder, "training.dataset_path")
            return data_at(str(held_out), "training.dataset_path's held-out split")
        trains_on_own = job_config.boost.data_mix or (
            resolve_dataset(training.dataset, training.dataset_path)[0] != STDLIB
        )
        if not path and trains_on_own:
            return None
        return data_at(path, "validation.dataset_path")
    if name not in DATASETS:
        raise ConfigError(
            f"unknown validation.dataset {name!r}; choose one of "
            f"{', '.join(sorted({*DATASETS, *DEFAULT_VALIDATION_DATASETS}))}"
        )
    if name == LOCAL:
        if not path:
            raise ConfigError(
                "validation.dataset local needs a path; "
                "pass --validation.dataset_path <file or dir>"
            )
        return data_at(path, "validation.dataset_path")
    return ValidationData(name, path or DATASETS[name].path)


def pack_windows(
    texts: Iterator[str], tokenizer: BaseTokenizer, seq_len: int, limit: int | None = None
) -> torch.Tensor:
    """The first `limit` (default all) windows of seq_len + 1 tokens of the packed stream,
    as an (n, seq_len + 1) int32 tensor."""
    width = seq_len + 1
    parts: list[torch.Tensor] = []
    count, buffer = 0, []
    for text in texts:
        buffer.extend(tokenizer.encode(text, add_bos=True, add_eos=True))
        full = len(buffer) // width
        if full:
            parts.append(torch.tensor(buffer[: full * width], dtype=torch.int32).view(full, width))
            del buffer[: full * width]
            count += full
        if limit is not None and count >= limit:
            break
    windows = torch.cat(parts) if parts else torch.empty(0, width, dtype=torch.int32)
    return windows[:limit]


class ValidationBatches:
    """One data-parallel rank's batches of a fixed set of windows (see the module doc)."""

    def __init__(
        self, windows: torch.Tensor, local_batch_size: int, dp_rank: int = 0, dp_degree: int = 1
    ) -> None:
        self.windows = windows
        self.local_batch_size = local_batch_size
        self.dp_rank = dp_rank
        self.global_batch_size = local_batch_size * dp_degree

    @property
    def tokens(self) -> int:
        """Labels scored over all ranks (every window's but its first token)."""
        return self.windows.shape[0] * (self.windows.shape[1] - 1)

    def __len__(self) -> int:
        return math.ceil(self.windows.shape[0] / self.global_batch_size)

    def __iter__(self) -> Iterator[Batch]:
        width = self.windows.shape[1]
        for index in range(len(self)):
            first = index * self.global_batch_size + self.dp_rank * self.local_batch_size
            rows = self.windows[first : first + self.local_batch_size].long()
            padding = self.local_batch_size - rows.shape[0]
            inputs = torch.cat([rows[:, :-1], torch.zeros(padding, width - 1, dtype=torch.long)])
            labels = torch.cat(
                [rows[:, 1:], torch.full((padding, width - 1), IGNORE_INDEX, dtype=torch.long)]
            )
            yield {"input": inputs}, labels


def build_validation_batches(
    data: ValidationData,
    tokenizer: BaseTokenizer,
    seq_len: int,
    local_batch_size: int,
    steps: int = -1,
    dp_rank: int = 0,
    dp_degree: int = 1,
) -> ValidationBatches:
    """Pack `data` (the first `steps` global batches, all for -1) for one DP rank."""
    limit = None if steps == -1 else steps * local_batch_size * dp_degree
    windows = pack_windows(data.texts(), tokenizer, seq_len, limit)
    if windows.shape[0] == 0:
        raise ConfigError(
            f"{data.describe()} holds fewer than seq_len + 1 = {seq_len + 1} tokens, not one "
            "validation sequence; add documents or lower the validation seq_len"
        )
    return ValidationBatches(windows, local_batch_size, dp_rank, dp_degree)
