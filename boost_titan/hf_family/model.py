"""The `hf` family's model: the folder's transformers class, converted by `to_low_rank`, whose
forward returns the logits (as TorchTitan's models do) and whose `init_weights` loads the
folder's pretrained weights (SVD-initialised pairs) into the built, possibly sharded,
model. The parameter names are transformers' own, so an export is a plain HF folder."""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn

from boost_titan.config.errors import ConfigError
from boost_titan.parallelize import ModelLayout, hf_layout, to_low_rank
from boost_titan.parallelize.styles import PlanError

from .args import HfModelArgs

ATTENTION = "sdpa"
"""transformers' attention implementation for training (causal SDPA, as TorchTitan's)."""
CROSSING = ("cross", "latent_norm")
"""LaX's modules inside each pair (`LowRankLinear`), replicated by the plans."""


def hf_config(args: HfModelArgs):
    """The transformers config of `args.folder` (read from disk, nothing downloaded), its
    head untied from the embedding (the plans shard the two apart: `pretrained_state`
    starts the head from the tied weight)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(args.folder, local_files_only=True)
    config.use_cache = False
    config.tie_word_embeddings = False
    return config


def family_layout(model: nn.Module, args: HfModelArgs) -> ModelLayout:
    """`hf_layout(model)` (PlanError as it); for lax it names the crossing modules, and
    BTP's groups reduce each up's input grad themselves (a latent also feeds the next
    block's crossing, so no group may defer it: `ModelLayout.defer_latent_grads`)."""
    layout = hf_layout(model)
    if not args.crossing:
        return layout
    return dataclasses.replace(layout, crossing=CROSSING, defer_latent_grads=False)


def convert(model: nn.Module, args: HfModelArgs, init: str) -> nn.Module:
    """`to_low_rank` for a low-rank arch (`init`: "svd" from the weights, "random" on meta;
    lax crossing); a model the plans cannot describe is one ConfigError line."""
    try:
        layout = hf_layout(model)
        if args.low_rank:
            to_low_rank(
                model,
                args.rank,
                layout=layout,
                init=init,
                activation=args.activation,
                crossing=args.crossing,
            )
    except PlanError as e:
        raise ConfigError(f"model.hf_assets_path {args.folder!r}: {e}") from None
    return model


@functools.cache
def logits_class(base: type[nn.Module]) -> type[nn.Module]:
    """`base` (a transformers ``*ForCausalLM``) whose forward returns the logits tensor and
    which loads its folder in `init_weights`; it keeps `base`'s name (config.architectures)."""

    class HfCausalLM(base):
        boost_args: HfModelArgs | None = None

        def forward(self, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
            return super().forward(input_ids=input_ids, use_cache=False, **kwargs).logits

        @torch.no_grad()
        def init_weights(self, buffer_device: torch.device | None = None) -> None:
            """TorchTitan's call after `parallelize_fn`: the folder's weights. (transformers
            calls its own `init_weights` while constructing, before `boost_args` is set.)"""
            if self.boost_args is None:
                super().init_weights()
                return
            load_folder_weights(self, self.boost_args)

    HfCausalLM.__name__ = HfCausalLM.__qualname__ = base.__name__
    return HfCausalLM


def build_hf_model(args: HfModelArgs) -> nn.Module:
    """The TrainSpec's model: the folder's architecture, converted (weights random, or on the
    meta device as the trainer builds it; `init_weights` loads the folder)."""
    from transformers import AutoModelForCausalLM

    config = hf_config(args)
    base = type(AutoModelForCausalLM.from_config(config, attn_implementation=ATTENTION))
    # the class built again, as the trainer's model (transformers builds from config only)
    model = logits_class(base)(config)
    model.set_attn_implementation(ATTENTION)
    model.boost_args = args
    return convert(model, args, init="random")


@torch.no_grad()
def pretrained_state(args: HfModelArgs) -> dict[str, torch.Tensor]:
    """The folder's weights converted as the model is (SVD pairs), and its buffers, on CPU."""
    from transformers import AutoModelForCausalLM

    config = hf_config(args)
    model = AutoModelForCausalLM.from_pretrained(
        args.folder, config=config, local_files_only=True, dtype=torch.float32
    )
    if args.config.get("tie_word_embeddings"):  # the folder's head is its embedding
        model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    convert(model, args, init="svd")
    state = dict(model.state_dict())
    state.update(dict(model.named_buffers()))
    return state


def load_folder_weights(model: nn.Module, args: HfModelArgs) -> None:
    """Copy the folder's converted weights into `model` (sharded or not: DTensors get their
    local shards) and recompute its buffers (rotary frequencies)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    state = pretrained_state(args)
    weights = {k: v for k, v in state.items() if k in model.state_dict()}
    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True))
    for name, buffer in model.named_buffers():
        buffer.copy_(state[name.replace("_checkpoint_wrapped_module.", "")])


__all__ = [
    "build_hf_model",
    "convert",
    "family_layout",
    "hf_config",
    "load_folder_weights",
    "logits_class",
]
