"""Building blocks of the boost LLaMA family: low-rank projections, RoPE, attention.

Everything here is single-device maths. Tensor parallelism is applied from outside by the
plans in `boost_titan.parallelize`, which shard these modules' weights and swap their
forwards.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class LowRankLinear(nn.Module):
    """A d_in -> d_out projection factored through a rank-r bottleneck.

    SVD-style: ``y = B(A x)``; CoLA: ``y = B(silu(A x))``. With latent crossing (LaX, every
    block but the first) the latent also sees the same projection's latent ``h_prev`` from
    the previous block::

        h = act(LayerNorm_r(A x + G h_prev)),   y = B h

    `down` (A) and `up` (B) are plain `nn.Linear` children so plans can address them by
    FQN (``...wq.down`` / ``...wq.up``); `cross` (G) and `latent_norm` exist only with LaX.
    """

    def __init__(
        self, d_in: int, d_out: int, rank: int, activation: str, crossing: bool = False
    ) -> None:
        super().__init__()
        self.down = nn.Linear(d_in, rank, bias=False)
        self.up = nn.Linear(rank, d_out, bias=False)
        self.act = nn.SiLU() if activation == "silu" else nn.Identity()
        self.cross = nn.Linear(rank, rank, bias=False) if crossing else None
        self.latent_norm = nn.LayerNorm(rank) if crossing else None

    def latent(self, z: torch.Tensor, prev: torch.Tensor | None = None) -> torch.Tensor:
        """The bottleneck activation h from the down-projection's output z = A x."""
        if self.cross is not None:
            if prev is None:
                raise ValueError("a crossing projection needs the previous block's latent")
            z = self.latent_norm(z + self.cross(prev))
        return self.act(z)

    def project(
        self, x: torch.Tensor, prev: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(y, h): the output and the latent that the next block's crossing consumes."""
        h = self.latent(self.down(x), prev)
        return self.up(h), h

    def forward(self, x: torch.Tensor, prev: torch.Tensor | None = None) -> torch.Tensor:
        return self.project(x, prev)[0]

    @torch.no_grad()
    def init_weights(self) -> None:
        """CoLA's init: A, B ~ N(0, std^2), std = r^(-1/4) (d_in + d_out)^(-1/4)."""
        rank, d_in, d_out = self.down.out_features, self.down.in_features, self.up.out_features
        std = rank**-0.25 * (d_in + d_out) ** -0.25
        nn.init.normal_(self.down.weight, std=std)
        nn.init.normal_(self.up.weight, std=std)
        if self.cross is not None:
            nn.init.normal_(self.cross.weight, std=rank**-0.25 * (2 * rank) ** -0.25)
            self.latent_norm.reset_parameters()


def make_projection(
    arch: str, d_in: int, d_out: int, rank: int, activation: str, crossing: bool
) -> nn.Module:
    """The linear factory: a plain linear for `fullrank`, a LowRankLinear otherwise."""
    if arch == "fullrank":
        return nn.Linear(d_in, d_out, bias=False)
    return LowRankLinear(d_in, d_out, rank, activation, crossing)


@torch.no_grad()
def init_projection(projection: nn.Module, std: float) -> None:
    """CoLA init for low-rank projections; truncated normal(std) for full linears."""
    if isinstance(projection, LowRankLinear):
        projection.init_weights()
    else:
        nn.init.trunc_normal_(projection.weight, std=std, a=-3 * std, b=3 * std)


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


class CausalAttention(nn.Module):
    """Causal SDPA on [b, heads, s, head_dim] tensors; grouped K/V heads are passed as
    they are where the kernel takes them (else repeated). A module of its own so that a
    plan can address the attention op (as TorchTitan's `inner_attention`)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        repeats = q.shape[1] // k.shape[1]
        gqa = repeats > 1 and takes_grouped_kv(q, k, v)
        if repeats > 1 and not gqa:
            k, v = (t.repeat_interleave(repeats, dim=1) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


def depth_std(layer_id: int) -> float:
    """TorchTitan's depth-scaled init std for full-rank output projections."""
    return 0.02 / math.sqrt(2 * (layer_id + 1))
