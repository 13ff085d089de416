"""A real-data job in miniature, written by the test: a tiktoken BPE file (the format of
Llama 3's `original/tokenizer.model`) and a JSON-lines corpus, nothing downloaded; and a
small Hugging Face `tokenizer.json` for TorchTitan's own models (`write_hf_tokenizer`)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

MERGES = [b"he", b"ll", b"hell", b"hello"]
"""Merged tokens after the 256 single bytes: ids 256-259, then BOS 260 and EOS 261."""


def write_tiktoken(path: Path) -> Path:
    """A tiktoken BPE file (`<base64 token> <rank>` lines) of the 256 bytes and `MERGES`."""
    tokens = [bytes([b]) for b in range(256)] + MERGES
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(tokens)))
    return path


def write_corpus(folder: Path, documents: int = 64) -> tuple[Path, Path]:
    """(corpus.jsonl, tokenizer folder holding tokenizer.model) under `folder`: the two
    paths a real-data run passes as --training.dataset_path and --model.hf_assets_path."""
    tokenizer = folder / "llama3-like" / "original"
    write_tiktoken(tokenizer / "tokenizer.model")
    lines = [
        json.dumps({"text": f"Document {i}: hello world, the quick brown fox {i % 7} jumps. " * 8})
        for i in range(documents)
    ]
    corpus = folder / "corpus.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    return corpus, tokenizer


def real_data_args(folder: Path) -> list[str]:
    """The documented real-data flags on files written under `folder`."""
    corpus, tokenizer = write_corpus(folder)
    return ["--training.dataset_path", str(corpus), "--model.hf_assets_path", str(tokenizer)]


def write_hf_tokenizer(folder: Path, vocab_size: int = 512) -> Path:
    """A byte-level BPE `tokenizer.json` of at most `vocab_size` tokens, with the default
    tokenizer's BOS/EOS in `tokenizer_config.json`: small enough for TorchTitan's llama3
    debugmodel (2048 embeddings), which loads tokenizers through Hugging Face's files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from boost_titan.data.tokenizer import BOS_TOKEN, EOS_TOKEN

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(["def f(x):\n    return x + 1\n"] * 64, trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "add_bos_token": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"add_eos_token": True}))
    return folder
