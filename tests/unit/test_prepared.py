"""Prepared datasets (`python -m boost_titan.prepare`) and blending: chunking, bytes that do
not depend on the worker count, resuming an interrupted preparation, the token stream
equal to torchtitan's packing of the same documents, exact resume of the loader (also at
another data-parallel degree), and blend shares. The bad inputs `check` refuses are in
test_bad_inputs.py."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torchtitan.config import ConfigManager
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset

from boost_titan.boost_llama.spec import refuse_toy_corpus
from boost_titan.config.errors import ConfigError
from boost_titan.data import build_dataloader, prepare_default_assets
from boost_titan.data import prepare_corpus as pc
from boost_titan.data.corpus import separator_warning
from boost_titan.data.documents import Chunk, documents, plan_chunks
from boost_titan.data.held_out import validation_data
from boost_titan.data.loader import CheckpointedDataloader
from boost_titan.data.mix import MixedWindows, MixSource, open_sources, parse_mix
from boost_titan.data.tokenizer import load_tokenizer
from boost_titan.job import preflight

WORDS = "the quick brown fox jumps over a lazy dog while data shards blend tokens".split()


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    """Keep the default tokenizer's cache out of the user's home."""
    monkeypatch.setenv("BOOST_TITAN_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def write_corpus(folder: Path, docs: int = 300, seed: int = 0) -> Path:
    """JSON lines, paragraphs of text (blank-line runs of 1-3 lines) and parquet."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "a.jsonl", "w") as f:
        for _ in range(docs):
            f.write(json.dumps({"text": sentence(rng, rng.randint(1, 60))}) + "\n")
        f.write("\n")  # a blank line is no document
    paragraphs = [
        "\n".join(sentence(rng, 8) for _ in range(rng.randint(1, 3))) for _ in range(docs)
    ]
    blank = lambda: "\n" * rng.randint(2, 4) + " " * rng.randint(0, 1)  # noqa: E731
    (folder / "b.txt").write_text("".join(p + blank() for p in paragraphs))
    table = pa.table({"text": [sentence(rng, rng.randint(1, 30)) for _ in range(docs)]})
    pq.write_table(table, folder / "c.parquet", row_group_size=64)
    return folder


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def prepare(corpus: Path, out: Path, workers: int = 1, **options) -> dict:
    plan = pc.make_plan([str(corpus)], "default", **{"chunk_mb": 0.002, **options})
    return pc.prepare(plan, str(out), workers)


def test_chunks_hold_every_document_once(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    for name in ("a.jsonl", "b.txt"):
        path = corpus / name
        whole = list(documents(Chunk(str(path), 0, path.stat().st_size)))
        assert len(whole) == 300
        for size in (1, 17, 500, 4096):
            assert [d for c in plan_chunks([path], size) for d in documents(c)] == whole, size
    paragraph = list(documents(Chunk(str(corpus / "b.txt"), 0, 10**9)))[0]
    assert paragraph == (corpus / "b.txt").read_text().split("\n\n")[0]


def test_bytes_do_not_depend_on_the_worker_count(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    one = prepare(corpus, tmp_path / "one", workers=1)
    two = prepare(corpus, tmp_path / "two", workers=2)
    assert one == two
    assert len(one["shards"]) > 4 and one["held_out_documents"] > 0
    assert one["documents"] + one["held_out_documents"] == 900
    assert folder_bytes(tmp_path / "one") == folder_bytes(tmp_path / "two")


def test_an_interrupted_preparation_finishes_with_the_same_bytes(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path / "corpus")
    prepare(corpus, tmp_path / "whole")
    write, calls = pc.write_shard, []

    def interrupted(out, index, plan):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(index)
        return write(out, index, plan)

    monkeypatch.setattr(pc, "write_shard", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare(corpus, tmp_path / "resumed")
    assert not (tmp_path / "resumed" / "manifest.json").exists()
    rewritten = []
    monkeypatch.setattr(pc, "write_shard", lambda *a: (rewritten.append(a[1]), write(*a))[1])
    prepare(corpus, tmp_path / "resumed")
    assert calls == [0, 1, 2] and rewritten[0] == 3  # the written shards are not redone
    assert folder_bytes(tmp_path / "whole") == folder_bytes(tmp_path / "resumed")
    with pytest.raises(ConfigError, match="holds a preparation of other inputs"):
        prepare(corpus, tmp_path / "resumed", held_out_percent=5)


def test_the_stream_is_torchtitans_packing(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    prepare(corpus / "a.jsonl", tmp_path / "p", held_out_percent=0)
    packed = HuggingFaceTextDataset(
        "local", str(corpus / "a.jsonl"), load_tokenizer("default"), 32, infinite=False
    )
    sources = [MixSource("a", str(tmp_path / "p"), 1.0)]
    ours = MixedWindows(sources, open_sources(sources), 32)
    pairs = list(zip(packed, ours, strict=False))
    assert len(pairs) == ours.windows[0] > 10
    for (x, y), (a, b) in pairs:
        assert torch.equal(x["input"], a["input"]) and torch.equal(y, b)


def test_a_tokenizer_without_bos_and_eos_needs_a_separator(tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(prepare_default_assets() / "tokenizer.json", bare)  # no tokenizer_config.json
    corpus = write_corpus(tmp_path / "corpus", docs=20)
    with pytest.raises(ConfigError, match="no BOS or EOS token") as e:
        pc.make_plan([str(corpus)], str(bare))
    assert "\n" not in str(e.value)
    plan = pc.make_plan([str(corpus / "a.jsonl")], str(bare), separator="<|eos|>", chunk_mb=1)
    pc.prepare(plan, str(tmp_path / "p"))
    tokens = (tmp_path / "p" / "shard-00000.bin").read_bytes()
    ends = memoryview((tmp_path / "p" / "shard-00000.idx").read_bytes()).cast("Q")
    ids = memoryview(tokens).cast("H")
    eos = plan["tokenizer"]["separator_id"]
    assert [ids[e - 1] for e in ends] == [eos] * len(ends) and eos not in ids[: ends[0] - 1]
    warning = separator_warning(load_tokenizer(str(bare)), str(bare))  # raw files: warned
    assert "no BOS or EOS token" in warning and "\n" not in warning
    assert separator_warning(load_tokenizer("default"), "default") is None


def test_check_points_a_large_raw_corpus_at_prepare(tmp_path, monkeypatch):
    path = write_corpus(tmp_path / "corpus", docs=20) / "a.jsonl"
    config = job("--training.dataset_path", str(path))
    assert preflight.check_data(config) == ""
    monkeypatch.setattr(preflight, "LARGE_RAW_CORPUS", path.stat().st_size - 1)
    assert "tokenize it once with python -m boost_titan.prepare" in preflight.check_data(config)


def job(*args: str):
    return ConfigManager().parse_args(["--job.custom_config_module=boost_titan.config", *args])


def batches(loader, n: int) -> list[torch.Tensor]:
    return [x["input"] for x, _ in (b for b, _ in zip(loader, range(n), strict=False))]


def loader_of(config, dp: int, rank: int) -> CheckpointedDataloader:
    return build_dataloader(dp, rank, load_tokenizer("default"), config)


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("mix")
    out = []
    for i in (0, 1):
        corpus = write_corpus(root / f"corpus{i}", docs=200, seed=i)
        plan = pc.make_plan([str(corpus)], "default", chunk_mb=0.01)
        pc.prepare(plan, str(root / f"p{i}"))
        out.append(root / f"p{i}")
    return out


def mix_job(sources: list[Path], batch: int, *args: str):
    spec = f"web={sources[0]}:0.7,code={sources[1]}:0.3"
    return job(
        "--boost.data_mix", spec, "--training.seq_len", "16",
        "--training.local_batch_size", str(batch), *args,
    )  # fmt: skip


def test_loader_resumes_exactly_and_at_another_dp_degree(two_sources):
    """Two ranks at local batch 2 train on the rows a single process reads at local batch
    4, and rank 0's saved state resumes a single process at the next global batch; the
    windows are shuffled ([boost] data_shuffle's default: not the input order)."""
    single = loader_of(mix_job(two_sources, 4), 1, 0)
    reference = [torch.cat(b) for b in zip(*[iter(batches(single, 6))], strict=True)]
    in_order = batches(loader_of(mix_job(two_sources, 4, "--boost.no_data_shuffle"), 1, 0), 1)
    assert not torch.equal(in_order[0], reference[0])
    ranks = [loader_of(mix_job(two_sources, 2), 2, r) for r in (0, 1)]
    its = [iter(r) for r in ranks]
    for step in range(3):
        rows = [next(it)[0]["input"] for it in its]
        assert torch.equal(torch.cat(rows), reference[step])
    state = ranks[0].state_dict()
    assert state == ranks[1].state_dict()  # one position for every rank
    resumed = loader_of(mix_job(two_sources, 4), 1, 0)
    resumed.load_state_dict(state)
    assert [torch.equal(a, b) for a, b in zip(batches(resumed, 3), reference[3:], strict=True)] == [
        True
    ] * 3


def test_blend_shares_and_determinism(two_sources):
    spec = [MixSource("web", str(two_sources[0]), 0.7), MixSource("code", str(two_sources[1]), 0.3)]
    mixed = MixedWindows(spec, open_sources(spec), 16, local_batch_size=10)
    first = [x["input"] for x, _ in (s for s, _ in zip(mixed, range(500), strict=False))]
    again = MixedWindows(spec, open_sources(spec), 16, local_batch_size=10)
    second = [x["input"] for x, _ in (s for s, _ in zip(again, range(500), strict=False))]
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert mixed.taken == [350, 150]  # every prefix within one window of the weights
    assert abs(mixed.shares()["web"] - 0.7) < 0.01
    epochs = mixed.epochs()
    assert epochs == {"web": 350 / mixed.windows[0], "code": 150 / mixed.windows[1]}
    assert f"web 70.0% ({epochs['web']:.2f} epochs), code 30.0% (" in mixed.shares_line()
    for g in range(1, 500):
        taken = [0, 0]
        for w in range(g):
            taken[mixed.pick(w, taken)] += 1
        assert abs(taken[0] - 0.7 * g) < 1, g


def test_mix_errors_are_one_line():
    for spec, fragment in [
        ("web=/a:0,code=/b:0", "weights sum to 0"),
        ("web=/a", "is not name=folder:weight"),
        ("web=/a:-1", "must be a finite number >= 0"),
        ("web=/a:1,web=/b:1", "names a source twice"),
    ]:
        with pytest.raises(ConfigError, match=fragment) as e:
            parse_mix(spec)
        assert "\n" not in str(e.value)
    assert parse_mix("a=/x:y:2") == [MixSource("a", "/x:y", 2.0)]


def test_a_mix_is_the_jobs_own_data(two_sources):
    """With [boost] data_mix (no training.dataset_path) the default corpus is neither
    validated on nor named by the toy-corpus refusal."""
    config = mix_job(two_sources, 2, "--model.flavor", "1B")
    assert validation_data(config) is None
    with pytest.raises(ConfigError) as e:
        refuse_toy_corpus(config)  # the default tokenizer still is a toy
    assert "toy corpus" not in str(e.value) and "4096-token tokenizer" in str(e.value)


def test_a_prepared_dataset_validates_on_its_held_out_documents(two_sources):
    config = job("--training.dataset_path", str(two_sources[0]))
    data = validation_data(config)
    assert data.path == str(two_sources[0] / "held_out")
    assert (
        len(list(data.texts()))
        == json.loads((two_sources[0] / "manifest.json").read_text())["held_out_documents"]
        > 0
    )
