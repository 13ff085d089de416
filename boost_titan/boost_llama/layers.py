"""Building blocks of the boost LLaMA family: RoPE and attention (the projections are
the architecture registry's, `archs`).

Everything here is single-device maths. Tensor parallelism is applied from outside by the
plans in `boost_titan.parallelize`, which shard these modules' weights and swap their
forwards.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def rope_table(head_dim: int, max_seq_len: int, theta: float, device=None) -> torch.Tensor:
    """[max_seq_len, head_dim // 2, 2] table of (cos, sin) for rotary embeddings."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    )
    angles = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), inv_freq)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


def apply_rope(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs of x [b, s, heads, head_dim] by the angles of its tokens'
    positions: `rows` are the RoPE table's rows for them, [s, ...] or [b, s, ...] (a longer
    table [n, ...] stands for positions 0..s-1). One complex multiply of the pairs by
    cos + i sin, as TorchTitan's `apply_rotary_emb`."""
    rotation = torch.view_as_complex(rows[..., : x.shape[1], None, :, :].float())
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * rotation).flatten(-2).type_as(x)


def takes_grouped_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether SDPA's kernel for these tensors takes grouped K/V heads as they are
    (`enable_gqa`): the CPU kernel does; on CUDA only flash attention (fp16/bf16, head_dim
    <= 256, sm80+), any other CUDA kernel would fall back to the math path."""
    if q.device.type != "cuda":
        return True
    params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, True, True)
    return torch.backends.cuda.can_use_flash_attention(params)


def document_mask(documents: torch.Tensor) -> torch.Tensor:
    """The boolean SDPA mask [b, 1, s, s] letting each token attend to itself and the
    earlier tokens of its own document; `documents` [b, s]: each token's document number.
    It holds s^2 bytes per sequence, and on CUDA keeps SDPA off the flash kernel."""
    s = documents.shape[-1]
    causal = torch.ones(s, s, dtype=torch.bool, device=documents.device).tril()
    return (documents[:, :, None] == documents[:, None, :]).logical_and(causal)[:, None]


class CausalAttention(nn.Module):
    """Causal SDPA on [b, heads, s, head_dim] tensors (with `mask`, a boolean
    `document_mask`, that mask instead); grouped K/V heads are passed as they are where the
    kernel takes them (else repeated). A module of its own so that a plan can address the
    attention op (as TorchTitan's `inner_attention`)."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        repeats = q.shape[1] // k.shape[1]
        gqa = repeats > 1 and takes_grouped_kv(q, k, v)
        if repeats > 1 and not gqa:
            k, v = (t.repeat_interleave(repeats, dim=1) for t in (k, v))
        if mask is not None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


def depth_std(layer_id: int) -> float:
    """TorchTitan's depth-scaled init std for full-rank output projections."""
    return 0.02 / math.sqrt(2 * (layer_id + 1))
