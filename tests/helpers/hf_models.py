"""Real transformers causal LMs for the plan tests: tiny random configs (no download), every
parameter random (Qwen3's per-head q_norm and k_norm too). `build(name, strategy)`: the
full-rank model for megatron, its `to_low_rank` conversion (SVD init) for btp and vanilla.

Qwen2's q/k/v biases are scaled to [0.1, 0.3]: at [0.5, 1.5] the attention is so sharp that
its q/k gradients differ by ~3e-5 between any two fp32 summation orders (5x smaller biases:
2e-6), which would hide a real error behind the 1e-5 tolerance or fail it spuriously."""

from __future__ import annotations

import torch
from torch import nn

from boost_titan.parallelize import hf_layout, to_low_rank
from tests.helpers.distributed import randomize
from tests.helpers.foreign_models import STANDARD

CONFIG = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=8,
    num_key_value_heads=4,
    tie_word_embeddings=False,
    attn_implementation="eager",
)
RANK = 16

# name -> (transformers config class, model class, activation of the pairs, their init)
CLASSES = {
    "tf-llama": ("LlamaConfig", "LlamaForCausalLM", "silu", "svd"),
    "tf-mistral": ("MistralConfig", "MistralForCausalLM", None, "svd"),
    "tf-qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "silu", "random"),
    "tf-qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "silu", "svd"),
}
OVERRIDES = {"tf-qwen3": dict(head_dim=8)}  # Qwen3's config defaults to 128, not d / heads
HEAD_NORMS = {"tf-qwen3": 2}  # q_norm, k_norm: one weight-grad all-reduce each (btp, megatron)


def all_reduces_per_block(name: str, strategy: str) -> tuple[int, int]:
    """(forward, backward) all-reduces of one block: btp 4/4, vanilla 7/4, megatron 2/2,
    plus one backward all-reduce per head norm where the heads are sharded."""
    forward, backward = STANDARD[strategy]
    if strategy != "vanilla":
        backward += HEAD_NORMS.get(name, 0)
    return forward, backward


def config(name: str, **overrides):
    """The tiny config of model class `name` (CONFIG with `overrides`)."""
    import transformers

    return getattr(transformers, CLASSES[name][0])(**(CONFIG | OVERRIDES.get(name, {}) | overrides))


def build(name: str, strategy: str, layers: int = 3, **overrides) -> nn.Module:
    """The model from seed 0, converted for btp/vanilla, then every parameter random."""
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, CLASSES[name][1])(
        config(name, num_hidden_layers=layers, **overrides)
    )
    if strategy != "megatron":
        _, _, activation, init = CLASSES[name]
        to_low_rank(model, RANK, layout=hf_layout(model), init=init, activation=activation)
    randomize(model)
    with torch.no_grad():  # q/k/v biases of ~1 make attention sharp: fp32-ill-conditioned
        for name, param in model.named_parameters():
            if ".self_attn." in name and name.endswith("bias"):
                param.mul_(0.2)
    return model


def logits_of(output) -> torch.Tensor:
    """The logits of a model's output: the tensor itself, or HF's `.logits`."""
    return output if isinstance(output, torch.Tensor) else output.logits


def write_pretrained(folder, layers: int = 2, vocab_size: int = 512, tied: bool = False):
    """A Hugging Face model folder as `--model.name hf` reads it: a tiny Llama (seed 0,
    every parameter random, norm weights far from 1; `tied`: its head is its embedding)
    saved with `save_pretrained` (config.json, model.safetensors) beside a small
    byte-level `tokenizer.json`."""
    from pathlib import Path

    import transformers

    from tests.helpers.corpus import write_hf_tokenizer

    folder = Path(folder)
    write_hf_tokenizer(folder, vocab_size)
    torch.manual_seed(0)
    settings = CONFIG | {"vocab_size": vocab_size, "attn_implementation": "sdpa"}
    settings["tie_word_embeddings"] = tied
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(num_hidden_layers=layers, **settings)
    )
    randomize(model)
    model.save_pretrained(folder)
    return folder
