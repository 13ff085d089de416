"""The random bf16 model of the float8 tests (one process and gloo ranks)."""

from __future__ import annotations

import torch

from boost_titan.boost_llama import BoostTransformer, flavor_args
from tests.helpers.distributed import randomize

BATCH, SEQ, DIM = 2, 32, 64


def build_model(arch: str, rank: int = 32) -> BoostTransformer:
    """A 2-layer bf16 model, every parameter random."""
    torch.manual_seed(0)
    args = flavor_args(
        "debug",
        vocab_size=64,
        arch=arch,
        dim=DIM,
        n_heads=4,
        ffn_dim=128,
        n_layers=2,
        rank=rank,
        max_seq_len=SEQ,
    )
    model = BoostTransformer(args)
    model.init_weights()
    randomize(model)
    return model.to(torch.bfloat16)
