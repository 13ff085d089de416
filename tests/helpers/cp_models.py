"""Decoders written without boost-titan that context parallelism must not train silently
wrong (each is exact without CP): the README's `PlainDecoder` taking its tokens' places
under its own keyword, and its variants that escape torch's CP (which swaps SDPA only).

* `PositionIdsDecoder`: correct: `position_ids` [s], Hugging Face's keyword;
* `UnusedPositions`: takes `position_ids` but computes its RoPE from 0..s-1;
* `CheckedPositions`: reads `position_ids` (a bounds check) but does not use them;
* `HandWritten`: attention written by hand, softmax(QK^T)V, no SDPA;
* `BlockSDPA`: SDPA called in the block's own forward (no attention module to name).

`build(kind)` gives one with every parameter random (fp64) and its layout.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers.distributed import randomize
from tests.helpers.foreign_models import (
    CONFIG,
    PLAIN_LAYOUT,
    Attention,
    Block,
    PlainDecoder,
    rope_interleaved,
)

LAYOUT = dataclasses.replace(PLAIN_LAYOUT, attention=("attn",), positions="position_ids")


class PositionIdsDecoder(PlainDecoder):
    def forward(self, tokens, position_ids=None):
        rows = slice(tokens.shape[1]) if position_ids is None else position_ids
        x = self.tok(tokens)
        for block in self.blocks:
            x = block(x, self.angles[rows])
        return self.lm_head(self.ln_f(x))


class UnusedPositions(PositionIdsDecoder):
    def forward(self, tokens, position_ids=None):
        return super().forward(tokens)


class CheckedPositions(PositionIdsDecoder):
    def forward(self, tokens, position_ids=None):
        assert position_ids is None or int(position_ids.max()) < len(self.angles)
        return super().forward(tokens)


class HandWrittenAttention(Attention):
    def forward(self, h, angles):
        b, s, _ = h.shape
        q = rope_interleaved(self.q_proj(h).view(b, s, -1, self.hd), angles).transpose(1, 2)
        k = rope_interleaved(self.k_proj(h).view(b, s, -1, self.hd), angles).transpose(1, 2)
        v = self.v_proj(h).view(b, s, -1, self.hd).transpose(1, 2)
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
        scores = q @ k.transpose(-1, -2) / self.hd**0.5
        causal = torch.ones(s, s, dtype=torch.bool, device=h.device).tril()
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        return self.o_proj((weights @ v).transpose(1, 2).reshape(b, s, -1))


class BlockWithSDPA(Block):
    """The attention's projections are the block's; SDPA runs in the block's forward."""

    def forward(self, x, angles):
        a, (b, s, _) = self.attn, x.shape
        h = self.ln1(x)
        q = rope_interleaved(a.q_proj(h).view(b, s, -1, a.hd), angles).transpose(1, 2)
        k = rope_interleaved(a.k_proj(h).view(b, s, -1, a.hd), angles).transpose(1, 2)
        v = a.v_proj(h).view(b, s, -1, a.hd).transpose(1, 2)
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + a.o_proj(out.transpose(1, 2).reshape(b, s, -1))
        return x + self.mlp(self.ln2(x))


KINDS = {
    "position-ids": (PositionIdsDecoder, None, None),
    "unused-positions": (UnusedPositions, None, None),
    "checked-positions": (CheckedPositions, None, None),
    "hand-written": (PositionIdsDecoder, HandWrittenAttention, None),
    "block-sdpa": (PositionIdsDecoder, None, BlockWithSDPA),
}
"""kind -> (decoder class, attention class, block class; None: the plain one)."""


def build(kind: str, **layout_changes) -> tuple[nn.Module, object]:
    """The `kind` decoder, every parameter random (seed 0), fp64; and its layout."""
    decoder, attention, block = KINDS[kind]
    torch.manual_seed(0)
    model = decoder(dict(CONFIG, rank=16), act="silu")
    for b in model.blocks:
        b.__class__ = block or b.__class__
        b.attn.__class__ = attention or b.attn.__class__
    randomize(model)
    return model.double(), dataclasses.replace(LAYOUT, **layout_changes)
