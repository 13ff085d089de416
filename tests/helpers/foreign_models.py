"""Three decoders written in ordinary PyTorch, as a user would, knowing nothing of
boost-titan: their own class and attribute names, plain module calls, RoPE, GQA.

* `HFLlama`: Hugging-Face-Llama names (`model.layers.N.self_attn.q_proj`,
  `input_layernorm` with `variance_epsilon`, `mlp.gate_proj`), rotate-half RoPE;
* `PlainDecoder`: the README's decoder (`blocks.N.ln1`, `attn.q_proj`, `tok`, `ln_f`,
  `lm_head`), nn.RMSNorm, interleaved RoPE;
* `ParallelDecoder`: GPT-J / PaLM parallel blocks, one norm feeding attention and MLP
  (``x + attn(h) + mlp(h)``), biases on every linear.

`rank=None` builds the full-rank twin (nn.Linear projections); otherwise every projection
is a low-rank pair `LowRank` with `down`/`up` children and its activation in its own
forward (CoLA: SiLU; SVD: none). Each comes with its `ModelLayout`.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from boost_titan.parallelize import ModelLayout
from tests.helpers.distributed import randomize


class LowRank(nn.Module):
    """y = up(act(down(x)))."""

    def __init__(self, d_in: int, d_out: int, rank: int, act: str, bias: bool = False) -> None:
        super().__init__()
        self.down = nn.Linear(d_in, rank, bias=bias)
        self.up = nn.Linear(rank, d_out, bias=bias)
        self.act = act

    def forward(self, x):
        z = self.down(x)
        if self.act == "silu":
            z = F.silu(z)
        return self.up(z)


class NormedLatent(LowRank):
    """A pair with a trainable LayerNorm on its latent (listed as `ModelLayout.crossing`):
    a parameter between down and up."""

    def forward(self, x):
        return self.up(F.silu(self.norm(self.down(x))))


def with_normed_latents(model: nn.Module) -> nn.Module:
    """Give every low-rank pair of `model` a random LayerNorm on its latent."""
    for module in list(model.modules()):
        if type(module) is LowRank:
            module.__class__ = NormedLatent
            module.norm = nn.LayerNorm(module.down.out_features)
            randomize(module.norm, seed=1)
    return model


def projection(d_in, d_out, rank, act="silu", bias=False) -> nn.Module:
    if rank is None:
        return nn.Linear(d_in, d_out, bias=bias)
    return LowRank(d_in, d_out, rank, act, bias)


def causal(q, k, v):
    """q [b, hq, s, hd], k/v [b, hkv, s, hd]; the GQA ratio from the tensors."""
    repeat = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# ---- Hugging-Face-Llama style --------------------------------------------------------------
class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.head_dim = cfg["dim"] // cfg["heads"]
        hd, r = self.head_dim, cfg["rank"]
        self.q_proj = projection(cfg["dim"], cfg["heads"] * hd, r)
        self.k_proj = projection(cfg["dim"], cfg["kv_heads"] * hd, r)
        self.v_proj = projection(cfg["dim"], cfg["kv_heads"] * hd, r)
        self.o_proj = projection(cfg["heads"] * hd, cfg["dim"], r)

    def forward(self, hidden_states, position_embeddings):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        out = causal(q, k, v).transpose(1, 2).reshape(*input_shape, -1).contiguous()
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, f, r = cfg["dim"], cfg["ffn"], cfg["rank"]
        self.gate_proj, self.up_proj = projection(d, f, r), projection(d, f, r)
        self.down_proj = projection(f, d, r)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = LlamaAttention(cfg)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = LlamaRMSNorm(cfg["dim"])
        self.post_attention_layernorm = LlamaRMSNorm(cfg["dim"])

    def forward(self, hidden_states, position_embeddings):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states = residual + self.self_attn(hidden_states, position_embeddings)
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        return residual + self.mlp(hidden_states)


class LlamaModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab"], cfg["dim"])
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg["layers"]))
        self.norm = LlamaRMSNorm(cfg["dim"])
        hd = cfg["dim"] // cfg["heads"]
        inv_freq = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        angles = torch.outer(torch.arange(64, dtype=torch.float32), inv_freq)
        emb = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, input_ids):
        hidden_states = self.embed_tokens(input_ids)
        seq = input_ids.shape[1]
        position_embeddings = (self.cos[:seq], self.sin[:seq])
        for layer in self.layers:
            hidden_states = layer(hidden_states, position_embeddings)
        return self.norm(hidden_states)


class HFLlama(nn.Module):
    """LlamaForCausalLM-like."""

    def __init__(self, cfg):
        super().__init__()
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg["dim"], cfg["vocab"], bias=False)

    def forward(self, input_ids):
        return self.lm_head(self.model(input_ids))


HF_LAYOUT = ModelLayout(
    blocks="model.layers.*",
    shared_inputs={
        "input_layernorm": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        "post_attention_layernorm": ("mlp.gate_proj", "mlp.up_proj"),
    },
    own_inputs=("self_attn.o_proj", "mlp.down_proj"),
    embedding="model.embed_tokens",
    final_norm="model.norm",
    head="lm_head",
    head_dim=8,
    qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    attention_out=("self_attn.o_proj",),
)


# ---- the README's plain decoder -------------------------------------------------------------
def rope_interleaved(x, angles):
    """x [b, s, heads, hd]: rotate interleaved pairs."""
    pairs = x.unflatten(-1, (-1, 2))
    cos, sin = angles.cos()[None, :, None], angles.sin()[None, :, None]
    even, odd = pairs[..., 0], pairs[..., 1]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], -1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, cfg, act):
        super().__init__()
        self.hd = cfg["dim"] // cfg["heads"]
        d, r, kv = cfg["dim"], cfg["rank"], cfg["kv_heads"] * self.hd
        self.q_proj = projection(d, d, r, act)
        self.k_proj = projection(d, kv, r, act)
        self.v_proj = projection(d, kv, r, act)
        self.o_proj = projection(d, d, r, act)

    def forward(self, h, angles):
        b, s, _ = h.shape
        q = rope_interleaved(self.q_proj(h).view(b, s, -1, self.hd), angles)
        k = rope_interleaved(self.k_proj(h).view(b, s, -1, self.hd), angles)
        v = self.v_proj(h).view(b, s, -1, self.hd)
        out = causal(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, cfg, act, bias=False):
        super().__init__()
        d, f, r = cfg["dim"], cfg["ffn"], cfg["rank"]
        self.gate_proj = projection(d, f, r, act, bias)
        self.up_proj = projection(d, f, r, act, bias)
        self.down_proj = projection(f, d, r, act, bias)

    def forward(self, h):
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Block(nn.Module):
    def __init__(self, cfg, act):
        super().__init__()
        self.ln1 = nn.RMSNorm(cfg["dim"], eps=1e-5)
        self.attn = Attention(cfg, act)
        self.ln2 = nn.RMSNorm(cfg["dim"], eps=1e-5)
        self.mlp = MLP(cfg, act)

    def forward(self, x, angles):
        h = self.ln1(x)
        x = x + self.attn(h, angles)
        h = self.ln2(x)
        return x + self.mlp(h)


def _angles(cfg) -> torch.Tensor:
    hd = cfg["dim"] // cfg["heads"]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    return torch.outer(torch.arange(64, dtype=torch.float32), inv_freq)


class PlainDecoder(nn.Module):
    """The README's decoder; `act="none"` makes its pairs SVD-style."""

    def __init__(self, cfg, act="none"):
        super().__init__()
        self.tok = nn.Embedding(cfg["vocab"], cfg["dim"])
        self.blocks = nn.ModuleList(Block(cfg, act) for _ in range(cfg["layers"]))
        self.ln_f = nn.RMSNorm(cfg["dim"], eps=1e-5)
        self.lm_head = nn.Linear(cfg["dim"], cfg["vocab"], bias=False)
        self.register_buffer("angles", _angles(cfg), persistent=False)

    def forward(self, tokens):
        x = self.tok(tokens)
        angles = self.angles[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x, angles)
        return self.lm_head(self.ln_f(x))


PLAIN_LAYOUT = ModelLayout(
    blocks="blocks.*",
    shared_inputs={
        "ln1": ("attn.q_proj", "attn.k_proj", "attn.v_proj"),
        "ln2": ("mlp.gate_proj", "mlp.up_proj"),
    },
    own_inputs=("attn.o_proj", "mlp.down_proj"),
    embedding="tok",
    final_norm="ln_f",
    head="lm_head",
    head_dim=8,
    qkv=("attn.q_proj", "attn.k_proj", "attn.v_proj"),
    attention_out=("attn.o_proj",),
)


# ---- parallel blocks (GPT-J / PaLM) ---------------------------------------------------------
class ParallelBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm = nn.RMSNorm(cfg["dim"], eps=1e-5)
        self.attn = Attention(cfg, "silu")
        self.mlp = MLP(cfg, "silu", bias=True)

    def forward(self, x, angles):
        h = self.norm(x)
        return x + self.attn(h, angles) + self.mlp(h)


class ParallelDecoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.wte = nn.Embedding(cfg["vocab"], cfg["dim"])
        self.h = nn.ModuleList(ParallelBlock(cfg) for _ in range(cfg["layers"]))
        self.ln_f = nn.RMSNorm(cfg["dim"], eps=1e-5)
        self.lm_head = nn.Linear(cfg["dim"], cfg["vocab"], bias=False)
        self.register_buffer("angles", _angles(cfg), persistent=False)

    def forward(self, tokens):
        x = self.wte(tokens)
        angles = self.angles[: tokens.shape[1]]
        for block in self.h:
            x = block(x, angles)
        return self.lm_head(self.ln_f(x))


PARALLEL_LAYOUT = dataclasses.replace(
    PLAIN_LAYOUT,
    blocks="h.*",
    shared_inputs={
        "norm": ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.gate_proj", "mlp.up_proj"),
    },
    embedding="wte",
)

CONFIG = dict(vocab=64, dim=64, heads=8, kv_heads=4, ffn=96, layers=3)
RANK = 16

# name -> (build(config), layout, per-block all-reduces {strategy: (forward, backward)})
STANDARD = {"btp": (4, 4), "vanilla": (7, 4), "megatron": (2, 2)}
MODELS = {
    "hf-llama": (HFLlama, HF_LAYOUT, STANDARD),
    "plain-svd": (lambda cfg: PlainDecoder(cfg, "none"), PLAIN_LAYOUT, STANDARD),
    "plain-cola": (lambda cfg: PlainDecoder(cfg, "silu"), PLAIN_LAYOUT, STANDARD),
    "parallel": (
        ParallelDecoder,
        PARALLEL_LAYOUT,
        {"btp": (3, 3), "vanilla": (7, 3), "megatron": (2, 1)},
    ),
}
STRATEGIES = ("btp", "vanilla", "megatron")


def build(name: str, strategy: str, **config) -> nn.Module:
    """The model (its full-rank twin for megatron) with every parameter random, from
    seed 0; `config` overrides CONFIG."""
    make = MODELS[name][0]
    torch.manual_seed(0)
    model = make(dict(CONFIG, rank=None if strategy == "megatron" else RANK, **config))
    randomize(model)
    return model
