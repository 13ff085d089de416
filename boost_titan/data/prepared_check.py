"""Does a job's prepared training data fit its tokenizer and model (`check`, and each
worker's dataloader)?"""

from __future__ import annotations

import resource

from boost_titan.data.mix import MixedWindows, open_sources, training_sources
from boost_titan.data.prepared import OPEN_SHARDS, PreparedDataset, tokenizer_fingerprint
from boost_titan.data.tokenizer import assets_name, assets_vocab_size, tokenizer_files

ID_SCAN_BYTES = 1 << 30
"""Shard bytes whose token ids `check_prepared` reads (shards in order, all sources): about
1.5 s from the page cache, a disk's read time otherwise; the loader checks every window it
reads."""
FILES_BESIDE_SHARDS = 64
"""Open files a training process needs besides its shards (the shard being checked,
sockets to its peers, checkpoint and log files): a bound with room to spare."""


def open_files_warning(datasets: list[PreparedDataset], soft_limit: int) -> str | None:
    """A warning line when a process reading `datasets` may need more open files than
    `soft_limit` (RLIMIT_NOFILE's soft value; RLIM_INFINITY: none): the shards it keeps
    open (`prepared.OpenShards`: at most OPEN_SHARDS) plus FILES_BESIDE_SHARDS. None when
    they fit."""
    shards = sum(len(d.shards) for d in datasets)
    need = min(shards, OPEN_SHARDS) + FILES_BESIDE_SHARDS
    if soft_limit == resource.RLIM_INFINITY or need <= soft_limit:
        return None
    return (
        f"warning: the prepared data's {shards:,} shards are read with up to "
        f"{min(shards, OPEN_SHARDS)} open at once, and a training process may then need "
        f"{need} open files, over this shell's soft limit of {soft_limit} (ulimit -n); "
        f"raise it (ulimit -n {max(need, 1024)}) before training"
    )


def open_files_note(datasets: list[PreparedDataset]) -> str:
    """`open_files_warning` under this process's soft limit, on a line of its own after
    `check`'s summary ("" when the files fit)."""
    warning = open_files_warning(datasets, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    return f"\n{warning}" if warning else ""


def check_prepared(job_config, vocab: int | None, scan_ids: bool = False) -> None:
    """ConfigError (one line) unless every prepared source of the job was made by its
    tokenizer (`model.hf_assets_path`), holds only ids below the model's vocabulary `vocab`
    (None: not known here), has whole shards and at least one window of seq_len + 1 tokens.
    With `scan_ids` (`check`), the ids of the first ID_SCAN_BYTES of shards are read too.
    Nothing to check for raw files or the default corpus."""
    sources = training_sources(job_config.training, job_config.boost)
    if sources is None:
        return
    assets = job_config.model.hf_assets_path
    fingerprint = tokenizer_fingerprint(tokenizer_files(assets))
    datasets = open_sources(sources)
    for dataset in datasets:
        dataset.check_tokenizer(fingerprint, assets_name(assets), assets_vocab_size(assets), vocab)
    MixedWindows(sources, datasets, job_config.training.seq_len)
    budget = ID_SCAN_BYTES if scan_ids else 0
    for dataset in datasets:
        for index, shard in enumerate(dataset.shards):
            if budget <= 0:
                return
            dataset.check_ids(index)
            budget -= shard.tokens * dataset.dtype.itemsize
