"""Reading prepared data at any size (issue 49): a bounded number of open shard files
(`prepared.OpenShards`; 5,000 shards read through the product's dataloader in a child whose
open-file limit is 256), `check`'s warning when the limit is too small, and the seeded
shuffle of training windows (`data.window_order`, through `data.mix`). Writing prepared
data, blends and resume at another DP degree: test_prepared.py."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torchtitan.config import ConfigManager

from boost_titan.config.errors import ConfigError
from boost_titan.data.mix import MixedWindows, MixSource, open_sources
from boost_titan.data.prepared import FORMAT, VERSION, PreparedDataset
from boost_titan.data.prepared_check import open_files_warning
from boost_titan.data.window_order import Permutation, WindowOrder
from boost_titan.job import preflight
from tests.helpers import ROOT
from tests.helpers.commands import clean_env

SHARDS = 5000
SHARD_TOKENS = 20
WIDTH = 17  # seq_len 16


def write_prepared(folder: Path, shards: int, shard_tokens: int) -> Path:
    """A prepared folder in the manifest format, written directly: token t of the stream
    is t (uint32, vocabulary 2^20), so a window's first token names it."""
    folder.mkdir(parents=True)
    for i in range(shards):
        tokens = np.arange(i * shard_tokens, (i + 1) * shard_tokens, dtype="<u4")
        (folder / f"shard-{i:05d}.bin").write_bytes(tokens.tobytes())
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "dtype": "uint32",
        "tokenizer": {"assets": "default", "fingerprint": "0" * 64, "vocab_size": 1 << 20},
        "shards": [
            {"name": f"shard-{i:05d}", "tokens": shard_tokens, "documents": 1}
            for i in range(shards)
        ],
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory) -> Path:
    return write_prepared(tmp_path_factory.mktemp("files") / "p", SHARDS, SHARD_TOKENS)


def job(*args: str):
    return ConfigManager().parse_args(["--job.custom_config_module=boost_titan.config", *args])


# One epoch of the 5,000-shard folder through `build_dataloader` (as a training worker
# builds it), with the soft open-file limit at 256: the windows read (by their first token)
# and the most files open at once.
_READ_UNDER_256 = """
import json, os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from torchtitan.config import ConfigManager
from boost_titan.data import build_dataloader
config = ConfigManager().parse_args([
    "--job.custom_config_module=boost_titan.config", "--training.dataset_path", sys.argv[1],
    "--training.seq_len", "16", "--training.local_batch_size", "64",
])
tokenizer = type("Tokenizer", (), {"eos_id": None, "get_vocab_size": lambda self: 1 << 20})()
loader = build_dataloader(1, 0, tokenizer, config)
windows, most_open = [], 0
for (x, y), _ in zip(loader, range(int(sys.argv[2]))):
    windows += (x["input"][:, 0] // 17).tolist()
    most_open = max(most_open, len(os.listdir("/proc/self/fd")))
print(json.dumps({"windows": windows, "most_open": most_open}))
"""


def test_5000_shards_are_read_with_an_open_file_limit_of_256(many_shards):
    """Every window of one epoch is read (each once, none in input order: shuffled), and
    the open files stay near OPEN_SHARDS (64) plus the interpreter's own, under 256."""
    epoch = SHARDS * SHARD_TOKENS // WIDTH
    child = subprocess.run(
        [sys.executable, "-c", _READ_UNDER_256, str(many_shards), str(-(-epoch // 64))],
        cwd=ROOT,
        env=clean_env() | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    result = json.loads(child.stdout.splitlines()[-1])
    windows = result["windows"][:epoch]
    assert sorted(windows) == list(range(epoch))
    assert windows != sorted(windows)
    assert result["most_open"] < 128, result["most_open"]


def test_check_warns_when_the_open_file_limit_is_too_small(many_shards, tmp_path, monkeypatch):
    """Quiet at 256 and with no limit; one `warning:` line at 100 (64 shards + 64 other
    files do not fit); quiet at 100 for a folder of one shard (1 + 64 fit)."""
    datasets = open_sources([MixSource("p", str(many_shards), 1.0)])
    assert open_files_warning(datasets, 256) is None
    assert open_files_warning(datasets, -1) is None  # RLIM_INFINITY
    line = open_files_warning(datasets, 100)
    assert line.startswith("warning: the prepared data's 5,000 shards are read with up to 64")
    assert "over this shell's soft limit of 100 (ulimit -n)" in line and "\n" not in line
    small = write_prepared(tmp_path / "small", 1, 40)
    config = job("--training.dataset_path", str(many_shards))
    monkeypatch.setattr("resource.getrlimit", lambda _: (100, 4096))
    assert preflight.check_data(config) == f"\n{line}"
    assert preflight.check_data(job("--training.dataset_path", str(small))) == ""


def test_the_shard_cache_closes_the_least_recently_read(many_shards):
    dataset = PreparedDataset(str(many_shards))
    dataset.files.limit = 3
    for shard in (0, 1, 2, 0, 3):  # shard 1 is the least recently read when 3 opens
        assert dataset.read(shard * SHARD_TOKENS, 2).tolist() == [shard * 20, shard * 20 + 1]
    assert list(dataset.files._fds) == [dataset.shards[i].path for i in (2, 0, 3)]
    assert dataset.read(5 * SHARD_TOKENS - 3, 6).tolist() == list(range(97, 103))  # across two


@pytest.mark.parametrize("n", [1, 2, 3, 5, 16, 17, 100, 1000, 4099])
def test_a_permutation_is_a_bijection_of_its_range(n):
    for key in (0, 1, 2**64 - 1):
        assert sorted(Permutation(n, key)(i) for i in range(n)) == list(range(n))


def test_a_permutation_of_a_billion_windows_needs_no_table():
    """Windows are found one by one, in constant memory and microseconds each."""
    perm = Permutation(10**9, 7)
    picks = [perm(i) for i in range(10_000)]
    assert len(set(picks)) == len(picks) and all(0 <= p < 10**9 for p in picks)
    assert sum(p < 5 * 10**8 for p in picks) == pytest.approx(5_000, abs=300)  # spread out
    assert sum(abs(a - b) < 10**6 for a, b in zip(picks, picks[1:], strict=False)) < 100  # no runs


def test_orders_differ_by_seed_source_and_epoch():
    def epoch(order: WindowOrder, e: int) -> list[int]:
        return [order(k) for k in range(e * 500, (e + 1) * 500)]

    seeded = WindowOrder(500, 0, 0)
    assert epoch(seeded, 0) == epoch(WindowOrder(500, 0, 0), 0)
    others = [epoch(WindowOrder(500, 0, 1), 0), epoch(WindowOrder(500, 1, 0), 0), epoch(seeded, 1)]
    for other in others:
        assert sorted(other) == list(range(500)) and other != epoch(seeded, 0)
    assert epoch(WindowOrder(500, 0, None), 1) == list(range(500))  # no seed: input order


def mix_of(folder: Path, seed: int | None, batch: int = 8) -> MixedWindows:
    sources = [MixSource("p", str(folder), 1.0)]
    return MixedWindows(sources, open_sources(sources), 16, local_batch_size=batch, seed=seed)


def firsts(mixed: MixedWindows, n: int) -> list[int]:
    return [int(x["input"][0]) // WIDTH for (x, _), _ in zip(mixed, range(n), strict=False)]


def test_one_seed_reads_the_same_windows_another_seed_others(tmp_path):
    folder = write_prepared(tmp_path / "p", 50, 34)  # 100 windows
    first = firsts(mix_of(folder, 0), 100)
    assert first == firsts(mix_of(folder, 0), 100)
    assert sorted(first) == list(range(100)) and first != list(range(100))
    other = firsts(mix_of(folder, 5), 100)
    assert sorted(other) == list(range(100)) and other != first
    assert firsts(mix_of(folder, None), 100) == list(range(100))  # --boost.no_data_shuffle


def test_a_repeating_source_warns_and_counts_its_epochs(tmp_path, caplog):
    """Epoch 2 reads every window again in a new order; the warning comes once, when
    the source runs out; the summary line gives each source's epochs."""
    big = write_prepared(tmp_path / "big", 50, 340)  # 1,000 windows
    small = write_prepared(tmp_path / "small", 5, 34)  # 10 windows
    sources = [MixSource("big", str(big), 0.5), MixSource("small", str(small), 0.5)]
    mixed = MixedWindows(sources, open_sources(sources), 16, local_batch_size=4, seed=3)
    with caplog.at_level(logging.WARNING):
        reads = [(int(x["input"][0]) // WIDTH) for (x, _), _ in zip(mixed, range(40), strict=False)]
    small_reads = reads[1::2]  # ties go to the first listed: big, small, big, ...
    assert [sorted(small_reads[e * 10 : (e + 1) * 10]) for e in (0, 1)] == [list(range(10))] * 2
    assert small_reads[:10] != small_reads[10:20]
    warnings = [r.getMessage() for r in caplog.records if "repeats" in r.getMessage()]
    assert warnings == [
        "data: source 'small' repeats: its 10 windows are all read, its epoch 2 reads them "
        "again in a new order (epochs are counted in the summary)"
    ]
    assert mixed.epochs() == {"big": 0.02, "small": 2.0}
    assert mixed.shares_line() == (
        "data mix: big 50.0% (0.02 epochs), small 50.0% (2.00 epochs, repeated) "
        "of 640 tokens trained"
    )


def test_a_checkpoint_of_another_order_is_refused(tmp_path):
    folder = write_prepared(tmp_path / "p", 5, 34)
    state = mix_of(folder, 0).state_dict()
    for seed, fix in ((1, "--boost.data_seed 0"), (None, "--boost.data_seed 0")):
        with pytest.raises(ConfigError, match=f"shuffled with data_seed 0, not .*{fix}"):
            mix_of(folder, seed).load_state_dict(state)
    del state["seed"]  # a checkpoint from before shuffling: input order
    with pytest.raises(ConfigError, match="in input order, not .*--boost.no_data_shuffle"):
        mix_of(folder, 0).load_state_dict(state)
    mix_of(folder, None).load_state_dict(state)


def test_windows_equal_the_stream_they_name(tmp_path):
    """A shuffled window is the stream's tokens at its place, its target shifted by one."""
    folder = write_prepared(tmp_path / "p", 7, 30)
    for (x, y), _ in zip(mix_of(folder, 11), range(12), strict=False):
        start = int(x["input"][0])
        assert start % WIDTH == 0
        assert torch.equal(x["input"], torch.arange(start, start + 16))
        assert torch.equal(y, torch.arange(start + 1, start + 17))


def test_a_shard_cut_while_training_reads_it_is_one_line(tmp_path):
    folder = write_prepared(tmp_path / "p", 3, 34)
    dataset = open_sources([MixSource("p", str(folder), 1.0)])[0]  # sizes checked here
    (folder / "shard-00001.bin").write_bytes(bytes(40))  # 10 of its 34 uint32 tokens
    assert dataset.read(0, 34).tolist() == list(range(34))
    with pytest.raises(ConfigError, match=r"shard-00001.bin ends before token 20 \(the manifest"):
        dataset.read(34, 20)
