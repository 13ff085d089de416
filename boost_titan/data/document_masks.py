"""Document-aware training: `[boost] eod_mask_loss`, `reset_position_ids`,
`reset_attention_mask` (Megatron-LM's three options, with their meaning).

Training windows pack documents back to back, each ending in an end-of-document token (the
tokenizer's EOS, or a prepared folder's `--separator`). The boundaries are read from the
tokens themselves, so one mechanism serves every source: the default corpus, local files,
prepared folders and anything else whose documents end in that token (the `.idx` index of
a prepared folder is not needed). A document is the run of tokens up to and including its
end token; a window's first document may have begun in an earlier window, and its last
may go on in the next: each counts from the window's edge, as in Megatron-LM.

With inputs x and labels y (y[i] = x[i + 1]) of a window, for every i with x[i] the end
token:

- `eod_mask_loss`: y[i] becomes IGNORE_INDEX (-100), the loss never asks a document's end
  to predict the next document's first token;
- `reset_position_ids`: `positions` [b, s] restart at 0 at i + 1 (the model's RoPE rows);
- `reset_attention_mask`: `documents` [b, s] (each token's document number in its window)
  goes to the model, whose attention lets a token see only earlier tokens of its document.

The batch is marked after collation (`DocumentCollate`), so the datasets, their order and
their saved positions are untouched. A text holding the end token's string inside a
document is split there if the tokenizer parses special tokens in text (as in Megatron-LM).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import default_collate

from boost_titan.config.errors import ConfigError

IGNORE_INDEX = -100
"""TorchTitan's ignored label (`torchtitan.components.loss.IGNORE_INDEX`)."""


def document_numbers(inputs: torch.Tensor, end_id: int) -> torch.Tensor:
    """Each token's document number within its row [b, s]: the end tokens before it (an
    end token belongs to the document it ends)."""
    ends = (inputs == end_id).to(torch.int64)
    return ends.cumsum(dim=-1) - ends


def document_positions(documents: torch.Tensor) -> torch.Tensor:
    """Each token's place in its document [b, s] (0 at a document's first token, and at a
    row's first token), from `document_numbers`."""
    index = torch.arange(documents.shape[-1], device=documents.device).expand_as(documents)
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[..., 1:] = documents[..., 1:] != documents[..., :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=-1).values
    return index - first


@dataclass(frozen=True)
class DocumentOptions:
    """What the training batches carry about documents (the module doc)."""

    end_id: int
    mask_loss: bool = False
    reset_positions: bool = False
    separate_attention: bool = False

    def mark(
        self, input_dict: dict[str, torch.Tensor], labels: torch.Tensor
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The batch with its labels masked and `positions` / `documents` added, as asked."""
        inputs = input_dict["input"]
        documents = document_numbers(inputs, self.end_id)
        marked = dict(input_dict)
        if self.mask_loss:
            labels = labels.masked_fill(inputs == self.end_id, IGNORE_INDEX)
        if self.reset_positions:
            marked["positions"] = document_positions(documents)
        if self.separate_attention:
            marked["documents"] = documents
        return marked, labels


@dataclass(frozen=True)
class DocumentCollate:
    """A dataloader's `collate_fn`: the default collation, then `DocumentOptions.mark`
    (picklable, for loader workers)."""

    options: DocumentOptions

    def __call__(self, samples: list[Any]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        input_dict, labels = default_collate(samples)
        return self.options.mark(input_dict, labels)


def asked(boost) -> bool:
    """Whether `[boost]` asks for any of the three options."""
    return boost.eod_mask_loss or boost.reset_position_ids or boost.reset_attention_mask


def end_token(tokenizer_ids: list[dict[str, Any]], where: str) -> int:
    """The one end-of-document id of the training data: each entry (the tokenizer's, or a
    prepared source's manifest `tokenizer`) gives its `separator_id`, else its `eos_id`.
    ConfigError when one has neither, or the sources disagree."""
    ends = {
        entry["eos_id"] if entry.get("separator_id") is None else entry["separator_id"]
        for entry in tokenizer_ids
    }
    if None in ends:
        raise ConfigError(
            f"[boost] eod_mask_loss / reset_position_ids / reset_attention_mask need an "
            f"end-of-document token, and {where} has none (no EOS, no --separator); use a "
            "tokenizer with an eos_token or prepare the data with --separator TOKEN"
        )
    if len(ends) > 1:
        raise ConfigError(
            f"[boost] eod_mask_loss / reset_position_ids / reset_attention_mask: the sources "
            f"of {where} end documents with different tokens ({sorted(ends)}); prepare them "
            "with the same --separator"
        )
    return ends.pop()


def collate_for(boost, tokenizer_ids: list[dict[str, Any]], where: str) -> dict[str, Any]:
    """The dataloader's `collate_fn` for the options `[boost]` asks for, at the data's end
    token (`end_token`; `tokenizer_ids` as there, `where` names the data); {} for none."""
    if not asked(boost):
        return {}
    options = DocumentOptions(
        end_token(tokenizer_ids, where),
        mask_loss=boost.eod_mask_loss,
        reset_positions=boost.reset_position_ids,
        separate_attention=boost.reset_attention_mask,
    )
    return {"collate_fn": DocumentCollate(options)}
