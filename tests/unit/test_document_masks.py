"""Document-aware training (`[boost] eod_mask_loss`, `reset_position_ids`,
`reset_attention_mask`; `boost_titan.data.document_masks`): the batch's marks against a
token-by-token reading of the windows; the three options together equal to each document
run alone from position 0 (loss and every gradient, fp64, random weights, grouped K/V);
positions reaching the model; the dataloader marking prepared and raw data alike; the end
token's one-line refusals. TP 2 and 4 equal one process in tests/distributed/
test_tp_equivalence.py (`cola-btp-documents`); CP, PP and other models are refused in
test_bad_inputs.py."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.config import ConfigManager

from boost_titan.boost_llama import BoostTransformer, flavor_args
from boost_titan.config.errors import ConfigError
from boost_titan.data import build_dataloader
from boost_titan.data import prepare_corpus as pc
from boost_titan.data.document_masks import DocumentOptions, end_token
from boost_titan.data.tokenizer import load_tokenizer
from tests.helpers.distributed import randomize

EOS, VOCAB, SEQ, BATCH = 1, 32, 24, 2
ALL = DocumentOptions(EOS, mask_loss=True, reset_positions=True, separate_attention=True)
OPTIONS = ["--boost.eod_mask_loss", "--boost.reset_position_ids", "--boost.reset_attention_mask"]


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    """Keep the default tokenizer's cache out of the user's home."""
    monkeypatch.setenv("BOOST_TITAN_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def windows() -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and labels [BATCH, SEQ] of windows packing documents of 1 to 9 tokens, each
    ending in EOS; one window starts right after an EOS, one ends inside a document."""
    rng = random.Random(3)
    rows = []
    for first in (EOS, 5):
        row = [first]
        while len(row) < SEQ + 1:
            row += [rng.randrange(2, VOCAB) for _ in range(rng.randint(0, 8))] + [EOS]
        rows.append(row[: SEQ + 1])
    rows[1][-1] = 7  # the last document goes on in the next window
    w = torch.tensor(rows)
    return w[:, :-1], w[:, 1:]


def documents_of(row: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each document of a row of inputs, read token by token."""
    spans, start = [], 0
    for i, token in enumerate(row):
        if token == EOS:
            spans.append((start, i + 1))
            start = i + 1
    return spans + ([(start, len(row))] if start < len(row) else [])


def test_marks_follow_the_tokens():
    x, y = windows()
    marked, labels = ALL.mark({"input": x}, y)
    for b, row in enumerate(x.tolist()):
        spans = documents_of(row)
        assert len(spans) >= 4
        positions = [i - a for a, e in spans for i in range(a, e)]
        numbers = [n for n, (a, e) in enumerate(spans) for _ in range(a, e)]
        want = [IGNORE_INDEX if t == EOS else int(y[b, i]) for i, t in enumerate(row)]
        assert marked["positions"][b].tolist() == positions
        assert marked["documents"][b].tolist() == numbers
        assert labels[b].tolist() == want
    assert torch.equal(marked["input"], x)
    nothing = DocumentOptions(EOS).mark({"input": x}, y)
    assert set(nothing[0]) == {"input"} and torch.equal(nothing[1], y)


def model() -> BoostTransformer:
    torch.manual_seed(0)
    shape = dict(dim=32, n_heads=4, n_kv_heads=2, ffn_dim=64, n_layers=2, rank=8)
    args = flavor_args("debug", vocab_size=VOCAB, arch="cola", max_seq_len=SEQ, **shape)
    m = BoostTransformer(args)
    m.init_weights()
    randomize(m)
    return m.double()


def packed(m: BoostTransformer, options: DocumentOptions) -> tuple[torch.Tensor, dict]:
    """The trainer's loss on the marked windows (TorchTitan's: the model on the inputs and
    the extra inputs, cross-entropy summed over the valid labels / their count; in fp64)
    and grads."""
    x, y = windows()
    marked, labels = options.mark({"input": x}, y)
    extra = {k: v for k, v in marked.items() if k != "input"}
    logits = m(marked["input"], **extra)
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")
    loss = loss / (labels != IGNORE_INDEX).sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}


def one_by_one(m: BoostTransformer) -> tuple[torch.Tensor, dict]:
    """Each document of each window run alone (positions from 0), its labels those inside
    it (not its end token's, which would predict the next document), summed / their count."""
    x, y = windows()
    total, count = torch.zeros((), dtype=torch.float64), 0
    for b, row in enumerate(x.tolist()):
        for a, e in documents_of(row):
            keep = e - a - (row[e - 1] == EOS)
            if keep:
                logits = m(x[b, a:e][None])[0, :keep]
                total = total + F.cross_entropy(logits, y[b, a : a + keep], reduction="sum")
                count += keep
    loss = total / count
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}


def test_documents_apart_equal_each_document_alone():
    loss, grads = packed(model(), ALL)
    want_loss, want_grads = one_by_one(model())
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=0)
    assert grads.keys() == want_grads.keys() and len(grads) > 10
    for name, grad in want_grads.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(grads[name], grad, rtol=1e-9, atol=1e-12, msg=name)


def test_reset_positions_reach_the_model():
    """Positions alone (attention still crossing documents): the model gets each token's
    place in its document, which changes its output."""
    x, y = windows()
    marked, _ = DocumentOptions(EOS, reset_positions=True).mark({"input": x}, y)
    assert set(marked) == {"input", "positions"}
    rows = [[i - a for a, e in documents_of(r) for i in range(a, e)] for r in x.tolist()]
    m = model()
    with torch.no_grad():
        got = m(x, positions=marked["positions"])
        torch.testing.assert_close(got, m(x, positions=torch.tensor(rows)), rtol=0, atol=0)
        assert not torch.allclose(got, m(x))


def test_the_end_token_is_the_separator_else_eos():
    assert end_token([{"eos_id": 2, "separator_id": 0}], "x") == 0
    assert end_token([{"eos_id": 2, "separator_id": None}, {"eos_id": 2}], "x") == 2
    with pytest.raises(ConfigError, match="has none .no EOS, no --separator.") as e:
        end_token([{"eos_id": None, "separator_id": None}], "the data")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"different tokens \(\[2, 3\]\)"):
        end_token([{"eos_id": 2}, {"eos_id": 2, "separator_id": 3}], "x")


def job(*args: str):
    return ConfigManager().parse_args(
        ["--job.custom_config_module=boost_titan.config", "--training.seq_len", "32", *args]
    )


def first_batch(*args: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    loader = build_dataloader(1, 0, load_tokenizer("default"), job(*args))
    return next(iter(loader))


@pytest.mark.parametrize("prepared", [True, False], ids=["prepared", "raw"])
def test_the_loader_marks_prepared_and_raw_windows(tmp_path, prepared):
    """The same windows as without the options, marked at the default tokenizer's EOS."""
    corpus = tmp_path / "corpus.jsonl"
    rng = random.Random(0)
    words = "alpha beta gamma delta".split()
    lines = [{"text": " ".join(rng.choices(words, k=rng.randint(1, 12)))} for _ in range(40)]
    corpus.write_text("".join(json.dumps(line) + "\n" for line in lines))
    data: Path = corpus
    if prepared:
        data = tmp_path / "prepared"
        pc.prepare(pc.make_plan([str(corpus)], "default"), str(data))
    plain, plain_labels = first_batch("--training.dataset_path", str(data))
    marked, labels = first_batch("--training.dataset_path", str(data), *OPTIONS)
    eos = load_tokenizer("default").eos_id
    ends = plain["input"] == eos
    assert ends.sum() >= 2 and torch.equal(marked["input"], plain["input"])
    assert torch.equal(labels, plain_labels.masked_fill(ends, IGNORE_INDEX))
    want = DocumentOptions(eos, True, True, True).mark(plain, plain_labels)[0]
    for key in ("positions", "documents"):
        assert torch.equal(marked[key], want[key]), key
