"""The training text stream: torchtitan's text dataset, checked, resumable and tokenized
ahead.

`TextDataset` packs documents as torchtitan's `HuggingFaceTextDataset` does (BOS + text +
EOS, concatenated, cut into windows of seq_len + 1 tokens; the same windows in the same
order, and the same saved state) with three changes:
- the next `AHEAD` documents are tokenized on a background thread, without the GIL
  (`encode_document`), while the trainer runs its step, so a step's `next()` rarely waits
  for the tokenizer; the saved position is that of the documents packed, not of those read ahead;
- a record that does not parse, or has no string "text", is a one-line ConfigError naming
  the data's path when it is read (raw files are streamed: `corpus`);
- a streamed corpus resumes past a re-loop (torchtitan restores the position but not the
  epoch, and `datasets` applies a saved position only in its own epoch).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from datasets import Dataset
from torchtitan.components.tokenizer import BaseTokenizer, HuggingFaceTokenizer
from torchtitan.hf_datasets.text_datasets import DATASETS, HuggingFaceTextDataset
from torchtitan.tools.logging import logger

from boost_titan.config.errors import ConfigError

AHEAD = 4
"""Documents tokenized ahead of the one being packed."""


def reason(error: BaseException) -> str:
    """First line of the innermost cause: `datasets` wraps parser errors."""
    while error.__cause__ is not None:
        error = error.__cause__
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _check_text(sample: dict[str, Any], where: str) -> None:
    text = sample.get("text")
    if not isinstance(text, str):
        found = f"type {type(text).__name__}" if "text" in sample else f"fields {list(sample)}"
        raise ConfigError(
            f"a document under {where} has no string 'text' field (found {found}); "
            'store each document as a string "text"'
        )


def checked_samples(ds: Iterable[dict[str, Any]], where: str) -> Iterator[dict[str, Any]]:
    """The records of `ds` in order; a file that does not parse or a record without a string
    "text" is a one-line ConfigError naming `where`, when it is read."""
    samples = iter(ds)
    while True:
        try:
            sample = next(samples)
        except StopIteration:
            return
        except ConfigError:
            raise
        except Exception as e:  # parser errors surface in several types
            raise ConfigError(
                f"cannot read the files under {where} ({reason(e)}); fix or remove them"
            ) from e
        _check_text(sample, where)
        yield sample


def documents(ds: Iterable[dict[str, Any]], where: str) -> Iterator[str]:
    """The texts of `ds` in order, checked as `checked_samples` checks them."""
    return (sample["text"] for sample in checked_samples(ds, where))


def encode_document(tokenizer: BaseTokenizer, text: str) -> list[int]:
    """`tokenizer.encode(text, add_bos=True, add_eos=True)`, without holding the GIL where
    the tokenizer allows: `tokenizers`' `encode` holds it (the trainer's thread would wait
    for it), its `encode_batch` does not; tiktoken's `encode` does not either."""
    if type(tokenizer).encode is not HuggingFaceTokenizer.encode:
        return tokenizer.encode(text, add_bos=True, add_eos=True)
    ids = tokenizer.tokenizer.encode_batch([text])[0].ids
    if not tokenizer.hf_adds_bos and tokenizer.bos_id is not None:  # as torchtitan's encode
        ids.insert(0, tokenizer.bos_id)
    if not tokenizer.hf_adds_eos and tokenizer.eos_id is not None:
        ids.append(tokenizer.eos_id)
    return ids


class TextDataset(HuggingFaceTextDataset):
    """TorchTitan's text dataset, checked, resumable and tokenized ahead (module doc)."""

    def __init__(self, name: str, path: str | None, *args: Any, **kwargs: Any) -> None:
        super().__init__(name, path, *args, **kwargs)
        self.where = path or DATASETS[name].path
        self._packed_state: dict[str, Any] | None = None
        """A streamed corpus's position after the last document packed."""

    def _get_data_iter(self) -> Iterator[dict[str, Any]]:
        return checked_samples(super()._get_data_iter(), self.where)

    def _stream_state(self) -> dict[str, Any] | None:
        return None if isinstance(self._data, Dataset) else self._data.state_dict()

    def _encode(self, sample: dict[str, Any]) -> list[int]:
        return encode_document(self._tokenizer, self._text_processor(sample))

    def _tokenized(self, pool: ThreadPoolExecutor) -> Iterator[tuple[list[int], Any]]:
        """One pass's documents as tokens, each with the stream's position after it; the
        `pool` tokenizes up to AHEAD documents past the one returned."""
        ahead: deque[tuple[Future[list[int]], Any]] = deque()
        for sample in self._get_data_iter():
            ahead.append((pool.submit(self._encode, sample), self._stream_state()))
            if len(ahead) > AHEAD:
                tokens, state = ahead.popleft()
                yield tokens.result(), state
        while ahead:
            tokens, state = ahead.popleft()
            yield tokens.result(), state

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        width = self.seq_len + 1
        with ThreadPoolExecutor(1, thread_name_prefix="tokenize-ahead") as pool:
            while True:
                for tokens, position in self._tokenized(pool):
                    self._packed_state = position
                    self._token_buffer.extend(tokens)
                    self._sample_idx += 1
                    while len(self._token_buffer) >= width:
                        window = torch.LongTensor(self._token_buffer[:width])
                        self._token_buffer = self._token_buffer[width:]
                        yield {"input": window[:-1]}, window[1:]
                if not self.infinite:
                    logger.warning(f"Dataset {self.dataset_name} has run out of data")
                    return
                self._sample_idx = 0
                logger.warning(f"Dataset {self.dataset_name} is being re-looped")
                if not isinstance(self._data, Dataset):
                    self._data.set_epoch(self._data.epoch + 1)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self._packed_state is not None:  # not the documents read ahead
            state["data"] = self._packed_state
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._packed_state = None
        if "data" in state_dict:  # a stream applies a saved position only in its epoch
            self._data.set_epoch(state_dict["data"]["epoch"])
