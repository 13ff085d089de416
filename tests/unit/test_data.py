"""Data and tokenizer: default BPE cache and determinism, HF/tiktoken loading, local files,
one-line errors, and batches from torchtitan's dataloader."""

from __future__ import annotations

import gzip
import itertools
import json
import threading
import time
from pathlib import Path

import datasets
import pytest
import torch
from torchtitan.config import ConfigManager

from boost_titan.config.errors import ConfigError
from boost_titan.data import (
    DEFAULT_VOCAB_SIZE,
    build_dataloader,
    build_tokenizer,
    corpus,
    model_vocab_size,
    prepare_default_assets,
    probe,
    tokenizer_vocab_size,
)
from boost_titan.data import tokenizer as tk
from tests.helpers.corpus import write_tiktoken

TEXT = 'def greet(name: str) -> str:\n    return f"héllo, {name}!"  # ünïcode ✓\n'


@pytest.fixture(autouse=True)
def caches(tmp_path_factory, monkeypatch):
    """Keep the tokenizer and `datasets` caches out of the user's home."""
    monkeypatch.setenv("BOOST_TITAN_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.setattr(
        datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.getbasetemp() / "hf")
    )


def job_config(*args: str):
    return ConfigManager().parse_args(["--job.custom_config_module=boost_titan.config", *args])


def one_line_error(excinfo: pytest.ExceptionInfo) -> str:
    message = str(excinfo.value)
    assert message and "\n" not in message
    return message


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts)))
    return path


# ---- default tokenizer -------------------------------------------------------------
def test_default_tokenizer_is_deterministic_and_cached(tmp_path, monkeypatch):
    published = []
    for name in ("a", "b"):
        monkeypatch.setenv("BOOST_TITAN_CACHE", str(tmp_path / name))
        published.append(prepare_default_assets())
    assert published[0].name == published[1].name
    assert published[0].name.startswith("tokenizer-")
    assert (published[0] / "tokenizer.json").read_bytes() == (
        published[1] / "tokenizer.json"
    ).read_bytes()
    assert [p.name for p in (tmp_path / "b").iterdir()] == [published[1].name]  # no temp left

    def no_training():
        raise AssertionError("retrained a cached tokenizer")

    monkeypatch.setattr(tk, "train_default_tokenizer", no_training)
    assert prepare_default_assets() == published[1]


@pytest.mark.parametrize("assets", ["", "default", "./tests/assets/tokenizer"])
def test_default_tokenizer_round_trip(assets):
    config = job_config("--model.hf_assets_path", assets)
    tok = build_tokenizer(config)
    ids = tok.encode(TEXT)
    assert (ids[0], ids[-1]) == (tok.bos_id, tok.eos_id)
    assert (tok.token_to_id("<|bos|>"), tok.token_to_id("<|eos|>")) == (0, 1)
    assert tok.decode(ids) == TEXT
    assert tok.encode(TEXT, add_bos=False, add_eos=False) == ids[1:-1]
    assert tok.get_vocab_size() == tokenizer_vocab_size(config) == DEFAULT_VOCAB_SIZE
    assert max(ids) < DEFAULT_VOCAB_SIZE


def test_hf_tokenizer_dir_and_file():
    cached = prepare_default_assets()
    for assets in (cached, cached / "tokenizer.json"):
        tok = build_tokenizer(job_config("--model.hf_assets_path", str(assets)))
        assert tok.decode(tok.encode(TEXT)) == TEXT
        assert tok.bos_id == 0


# ---- tiktoken ------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["dir", "model", "tiktoken"])
def test_tiktoken_file(tmp_path, layout):
    name = {"dir": "tokenizer.model", "model": "tokenizer.model", "tiktoken": "x.tiktoken"}[layout]
    path = write_tiktoken(tmp_path / name)
    # torchtitan's ConfigManager refuses a path ending in tokenizer.model: set it afterwards
    config = job_config()
    config.model.hf_assets_path = str(tmp_path if layout == "dir" else path)
    tok = build_tokenizer(config)
    assert isinstance(tok, tk.TiktokenTokenizer)
    assert (tok.bos_id, tok.eos_id) == (260, 261)
    assert tok.get_vocab_size() == tokenizer_vocab_size(config) == 262
    ids = tok.encode("hello <|end_of_text|>")
    assert ids[:2] == [260, 259] and ids[-1] == 261  # "hello" is one merged token
    assert tok.decode(ids[1:-1]) == "hello <|end_of_text|>"  # special text stays text
    for text in (TEXT, " " * 100_000 + "hello"):  # long runs overflow tiktoken's regex
        assert tok.decode(tok.encode(text, add_bos=False, add_eos=False)) == text


def test_tokenizer_errors(tmp_path):
    bad = tmp_path / "tokenizer.model"
    bad.write_bytes(b"\n\x08\x01\x12\x03<s>\x15\x00\x00\x00\x00 protobuf-ish\n")
    cases = {
        str(tmp_path / "missing"): "does not exist",
        str(bad): "SentencePiece",
        str(write_jsonl(tmp_path / "x.jsonl", ["a"])): "no tokenizer",
    }
    for assets, words in cases.items():
        with pytest.raises(ConfigError) as excinfo:
            tk.load_tokenizer(assets)
        assert words in one_line_error(excinfo)


def test_model_vocab_size():
    """The flavor's vocab; the tokenizer's where the flavor has none; grown to the
    tokenizer's, padded to a multiple of 256, where the tokenizer has more (Llama 3)."""
    assert model_vocab_size(4096, 32000, "60M") == 32000
    assert model_vocab_size(258, 0, "debug") == 258  # 0: vocab taken from the tokenizer
    assert model_vocab_size(128002, 32000, "7B") == 128256
    assert model_vocab_size(32001, 32000, "7B") == 32256


# ---- corpora ---------------------------------------------------------------------------
def test_stdlib_corpus():
    root = corpus.stdlib_root()
    files = corpus.python_files(root)
    assert files == sorted(files) and len(files) > 200
    assert not any(corpus.SKIPPED_DIRS & set(p.relative_to(root).parts) for p in files)
    ds = corpus.load_python_sources(corpus.stdlib_root())
    assert ds.column_names == ["text"] and len(ds) == len(corpus.split_files(root, held_out=False))


def _texts(path: Path) -> list[str]:
    """Every document of the local files at `path`, as the loader streams them."""
    return list(corpus.documents(corpus.load_local(str(path)), str(path)))


def test_local_formats(tmp_path):
    jsonl = write_jsonl(tmp_path / "a.jsonl", ["one", "two"])
    txt = tmp_path / "b.txt"
    txt.write_text("para one\nline two\n\npara two\n")
    parquet = tmp_path / "c.parquet"
    datasets.Dataset.from_dict({"text": ["p1", "p2", "p3"], "n": [1, 2, 3]}).to_parquet(parquet)
    assert _texts(jsonl) == ["one", "two"]
    assert _texts(txt) == ["para one\nline two", "para two\n"]
    assert _texts(parquet) == ["p1", "p2", "p3"]
    assert sorted(_texts(tmp_path)) == sorted(
        ["one", "two", "para one\nline two", "para two\n", "p1", "p2", "p3"]
    )


def test_dataset_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "data.csv").write_text("text\nx\n")
    (tmp_path / "notext.jsonl").write_text('{"body": "x"}\n')
    (tmp_path / "zero.jsonl").write_text("")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    (tmp_path / "packed").mkdir()
    (tmp_path / "packed" / "a.jsonl.gz").write_bytes(gzip.compress(b'{"text": "x"}\n'))
    cases = {
        ("local", str(tmp_path / "nope.jsonl")): "does not exist",
        ("local", str(tmp_path / "data.csv")): "unsupported extension",
        ("local", str(tmp_path / "packed")): "a.jsonl.gz is compressed, which training reads "
        "only prepared; run python -m boost_titan.prepare",
        ("local", str(tmp_path / "packed" / "a.jsonl.gz")): "a.jsonl.gz is compressed",
        ("local", str(tmp_path / "empty")): "holds no",
        ("local", str(tmp_path / "notext.jsonl")): "no 'text' field",
        ("local", str(tmp_path / "zero.jsonl")): "holds no documents",
        ("local", str(tmp_path / "bad.jsonl")): "cannot read the files under",
        ("local", str(write_jsonl(tmp_path / "blank.jsonl", ["", "  \n"]))): "empty",
        ("local", str(write_jsonl(tmp_path / "one.jsonl", ["only"]))): "fewer than the 2",
        ("local", ""): "needs a path",
        ("wikipedia", ""): "unknown training.dataset",
    }
    for (name, path), words in cases.items():
        args = ["--training.dataset", name] + (["--training.dataset_path", path] if path else [])
        with pytest.raises(ConfigError) as excinfo:
            build_dataloader(2, 0, tk.load_tokenizer("default"), job_config(*args))
        assert words in one_line_error(excinfo)


# ---- probe: check's sample decode agrees with the loader ------------------------------------
def _parquet(path: Path, **columns) -> None:
    datasets.Dataset.from_dict(columns).to_parquet(path)


PROBED = {
    # name: (file name, writer) -> the loader and the probe both accept, or both refuse
    "jsonl": ("a.jsonl", lambda p: write_jsonl(p, ["one", "two"])),
    "jsonl with BOM": ("a.jsonl", lambda p: p.write_bytes(b"\xef\xbb\xbf" + b'{"text": "x"}\n')),
    "json array of objects": ("a.json", lambda p: p.write_text('[{"text": "x"}, {"text": "y"}]')),
    "json array of strings": ("a.json", lambda p: p.write_text('["x", "y"]')),
    "json array with BOM": (
        "a.json",
        lambda p: p.write_bytes(b"\xef\xbb\xbf" + b'[{"text": "x"}]'),
    ),
    "txt": ("b.txt", lambda p: p.write_text(TEXT)),
    "parquet": ("c.parquet", lambda p: _parquet(p, text=["p1", "p2"])),
    "jsonl garbage": ("a.jsonl", lambda p: p.write_bytes(b"\x8f\xff\x00garbage\n" * 8)),
    "jsonl not an object": ("a.jsonl", lambda p: p.write_text('"just a string"\n')),
    "jsonl text not a string": ("a.jsonl", lambda p: p.write_text('{"text": 5}\n{"text": 6}\n')),
    "jsonl text sometimes a number": (
        "a.jsonl",
        lambda p: p.write_text('{"text": "a"}\n{"text": 6}\n'),
    ),
    "jsonl without text": ("a.jsonl", lambda p: p.write_text('{"body": "x"}\n')),
    "json array of numbers": ("a.json", lambda p: p.write_text("[1, 2]")),
    "txt latin-1": ("b.txt", lambda p: p.write_bytes("café\n".encode("latin-1"))),
    "parquet garbage": ("c.parquet", lambda p: p.write_bytes(b"PAR1" + b"\x00" * 64)),
    "parquet without text": ("c.parquet", lambda p: _parquet(p, body=["x"])),
    "parquet text not a string": ("c.parquet", lambda p: _parquet(p, text=[1, 2])),
}


@pytest.mark.parametrize("case", list(PROBED))
def test_probe_agrees_with_the_loader(tmp_path, case):
    """`boost_titan.check` refuses a file (one line naming it) exactly when the loader the
    workers run refuses it, so the probe neither misses damage in its sample nor blocks a
    file the loader reads."""
    name, write = PROBED[case]
    path = tmp_path / name
    write(path)
    try:
        _texts(path)
        loaded = None
    except ConfigError as e:
        loaded = str(e)
    try:
        probe.probe_files([path])
        probed = None
    except ConfigError as e:
        probed = str(e)
        assert f"training.dataset_path: {path} " in probed and "\n" not in probed
    assert (probed is None) == (loaded is None), (probed, loaded)


def test_probe_reads_a_sample(tmp_path):
    """Damage past the sample is left to the loader; sizes shrink with the file count."""
    path = tmp_path / "big.txt"
    path.write_bytes(b"x" * probe.MAX_SAMPLE + b"\xff")
    probe.probe_files([path])
    path.write_bytes(b"x" * (probe.MAX_SAMPLE - 1) + b"\xff")
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        probe.probe_files([path])
    assert (
        probe.sample_bytes(1) == probe.MAX_SAMPLE and probe.sample_bytes(10**6) == probe.MIN_SAMPLE
    )


# ---- dataloader ------------------------------------------------------------------------
def check_batches(loader, n: int, batch: int, seq: int, vocab: int) -> list:
    batches = list(itertools.islice(loader, n))
    assert len(batches) == n
    for inputs, labels in batches:
        assert inputs["input"].shape == labels.shape == (batch, seq)
        assert inputs["input"].dtype == labels.dtype == torch.int64
        assert 0 <= int(inputs["input"].min()) and int(inputs["input"].max()) < vocab
        assert (inputs["input"][:, 1:] == labels[:, :-1]).all()
    return batches


def test_default_dataloader():
    config = job_config("--training.local_batch_size", "2", "--training.seq_len", "64")
    tok = build_tokenizer(config)
    loader = build_dataloader(2, 1, tok, config)  # torchtitan's default name maps to stdlib
    assert loader.dataset.dataset_name == "stdlib"
    check_batches(loader, 3, 2, 64, tokenizer_vocab_size(config))


def test_local_dataloader_loops_forever(tmp_path):
    path = write_jsonl(tmp_path / "tiny.jsonl", ["print('hi')", "x = 1"])
    config = job_config(
        "--training.dataset_path",
        str(path),
        "--training.local_batch_size",
        "2",
        "--training.seq_len",
        "16",
    )
    tok = build_tokenizer(config)
    loader = build_dataloader(1, 0, tok, config)
    assert loader.dataset.dataset_name == "local"
    # two tiny documents hold far fewer than the 20 * 2 * 17 tokens drawn: it re-loops
    batches = check_batches(loader, 20, 2, 16, tok.get_vocab_size())
    assert tok.bos_id in batches[-1][0]["input"]


def test_dataloader_resumes_exactly(tmp_path):
    docs = [f"doc {i}: " + "word " * (3 * i) for i in range(6)]
    config = job_config(
        "--training.dataset_path",
        str(write_jsonl(tmp_path / "d.jsonl", docs)),
        "--training.local_batch_size",
        "2",
        "--training.seq_len",
        "8",
    )
    tok = build_tokenizer(config)
    loader = build_dataloader(1, 0, tok, config)
    first = iter(loader)
    for _ in range(5):
        next(first)
    state = loader.state_dict()
    expected = [labels for _, labels in itertools.islice(first, 6)]
    resumed = build_dataloader(1, 0, tok, config)
    resumed.load_state_dict(state)
    got = [labels for _, labels in itertools.islice(resumed, 6)]
    assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


def test_raw_files_are_streamed(tmp_path):
    """The first batch comes before the corpus is read whole (no conversion, no full pass):
    a damaged file after the first is met later, while training, as one line."""
    write_jsonl(tmp_path / "a.jsonl", [f"document {i} " + "word " * i for i in range(20)])
    (tmp_path / "b.jsonl").write_text('{"text": "fine"}\n{not json\n')
    config = job_config(
        "--training.dataset_path",
        str(tmp_path),
        "--training.local_batch_size",
        "2",
        "--training.seq_len",
        "16",
    )
    batches = iter(build_dataloader(1, 0, build_tokenizer(config), config))
    next(batches)
    with pytest.raises(ConfigError) as excinfo:
        for _ in range(100):  # a.jsonl holds about 10 batches
            next(batches)
    assert f"cannot read the files under {tmp_path} (" in one_line_error(excinfo)


def test_text_stream_packs_as_torchtitan(tmp_path):
    """The tokenize-ahead stream yields torchtitan's windows, in its order, for the default
    corpus (the losses README quotes) and for a streamed local corpus past a re-loop."""
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset

    from boost_titan.data.text_stream import TextDataset

    tok = build_tokenizer(job_config())
    local = str(_varied_docs(tmp_path))
    for name, path, count in (("stdlib", None, 60), ("local", local, 40)):
        for rank in (0, 1):
            args = (name, path, tok, 32, rank, 2, True)
            ours = itertools.islice(TextDataset(*args), count)
            theirs = itertools.islice(HuggingFaceTextDataset(*args), count)
            for (a, x), (b, y) in zip(ours, theirs, strict=True):
                assert torch.equal(a["input"], b["input"]) and torch.equal(x, y)


def test_documents_are_tokenized_ahead(tmp_path, monkeypatch):
    """While the trainer works on a batch, the next documents are tokenized on another
    thread, so the next `next()` does not wait for them."""
    from boost_titan.data import text_stream

    config = job_config(
        "--training.dataset_path",
        str(_varied_docs(tmp_path)),
        "--training.seq_len",
        "8",
        "--training.local_batch_size",
        "1",
    )
    threads: list[str] = []
    encode = text_stream.encode_document

    def recorded(*args):
        threads.append(threading.current_thread().name)
        return encode(*args)

    monkeypatch.setattr(text_stream, "encode_document", recorded)
    loader = build_dataloader(1, 0, build_tokenizer(config), config)
    next(iter(loader))
    read = loader.dataset._sample_idx + text_stream.AHEAD  # packed, and tokenized ahead
    deadline = time.monotonic() + 10
    while len(threads) < read and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(threads) == read
    assert all(name.startswith("tokenize-ahead") for name in threads)


def test_encode_document_agrees_with_the_tokenizer(tmp_path):
    """The GIL-free encoding gives the tokenizer's own ids (BOS and EOS included) for the
    default tokenizer, one with only an EOS, one with neither, and tiktoken."""
    from boost_titan.data.text_stream import encode_document

    eos_only, bare = tmp_path / "eos_only", tmp_path / "bare"
    default = build_tokenizer(job_config())
    for folder in (eos_only, bare):
        folder.mkdir()
        default.tokenizer.save(str(folder / "tokenizer.json"))
    (eos_only / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|eos|>"}))
    tokenizers = [default, tk.load_tokenizer(str(eos_only)), tk.load_tokenizer(str(bare))]
    write_tiktoken(tmp_path / "tiktoken" / "tokenizer.model")
    tokenizers.append(tk.load_tokenizer(str(tmp_path / "tiktoken")))
    for tok in tokenizers:
        assert encode_document(tok, TEXT) == tok.encode(TEXT, add_bos=True, add_eos=True)
    assert tokenizers[1].bos_id is None and tokenizers[1].eos_id is not None
    assert tokenizers[2].bos_id is None and tokenizers[2].eos_id is None


# ---- data order ----------------------------------------------------------------------------
def _varied_docs(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "d.jsonl", [f"doc {i}: " + "word " * (2 * i) for i in range(12)])


def _labels(loader, batches: int) -> list[torch.Tensor]:
    return [labels for _, labels in itertools.islice(loader, batches)]


def _global_batches(dp: int, path: Path, order: str, batches: int = 8) -> list[torch.Tensor]:
    """The first global batches (4 windows of 8 + 1 tokens) at DP degree `dp`: every
    rank's rows of each step, rank by rank."""
    config = job_config(
        "--training.dataset_path",
        str(path),
        "--training.seq_len",
        "8",
        "--training.local_batch_size",
        str(4 // dp),
        "--boost.data_order",
        order,
    )
    tok = build_tokenizer(config)
    ranks = [_labels(build_dataloader(dp, r, tok, config), batches) for r in range(dp)]
    return [torch.cat(step) for step in zip(*ranks, strict=True)]


def test_global_order_batches_do_not_depend_on_the_dp_degree(tmp_path):
    path = _varied_docs(tmp_path)
    one = _global_batches(1, path, "global")
    assert all(
        torch.equal(a, b) for a, b in zip(one, _global_batches(1, path, "sharded"), strict=True)
    )
    for dp in (2, 4):
        assert all(
            torch.equal(a, b) for a, b in zip(one, _global_batches(dp, path, "global"), strict=True)
        )
    # TorchTitan's sharded order trains DP 2 on other windows
    assert not all(
        torch.equal(a, b) for a, b in zip(one, _global_batches(2, path, "sharded"), strict=True)
    )


def test_global_order_resumes_exactly(tmp_path):
    config = job_config(
        "--training.dataset_path",
        str(_varied_docs(tmp_path)),
        "--training.seq_len",
        "8",
        "--training.local_batch_size",
        "2",
        "--boost.data_order",
        "global",
    )
    tok = build_tokenizer(config)
    for rank in (0, 1):
        loader = build_dataloader(2, rank, tok, config)
        first = iter(loader)
        for _ in range(5):  # past the end of the documents: the stream re-loops
            next(first)
        state = loader.state_dict()
        expected = _labels(first, 6)
        resumed = build_dataloader(2, rank, tok, config)
        resumed.load_state_dict(state)
        assert all(torch.equal(a, b) for a, b in zip(expected, _labels(resumed, 6), strict=True))
