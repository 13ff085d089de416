"""The `ModelLayout` of a Hugging Face transformers causal LM, read from the model itself.

`hf_layout(model)` describes a model of the Llama structure (Llama, Mistral, Qwen2, Qwen3
and any class with the same modules and norm formula): per block ``input_layernorm`` -> q,
k, v and ``post_attention_layernorm`` -> gate, up; o and down read their own inputs;
Qwen3's per-head ``self_attn.q_norm`` and ``k_norm`` are `ModelLayout.head_norms`; the
head size and head counts come from the config. Anything a plan cannot shard correctly is
refused in one line (`PlanError`) naming the reason, before any communication: see
`REFUSALS`, which docs/huggingface.md renders as a table.

transformers is not imported here: a model is recognised by its modules and config.
"""

from __future__ import annotations

import torch
from torch import nn

from .plans import ModelLayout
from .styles import PlanError, is_rmsnorm_like, norm_eps

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
BLOCK = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
FUSED_QKV = ("qkv_proj", "query_key_value", "c_attn", "Wqkv")
HEAD_NORMS = ("q_norm", "k_norm")


def hf_layout(model: nn.Module) -> ModelLayout:
    """The `ModelLayout` of a transformers ``*ForCausalLM`` of the Llama structure.

    Works on the full-rank model and on its `to_low_rank` conversion (same names).
    (`apply_plan` makes HF's own loss under a ``loss_parallel=True`` plan, and
    ``save_pretrained``, fail in one line naming the fix: `hf_guards`.)

    Args:
        model (nn.Module): an unsharded transformers causal LM, e.g. ``LlamaForCausalLM``.

    Returns:
        ModelLayout: blocks ``model.layers.*``, ``head_dim`` from the config,
        ``head_norms`` where the attention has ``q_norm`` / ``k_norm`` (Qwen3); for
        context parallelism ``attention`` ``self_attn`` (SDPA there needs
        ``attn_implementation="sdpa"``: CP refuses the eager one, attention by hand) and
        ``positions`` ``position_ids`` (``[b, s]``).

    Raises:
        PlanError: one line naming the reason for a class or config the plans do not
            support (another structure, fused qkv, LayerNorm, tied embeddings, a norm
            other than ``x / rms(x) * weight`` (the per-head q/k norms included), an
            already sharded model, a ``head_dim`` that disagrees with q_proj).

    Example::

        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> from boost_titan.parallelize import hf_layout
        >>> config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96,
        ...     num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=2)
        >>> layout = hf_layout(LlamaForCausalLM(config))
        >>> layout.blocks, layout.head_dim, layout.shared_inputs["input_layernorm"]
        ('model.layers.*', 8, ('self_attn.q_proj', 'self_attn.k_proj', 'self_attn.v_proj'))
    """
    name = type(model).__name__
    config = getattr(model, "config", None)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if config is None or not isinstance(layers, nn.ModuleList) or not hasattr(model, "lm_head"):
        raise PlanError(
            f"{name} is not a transformers causal LM of the Llama structure (model.layers.N, "
            "lm_head); write its ModelLayout by hand (docs/your_model.md)"
        )
    if any(_is_dtensor(p) for p in model.parameters()):
        raise PlanError(f"{name} is already sharded; call hf_layout before apply_plan")
    _check_untied(model, name)
    if not len(layers):
        raise PlanError(f"{name} has no layers (num_hidden_layers=0); nothing to shard")
    _check_block(layers[0], name)
    head_dim = _head_dim(model, name)
    attn_children = dict(layers[0].self_attn.named_children())
    head_norms = tuple(f"self_attn.{n}" for n in HEAD_NORMS if n in attn_children)
    block_norms = [*BLOCK[2:], *head_norms]
    norms = [f"model.layers.{i}.{n}" for i in range(len(layers)) for n in block_norms]
    for fqn in [*norms, "model.norm"]:
        _check_norm(model.get_submodule(fqn), fqn, name)
    attn = [f"self_attn.{p}" for p in ATTENTION]
    mlp = [f"mlp.{p}" for p in MLP]
    return ModelLayout(
        blocks="model.layers.*",
        shared_inputs={"input_layernorm": tuple(attn[:3]), "post_attention_layernorm": (*mlp[:2],)},
        own_inputs=(attn[3], mlp[2]),
        embedding="model.embed_tokens",
        final_norm="model.norm",
        head="lm_head",
        head_dim=head_dim,
        qkv=tuple(attn[:3]),
        attention_out=(attn[3],),
        head_norms=head_norms,
        attention=("self_attn",),
        positions="position_ids",
    )


def _is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _check_untied(model: nn.Module, name: str) -> None:
    embedding = getattr(model.model, "embed_tokens", None)
    head = getattr(model.lm_head, "weight", None)
    tied = getattr(model.config, "tie_word_embeddings", False)
    if tied or (embedding is not None and head is embedding.weight):
        raise PlanError(
            f"{name} ties lm_head to embed_tokens (tie_word_embeddings), which TP plans do "
            "not support; build or load it with tie_word_embeddings=False"
        )


def _check_block(block: nn.Module, name: str) -> None:
    attn = getattr(block, "self_attn", None)
    attn_children = dict(attn.named_children()) if attn is not None else {}
    fused = [c for c in FUSED_QKV if c in attn_children]
    if fused:
        raise PlanError(
            f"{name} fuses q, k and v in one projection (self_attn.{fused[0]}); the plans "
            "shard q, k and v as separate projections: split it first"
        )
    children = dict(block.named_children())
    for child, module in children.items():
        if isinstance(module, nn.LayerNorm):
            raise PlanError(f"{name} uses LayerNorm ({child}); the plans need RMSNorm")
    mlp = children.get("mlp")
    missing = [c for c in BLOCK if c not in children]
    missing += [f"self_attn.{p}" for p in ATTENTION if p not in attn_children]
    missing += [f"mlp.{p}" for p in MLP if mlp is None or not hasattr(mlp, p)]
    extra = sorted(set(children) - set(BLOCK))
    if missing or extra:
        what = f"has no {missing[0]}" if missing else f"has {extra[0]} besides the Llama modules"
        raise PlanError(
            f"{name}: its block {what}, a structure hf_layout does not describe; write its "
            "ModelLayout by hand (docs/your_model.md)"
        )


def _head_dim(model: nn.Module, name: str) -> int:
    config = model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    q_proj = model.model.layers[0].self_attn.q_proj
    q_out = q_proj.out_features if isinstance(q_proj, nn.Linear) else q_proj.up.out_features
    if q_out != heads * head_dim:
        raise PlanError(
            f"{name}: config.head_dim {head_dim} x num_attention_heads {heads} != q_proj's "
            f"{q_out} outputs; fix config.head_dim"
        )
    if getattr(config, "pretraining_tp", 1) > 1:
        raise PlanError(f"{name}: config.pretraining_tp > 1 slices the MLP; set it to 1")
    return head_dim


@torch.no_grad()
def _check_norm(norm: nn.Module, fqn: str, name: str) -> None:
    """A norm must be RMSNorm-like and compute x / rms(x) * weight (checked on numbers,
    where there are: not on the meta device)."""
    if isinstance(norm, nn.LayerNorm) or not is_rmsnorm_like(norm):
        raise PlanError(
            f"{name} uses {type(norm).__name__} at {fqn}, not an RMSNorm (1-D weight, eps, no "
            "bias); the plans need RMSNorm"
        )
    weight = norm.weight
    if weight.is_meta:  # no numbers yet (a trainer's meta build): checked once loaded
        return
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, weight.shape[0], generator=generator).to(weight.device, weight.dtype)
    want = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + norm_eps(norm, x))
    want = want * weight.float()
    got = norm(x).float()
    tolerance = 1e-2 if weight.dtype in (torch.float16, torch.bfloat16) else 1e-4
    if (got - want).abs().max() > tolerance * max(want.abs().max().item(), 1.0):
        raise PlanError(
            f"{name}: {fqn} ({type(norm).__name__}) does not compute x / rms(x) * weight "
            "(e.g. Gemma's 1 + weight); the plans shard that formula only"
        )
