"""`[boost] data_order = "global"`: training batches that do not depend on the
data-parallel degree.

TorchTitan's text dataset gives each data-parallel rank a contiguous share of the documents,
so a run at DP 2 trains on other batches than a run at DP 1. `GlobalOrderRows` instead
lets every rank read the one packed stream of all documents (windows 0, 1, 2, ... in the
order a single process reads them) and keep its rows of each global batch: with local
batch b and DP degree n, window i belongs to rank (i // b) % n. The windows of a step,
hence its gradient, are then the same at any DP degree (and any gradient-accumulation
split). The price is that every rank tokenizes the whole stream, n times the work of
sharded reading.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset


class GlobalOrderRows(IterableDataset, Stateful):
    """One data-parallel rank's rows of the global window stream `stream` (see the module
    doc); its state is the stream's plus the number of windows read."""

    def __init__(
        self, stream: HuggingFaceTextDataset, dp_rank: int, dp_degree: int, local_batch_size: int
    ) -> None:
        self.stream = stream
        self.dp_rank = dp_rank
        self.dp_degree = dp_degree
        self.local_batch_size = local_batch_size
        self.dataset_name = stream.dataset_name
        self._windows_read = 0

    def owner(self, window: int) -> int:
        """The data-parallel rank that trains on window `window` of the stream."""
        return (window // self.local_batch_size) % self.dp_degree

    def __iter__(self) -> Iterator[Any]:
        for sample in self.stream:
            window = self._windows_read
            self._windows_read += 1
            if self.owner(window) == self.dp_rank:
                yield sample

    def state_dict(self) -> dict[str, Any]:
        return {"stream": self.stream.state_dict(), "windows_read": self._windows_read}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.stream.load_state_dict(state_dict["stream"])
        self._windows_read = state_dict["windows_read"]
