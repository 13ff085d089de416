"""Megatron-LM indexed datasets (`boost_titan.data.megatron_indexed`): a `.bin/.idx`
dataset written by hand in Megatron's layout (`tests/helpers/megatron.py`) from the corpus
that `prepare` also prepares gives the same training windows, through the same loader, as
a folder of pairs or as a prefix; each broken one is one ConfigError line. `check` on a
Megatron folder (accepted, and refused for hostile `.idx` shapes and ids past the
vocabulary, one `error:` line each): scripts/hostile_inputs.py, run by
test_hostile_inputs.py; the fuzzer over the `.idx` parser: test_input_fuzz.py."""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torchtitan.config import ConfigManager

from boost_titan.config.errors import ConfigError
from boost_titan.data import build_dataloader, megatron_indexed
from boost_titan.data import prepare_corpus as pc
from boost_titan.data.megatron_indexed import MegatronDataset
from boost_titan.data.mix import MixedWindows, MixSource, open_sources
from boost_titan.data.tokenizer import load_tokenizer
from tests.helpers.megatron import index_fields, pointers_of, rewrite_index, write_megatron

WORDS = "the quick brown fox jumps over a lazy dog while data shards blend tokens".split()
SEQ_LEN = 32
VOCAB = 4096
"""The default tokenizer's vocabulary."""


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """One corpus prepared by `prepare` (default tokenizer), and the same documents,
    tokenized here, as a Megatron folder of two uint16 pairs (the first with documents
    split into two sequences) and as one int32 prefix."""
    root = tmp_path_factory.mktemp("megatron")
    rng = random.Random(0)
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(3, 40))) for _ in range(150)]
    (root / "corpus").mkdir()
    lines = "".join(json.dumps({"text": t}) + "\n" for t in texts)
    (root / "corpus" / "a.jsonl").write_text(lines)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BOOST_TITAN_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        plan = pc.make_plan([str(root / "corpus")], "default", chunk_mb=0.002, held_out_percent=0)
        pc.prepare(plan, str(root / "prepared"))
        tokenizer = load_tokenizer("default")
        docs = [tokenizer.encode(t, add_bos=True, add_eos=True) for t in texts]
    (root / "megatron").mkdir()
    write_megatron(root / "megatron" / "part-0", docs[:70], split=5)
    write_megatron(root / "megatron" / "part-1", docs[70:])
    (root / "single").mkdir()
    write_megatron(root / "single" / "corpus_text_document", docs, dtype="int32")
    return {
        "root": root,
        "prepared": root / "prepared",
        "folder": root / "megatron",
        "prefix": root / "single" / "corpus_text_document",
    }


def windows(path: Path) -> list[torch.Tensor]:
    sources = [MixSource("x", str(path), 1.0)]
    mixed = MixedWindows(sources, open_sources(sources, VOCAB), SEQ_LEN)
    return [x["input"] for (x, _), _ in zip(mixed, range(mixed.windows[0]), strict=False)]


@pytest.mark.parametrize("name", ["folder", "prefix"])
def test_the_same_windows_as_the_prepared_corpus(data, name):
    prepared, megatron = windows(data["prepared"]), windows(data[name])
    assert len(megatron) == len(prepared) > 100
    assert all(torch.equal(a, b) for a, b in zip(prepared, megatron, strict=True))
    dataset = MegatronDataset(str(data[name]), vocab_size=VOCAB)
    assert sum(s.documents for s in dataset.shards) == 150


def test_the_product_loader_reads_the_same_batches(data, monkeypatch):
    """Two data-parallel ranks' batches through `build_dataloader`, Megatron and prepared."""
    monkeypatch.setenv("BOOST_TITAN_CACHE", str(data["root"].parent / "cache"))

    def batches(path: Path, rank: int) -> list[torch.Tensor]:
        config = ConfigManager().parse_args(
            ["--job.custom_config_module=boost_titan.config", "--training.dataset_path",
             str(path), "--training.seq_len", str(SEQ_LEN), "--training.local_batch_size", "2"]
        )  # fmt: skip
        loader = build_dataloader(2, rank, load_tokenizer("default"), config)
        return [y for (_, y), _ in zip(loader, range(4), strict=False)]

    for rank in (0, 1):
        ours, theirs = batches(data["prepared"], rank), batches(data["folder"], rank)
        assert len(theirs) == 4 and all(
            torch.equal(a, b) for a, b in zip(ours, theirs, strict=True)
        )


# ---- broken datasets, each one `error:` line from check ---------------------------------------
def _idx(**change) -> Callable[[Path], None]:
    """Rewrite the int32 prefix's `.idx` with `change` (`index_bytes`' keywords; `edit`: a
    function changing its fields in place)."""

    def case(prefix: Path) -> None:
        fields = index_fields(prefix)
        if "edit" in change:
            change["edit"](fields)
        rewrite_index(prefix, **(fields | {k: v for k, v in change.items() if k != "edit"}))

    return case


def _pointer_past_end(fields: dict) -> None:
    fields["pointers"] = pointers_of(fields["lengths"], 4)
    fields["pointers"][-1] = 1 << 40


def _bin(change: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def case(prefix: Path) -> None:
        path = prefix.with_suffix(".bin")
        path.write_bytes(change(path.read_bytes()))

    return case


def _token(value: int) -> Callable[[Path], None]:
    return _bin(lambda raw: raw[:40] + np.int32(value).tobytes() + raw[44:])


def _symlink(prefix: Path) -> None:
    outside = prefix.parent.parent / "outside.idx"
    prefix.with_suffix(".idx").rename(outside)
    prefix.with_suffix(".idx").symlink_to(outside)


def _fifo(prefix: Path) -> None:
    prefix.with_suffix(".idx").unlink()
    os.mkfifo(prefix.with_suffix(".idx"))


def _multimodal(prefix: Path) -> None:
    path = prefix.with_suffix(".idx")
    path.write_bytes(path.read_bytes() + bytes(len(index_fields(prefix)["lengths"])))


def _lone_bin(prefix: Path) -> None:
    shutil.copy(prefix.with_suffix(".bin"), prefix.parent / "stray.bin")


def _two_dtypes(prefix: Path) -> None:
    write_megatron(prefix.parent / "zz", [[1, 2, 3]], dtype="uint16")


BROKEN: dict[str, tuple[Callable[[Path], None], str]] = {
    "magic": (_idx(magic=b"MMIDIDY\x00\x00"), "is not a Megatron-LM index"),
    "version": (_idx(version=2), "version 2, not 1"),
    "float dtype": (_idx(code=7), "float32 values, not token ids"),
    "unknown dtype": (_idx(code=9), "dtype code 9"),
    "huge counts": (_idx(counts=(1 << 60, 1 << 60)), "need"),
    "pointer past the end": (_idx(edit=_pointer_past_end), "pointer is 1,099,511,627,776"),
    "negative length": (_idx(edit=lambda f: f["lengths"].__setitem__(0, -3)), "negative"),
    "documents not from 0": (
        _idx(edit=lambda f: f["document_indices"].__setitem__(0, 1)),
        "do not rise from 0",
    ),
    "last document short": (
        _idx(edit=lambda f: f["document_indices"].__setitem__(-1, 149)),
        "the last document index is 149, not 150",
    ),
    "no document indices": (_idx(document_indices=[]), "no document indices"),
    "bin shorter": (_bin(lambda raw: raw[:-4]), "past the end of the"),
    "bin longer": (_bin(lambda raw: raw + raw[:4]), "but the .bin has"),
    "bin missing": (lambda p: p.with_suffix(".bin").unlink(), "cannot be read"),
    "idx a symlink": (_symlink, "is a symlink"),
    "idx a FIFO": (_fifo, "not a regular file"),
    "multimodal": (_multimodal, "multimodal datasets"),
    "token id past the vocabulary": (_token(VOCAB), f"token id {VOCAB}, outside"),
    "negative token id": (_token(-1), "token id -1, outside"),
}
FOLDER_ONLY = {
    "bin without idx": (_lone_bin, "stray.bin has no stray.idx"),
    "two dtypes": (_two_dtypes, "different dtypes"),
}


def _broken(data: dict[str, Path], tmp_path: Path, name: str) -> Path:
    """A copy of the int32 prefix's folder broken as `name`; the path a job names."""
    breaks = (BROKEN | FOLDER_ONLY)[name][0]
    case = tmp_path / "case"
    shutil.copytree(data["prefix"].parent, case)
    breaks(case / data["prefix"].name)
    return case if name in FOLDER_ONLY else case / data["prefix"].name


@pytest.mark.parametrize("name", [*BROKEN, *FOLDER_ONLY])
def test_each_broken_dataset_is_one_line(data, tmp_path, name):
    """Opened and every shard's ids read, as the loader does: one ConfigError line."""
    path = _broken(data, tmp_path, name)
    with pytest.raises(ConfigError) as e:
        dataset = MegatronDataset(str(path), vocab_size=VOCAB)
        for index in range(len(dataset.shards)):
            dataset.check_ids(index)
    assert "\n" not in str(e.value) and (BROKEN | FOLDER_ONLY)[name][1] in str(e.value)


def test_an_index_over_the_cap_is_refused_before_it_is_read(data, monkeypatch):
    monkeypatch.setattr(megatron_indexed, "MEGATRON_INDEX_MAX_BYTES", 1000)
    with pytest.raises(ConfigError, match=r"over the 1,000 a .* may have"):
        MegatronDataset(str(data["prefix"]), vocab_size=VOCAB)


def test_ids_are_bounded_by_the_model_and_never_read_unbounded(data):
    """`check_tokenizer` lowers the bound to the model's vocabulary; a dataset opened
    without any bound refuses to read rather than read unchecked ids."""
    dataset = MegatronDataset(str(data["prefix"]), vocab_size=VOCAB)
    dataset.check_tokenizer("", "default", VOCAB, 100)
    with pytest.raises(ConfigError, match="outside the vocabulary of 100 tokens"):
        dataset.read(0, 8)
    with pytest.raises(RuntimeError, match="before its vocabulary is known"):
        MegatronDataset(str(data["prefix"])).read(0, 8)
