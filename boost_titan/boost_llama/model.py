"""The boost LLaMA decoder: pre-norm blocks with RoPE, causal SDPA and a gated MLP.

Which projection family a model uses comes from `BoostModelArgs.arch`, a name of the
architecture registry (`archs`), which builds and initialises every projection; the module
tree is the same for all families, so plans address the same FQNs:

    tok_embeddings, layers.<i>.{attention_norm, attention.{wq,wk,wv,wo}, ffn_norm,
    feed_forward.{w1,w2,w3}}, norm, output

with ``.down`` / ``.up`` (and LaX ``.cross`` / ``.latent_norm``) under each low-rank
projection (`parallelize.LowRankLinear`). The model code knows nothing about parallelism.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .args import BoostModelArgs
from .layers import CausalAttention, apply_rope, depth_std, document_mask, rope_table


def _project(
    projection: nn.Module, x: torch.Tensor, prev: torch.Tensor | None, latents: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(output, latent) of a projection; the latent (LaX's crossing input for the next
    block) only when `latents` (the architecture's pairs then have `project`)."""
    if latents:
        return projection.project(x, prev)
    return projection(x), None


def _projections(args: BoostModelArgs, layer_id: int, *names: str) -> list[nn.Module]:
    """Block `layer_id`'s projections `names` (keys of `projection_shapes`), built by the
    architecture."""
    shapes, arch = args.projection_shapes(), args.architecture
    return [arch.projection(*shapes[n], args, layer_id) for n in names]


class Attention(nn.Module):
    """Multi-head (optionally grouped-query) attention with rotary embeddings."""

    def __init__(self, args: BoostModelArgs, layer_id: int) -> None:
        super().__init__()
        self.head_dim = args.head_dim
        self.wq, self.wk, self.wv, self.wo = _projections(args, layer_id, "q", "k", "v", "o")
        self.inner_attention = CausalAttention()

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        rope: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Causal attention over however many heads q/k/v carry (all, or a TP rank's);
        `rope`: the RoPE rows of the tokens' positions; `mask`: a `document_mask`."""
        b, s = q.shape[:2]
        q, k, v = (t.view(b, s, -1, self.head_dim) for t in (q, k, v))
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        out = self.inner_attention(*(t.transpose(1, 2) for t in (q, k, v)), mask)
        return out.transpose(1, 2).reshape(b, s, -1)


class FeedForward(nn.Module):
    """Gated MLP ``w2(gate * w3(x))``; gate = silu(w1 x), or w1 x when w1 already ends in SiLU."""

    def __init__(self, args: BoostModelArgs, layer_id: int) -> None:
        super().__init__()
        self.w1, self.w3, self.w2 = _projections(args, layer_id, "gate", "up", "down")
        self.gate_silu = not (args.low_rank and args.activation == "silu")

    def gate(self, g: torch.Tensor) -> torch.Tensor:
        return F.silu(g) if self.gate_silu else g


class TransformerBlock(nn.Module):
    """Pre-norm block. LaX latents of the previous block come in, this block's go out."""

    def __init__(self, layer_id: int, args: BoostModelArgs) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.architecture = args.architecture
        self.carries_latents = self.architecture.carries_latents
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args, layer_id)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.feed_forward = FeedForward(args, layer_id)

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor,
        prevs: Sequence[torch.Tensor] = (),
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        prev = list(prevs) or [None] * 7
        attn, mlp, lax = self.attention, self.feed_forward, self.carries_latents

        h = self.attention_norm(x)
        (q, hq), (k, hk), (v, hv) = (
            _project(p, h, prev[i], lax) for i, p in enumerate((attn.wq, attn.wk, attn.wv))
        )
        o, ho = _project(attn.wo, attn.attend(q, k, v, rope, mask), prev[3], lax)
        x = x + o

        h = self.ffn_norm(x)
        (g, hg), (u, hu) = _project(mlp.w1, h, prev[4], lax), _project(mlp.w3, h, prev[5], lax)
        d, hd = _project(mlp.w2, mlp.gate(g) * u, prev[6], lax)
        x = x + d

        latents = (hq, hk, hv, ho, hg, hu, hd) if lax else ()
        return x, latents

    @torch.no_grad()
    def init_weights(self) -> None:
        std = depth_std(self.layer_id)
        for norm in (self.attention_norm, self.ffn_norm):
            norm.reset_parameters()
        attn, mlp, init = self.attention, self.feed_forward, self.architecture.init_projection
        for projection in (attn.wq, attn.wk, attn.wv, mlp.w1):
            init(projection, 0.02)
        for projection in (attn.wo, mlp.w2, mlp.w3):
            init(projection, std)


class BoostTransformer(nn.Module):
    """Decoder-only LM. Under pipeline parallelism missing parts are None and the forward
    passes hidden states (and LaX latents) through."""

    def __init__(self, args: BoostModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(i, args) for i in range(args.n_layers)}
        )
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.register_buffer("rope", self._rope(), persistent=False)

    def _rope(self, device: torch.device | None = None) -> torch.Tensor:
        a = self.args
        return rope_table(a.head_dim, a.max_seq_len, a.rope_theta, device=device)

    def forward(
        self,
        tokens: torch.Tensor,
        *latents: torch.Tensor,
        positions: torch.Tensor | None = None,
        documents: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """`positions` [b, s] (or [s]): each token's place in its sequence, when the tokens
        are not 0..s-1 (a shard of the sequence, or packed documents); `documents` [b, s]:
        each token's document number, attention then staying within documents."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        rope = self.rope if positions is None else self.rope[positions]
        mask = None if documents is None else document_mask(documents)
        for layer in self.layers.values():
            h, latents = layer(h, rope, latents, mask)
        if self.output is None:
            return (h, *latents) if latents else h
        h = self.norm(h) if self.norm is not None else h
        return self.output(h)

    @torch.no_grad()
    def init_weights(self, buffer_device: torch.device | None = None) -> None:
        """Initialise parameters in place (after `to_empty`) and rebuild the RoPE table."""
        self.rope = self._rope(buffer_device or self.rope.device)
        if self.tok_embeddings is not None:
            nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers.values():
            layer.init_weights()
        if self.norm is not None:
            self.norm.reset_parameters()
        if self.output is not None:
            std = self.args.dim**-0.5
            nn.init.trunc_normal_(self.output.weight, std=std, a=-3 * std, b=3 * std)
