"""A real-data job in miniature, written by the test: a tiktoken BPE file (the format of
Llama 3's `original/tokenizer.model`) and a JSON-lines corpus, nothing downloaded."""

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
