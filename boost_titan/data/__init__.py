"""Data and tokenizer: offline corpora fed through torchtitan's text dataloader.

Importing this package sets HF_DATASETS_OFFLINE and HF_HUB_OFFLINE (unless already set),
so `datasets` never reaches the network. It imports torchtitan.
"""

import os

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from boost_titan.data.corpus import build_dataloader
from boost_titan.data.tokenizer import (
    DEFAULT_TOKENIZER,
    DEFAULT_VOCAB_SIZE,
    build_tokenizer,
    model_vocab_size,
    prepare_default_assets,
    tokenizer_vocab_size,
)

__all__ = [
    "DEFAULT_TOKENIZER",
    "DEFAULT_VOCAB_SIZE",
    "build_dataloader",
    "build_tokenizer",
    "model_vocab_size",
    "prepare_default_assets",
    "tokenizer_vocab_size",
]
