"""Training windows from prepared datasets (`boost_titan.data.prepared`), one or blended.

`--training.dataset_path DIR` naming a prepared folder is a mix of one source;
`--boost.data_mix "web=/data/web:0.7,code=/data/code:0.3"` blends several by weight.

The global stream is a sequence of windows; window g comes from the source whose deficit
w_s (g + 1) - taken_s is largest (ties to the first listed), so every prefix of the stream
holds each source within one window of its share, and the stream depends on the weights
alone. A source's k-th read is its window `WindowOrder(k)` (`boost_titan.data.window_order`):
with `[boost] data_shuffle` (the default) a seeded permutation of its windows per epoch of
its own, by `[boost] data_seed` (k mod its windows per epoch without). Each source loops on
its own; its epochs are counted in the summary line, and its first repeat logs a warning.
As in `[boost] data_order = "global"`, the stream is read in rounds of
dp_degree x local_batch_size windows, data-parallel rank r training on the r-th block of
local_batch_size windows of each round, and reading only those (a window is found by
offset, not by reading the ones before it). The batches of a step are therefore the same
at any data-parallel degree, and the saved position (the round's first window and each
source's windows taken before it) is the same on every rank, so a checkpoint resumes at
another degree.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import IterableDataset
from torchtitan.tools.logging import logger

from boost_titan.config.errors import ConfigError
from boost_titan.data.megatron_indexed import MegatronDataset, is_megatron
from boost_titan.data.prepared import OpenShards, PreparedDataset, is_prepared
from boost_titan.data.window_order import WindowOrder

_FORMAT = '"name=/prepared/folder:weight,..."'


@dataclass(frozen=True)
class MixSource:
    name: str
    path: str
    weight: float


def parse_mix(spec: str) -> list[MixSource]:
    """The sources of a `[boost] data_mix` value; ConfigError (one line) for a malformed
    one, a repeated name, or weights that are negative or do not sum to a positive number."""
    sources = []
    for item in (part.strip() for part in spec.split(",")):
        name, equals, rest = item.partition("=")
        path, colon, weight_text = rest.rpartition(":")
        try:
            weight = float(weight_text)
        except ValueError:
            weight = math.nan
        if not (equals and colon and name.strip() and path.strip()) or math.isnan(weight):
            raise ConfigError(
                f"[boost] data_mix item {item!r} is not name=folder:weight; give {_FORMAT}"
            )
        if not (math.isfinite(weight) and weight >= 0):
            raise ConfigError(
                f"[boost] data_mix weight {weight_text} of {name!r} must be a finite number >= 0"
            )
        sources.append(MixSource(name.strip(), path.strip(), weight))
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise ConfigError(
            f"[boost] data_mix names a source twice ({', '.join(names)}); give each a new name"
        )
    if not max(s.weight for s in sources) > 0:
        raise ConfigError(
            "[boost] data_mix weights sum to 0; give at least one source a positive weight"
        )
    return sources


def normalized(weights: list[float]) -> list[float]:
    """`weights` (finite, >= 0, one positive) divided by their sum, summed after scaling by
    the largest, so that weights near the float maximum do not overflow the sum to inf."""
    top = max(weights)
    scaled = [w / top for w in weights]
    total = sum(scaled)
    return [w / total for w in scaled]


def training_sources(training, boost) -> list[MixSource] | None:
    """The prepared sources a job trains on: `[boost] data_mix`'s, or the prepared folder
    `training.dataset_path` names (weight 1); None for raw files or the default corpus."""
    if boost.data_mix:
        if training.dataset_path:
            raise ConfigError(
                "[boost] data_mix and training.dataset_path both name the training data; keep one"
            )
        sources = parse_mix(boost.data_mix)
        for s in sources:
            if not (is_prepared(s.path) or is_megatron(s.path)):
                raise ConfigError(
                    f"[boost] data_mix source {s.name!r}: {s.path} is no prepared dataset (no "
                    "manifest.json, no Megatron .idx); make it with python -m boost_titan.prepare"
                )
        return sources
    if is_prepared(training.dataset_path) or is_megatron(training.dataset_path):
        path = training.dataset_path
        return [MixSource(Path(path).expanduser().resolve().name, path, 1.0)]
    return None


def window_seed(boost) -> int | None:
    """The seed of the training windows' order: `[boost] data_seed`, None (input order)
    with `data_shuffle` off."""
    return boost.data_seed if boost.data_shuffle else None


def open_sources(
    sources: list[MixSource], vocab_size: int | None = None, eos_id: int | None = None
) -> list[PreparedDataset]:
    """Each source's dataset, its manifest (or Megatron index) read and shard sizes checked;
    they share one cache of open shard files (`prepared.OpenShards`). `vocab_size` and
    `eos_id` (the tokenizer's) bound a Megatron dataset's ids and end its documents: its
    files name no tokenizer."""
    field = lambda s: f"[boost] data_mix {s.name}:" if len(sources) > 1 else "training.dataset_path"  # noqa: E731
    files = OpenShards()
    opened = [
        MegatronDataset(s.path, field(s), vocab_size, eos_id, files)
        if is_megatron(s.path) and not is_prepared(s.path)
        else PreparedDataset(s.path, field(s), files)
        for s in sources
    ]
    for dataset in opened:
        dataset.check_shards()
    return opened


def _order(seed: int | None) -> str:
    return "in input order" if seed is None else f"shuffled with data_seed {seed}"


def _order_flags(seed: int | None) -> str:
    return "--boost.no_data_shuffle" if seed is None else f"--boost.data_seed {seed}"


class MixedWindows(IterableDataset, Stateful):
    """One data-parallel rank's windows of the blended global stream (see the module doc)."""

    def __init__(
        self,
        sources: list[MixSource],
        datasets: list[PreparedDataset],
        seq_len: int,
        dp_rank: int = 0,
        dp_degree: int = 1,
        local_batch_size: int = 1,
        seed: int | None = None,
    ) -> None:
        """`seed`: the windows' order (`window_seed`; None: input order)."""
        self.names = [s.name for s in sources]
        self.weights = normalized([s.weight for s in sources])
        self.datasets = datasets
        self.width = seq_len + 1
        self.windows = [d.windows(self.width) for d in datasets]
        rows = zip(sources, datasets, self.windows, self.weights, strict=True)
        for source, dataset, windows, weight in rows:
            if weight and not windows:
                raise ConfigError(
                    f"{dataset.field} {source.path} holds {dataset.tokens} tokens, fewer than "
                    f"seq_len + 1 = {self.width}; add documents or lower training.seq_len"
                )
        self.dp_rank, self.dp_degree, self.local_batch_size = dp_rank, dp_degree, local_batch_size
        self.seed = seed
        self.orders = [WindowOrder(n, i, seed) for i, n in enumerate(self.windows)]
        self.dataset_name = "+".join(self.names)
        self.position = 0
        """The first window of the current round."""
        self.taken = [0] * len(sources)
        """Windows each source gave before `position`."""
        self.yielded = 0
        """This rank's windows of the current round already read."""

    def pick(self, window: int, taken: list[int]) -> int:
        """The source of global window `window`, given each source's windows before it."""
        deficits = [w * (window + 1) - t for w, t in zip(self.weights, taken, strict=True)]
        return deficits.index(max(deficits))

    def read(self, source: int, k: int) -> torch.Tensor:
        """The k-th read of `source` (its window `WindowOrder(k)`)."""
        start = self.orders[source](k) * self.width
        return torch.from_numpy(self.datasets[source].read(start, self.width))

    def warn_repeats(self, before: list[int], after: list[int]) -> None:
        """A warning line for each source whose windows ran out between the reads
        `before` and `after` (its second epoch begins)."""
        for name, n, old, new in zip(self.names, self.windows, before, after, strict=True):
            if old < n <= new:
                order = "in a new order" if self.seed is not None else "in the same order"
                logger.warning(
                    f"data: source {name!r} repeats: its {n:,} windows are all read, its "
                    f"epoch 2 reads them again {order} (epochs are counted in the summary)"
                )

    def _round(self) -> tuple[list[tuple[int, int]], list[int]]:
        """This rank's (source, k) of the current round, and `taken` after the round."""
        taken, mine = list(self.taken), []
        size = self.dp_degree * self.local_batch_size
        for j in range(size):
            source = self.pick(self.position + j, taken)
            if j // self.local_batch_size == self.dp_rank:
                mine.append((source, taken[source]))
            taken[source] += 1
        return mine, taken

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        while True:
            mine, taken = self._round()
            if not self.yielded:
                self.warn_repeats(self.taken, taken)
            for source, k in mine[self.yielded :]:
                self.yielded += 1
                if self.yielded == len(mine):  # the round is read: save the next one's start
                    self.position += self.dp_degree * self.local_batch_size
                    self.taken, self.yielded = taken, 0
                window = self.read(source, k)
                yield {"input": window[:-1]}, window[1:]

    def shares(self) -> dict[str, float]:
        """Each source's share of the windows (hence tokens) trained on so far."""
        done = sum(self.taken) or 1
        return {name: taken / done for name, taken in zip(self.names, self.taken, strict=True)}

    def epochs(self) -> dict[str, float]:
        """Each source's epochs trained on so far (its windows read / its windows; 0 for a
        source of weight 0 and no window)."""
        rows = zip(self.names, self.taken, self.windows, strict=True)
        return {name: taken / windows if windows else 0.0 for name, taken, windows in rows}

    def shares_line(self) -> str:
        shares = ", ".join(
            f"{n} {100 * s:.1f}% ({e:.2f} epochs{', repeated' * (e > 1)})"
            for (n, s), e in zip(self.shares().items(), self.epochs().values(), strict=True)
        )
        tokens = sum(self.taken) * (self.width - 1)
        return f"data mix: {shares} of {tokens:,} tokens trained"

    def state_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "taken": list(self.taken),
            "yielded": self.yielded,
            "round": [self.dp_degree, self.local_batch_size],
            "sources": list(self.names),
            "windows": list(self.windows),
            "seed": self.seed,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = (state_dict["sources"], state_dict["windows"])
        if saved != (self.names, self.windows):
            raise ConfigError(
                f"the checkpoint's data position is for sources {saved[0]} with "
                f"{saved[1]} windows, not this job's {self.names} with {self.windows}; resume with "
                "the same data and seq_len, or add --checkpoint.exclude_from_loading dataloader"
            )
        if state_dict.get("seed") != self.seed:
            saved_order = state_dict.get("seed")
            raise ConfigError(
                "the checkpoint's data position is for windows "
                f"{_order(saved_order)}, not this job's {_order(self.seed)}; resume with "
                f"{_order_flags(saved_order)}, or add --checkpoint.exclude_from_loading dataloader"
            )
        if state_dict["yielded"] and state_dict["round"] != [self.dp_degree, self.local_batch_size]:
            raise ConfigError(
                "the checkpoint was saved inside a round of another data-parallel layout; "
                "resume with its degree and local_batch_size"
            )
        self.position, self.taken = state_dict["position"], list(state_dict["taken"])
        self.yielded = state_dict["yielded"]

    reshardable = True
    """Its saved position is every rank's (see `CheckpointedDataloader`)."""
