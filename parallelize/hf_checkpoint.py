"""Save a sharded Hugging Face model as a Hugging Face folder, and reload it.

* `save_hf(model, folder)`: every rank calls it; the full tensors are gathered to rank 0,
  which writes ``config.json`` and ``model.safetensors`` once. `load_hf(folder)` reads it
  back on one process: plain ``from_pretrained`` for a full-rank model, the same plus
  `to_low_rank`'s pairs when the config records ``low_rank``.

A resumable DCP checkpoint of a sharded model (any TP degree) is
`boost_titan.checkpoint.sharded`'s `save_sharded` / `load_sharded`, beside the allowlist
it reads through.

transformers and safetensors are imported inside the functions that need them.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

WEIGHTS = "model.safetensors"


def _full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full tensors of `model`'s state dict on rank 0 (on CPU), nothing elsewhere;
    a collective: every rank of the model's mesh calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not dist.is_initialized():
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def save_hf(model: nn.Module, folder: str | os.PathLike) -> None:
    """Write a (sharded or not) transformers model as a Hugging Face folder.

    Every rank calls it (the gather is a collective); rank 0 writes ``config.json`` and
    one ``model.safetensors`` of full tensors; the others wait for it.

    Args:
        model (nn.Module): a transformers model, before or after `apply_plan`.
        folder (str | os.PathLike): the folder to write (created if missing).

    Example::

        >>> import tempfile, torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> from boost_titan.parallelize import load_hf, save_hf
        >>> config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
        ...     num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
        >>> model, ids = LlamaForCausalLM(config), torch.randint(0, 64, (1, 8))
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     save_hf(model, folder)
        ...     torch.equal(load_hf(folder)(ids).logits, model(ids).logits)
        True
    """
    from safetensors.torch import save_file

    state = _full_state(model)
    if not dist.is_initialized() or dist.get_rank() == 0:
        os.makedirs(folder, exist_ok=True)
        config = model.config
        config.architectures = [type(model).__name__]
        config.save_pretrained(folder)
        tensors = {k: v.contiguous() for k, v in state.items()}
        save_file(tensors, os.path.join(folder, WEIGHTS), metadata={"format": "pt"})
    if dist.is_initialized():
        dist.barrier()


def load_hf(folder: str | os.PathLike, **kwargs) -> nn.Module:
    """Read a folder written by `save_hf` on one process (no process group needed).

    Args:
        folder (str | os.PathLike): the folder.
        **kwargs: passed to ``AutoModelForCausalLM.from_pretrained`` (full-rank models).

    Returns:
        nn.Module: the unsharded model, with `to_low_rank`'s pairs (LaX's crossing
        included) when the config records ``low_rank``.

    Example::

        >>> import tempfile, torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> from boost_titan.parallelize import hf_layout, load_hf, save_hf, to_low_rank
        >>> config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
        ...     num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
        >>> model = LlamaForCausalLM(config)
        >>> model = to_low_rank(model, 8, layout=hf_layout(model), activation="silu")
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     save_hf(model, folder)
        ...     type(load_hf(folder).model.layers[0].mlp.up_proj).__name__
        'LowRankLinear'
    """
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from .hf import hf_layout
    from .low_rank import to_low_rank

    config = AutoConfig.from_pretrained(folder)
    low_rank = getattr(config, "low_rank", None)
    if low_rank is None:
        return AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    model = AutoModelForCausalLM.from_config(config)
    layout = hf_layout(model)
    to_low_rank(
        model,
        low_rank["rank"],
        layout=layout,
        init="random",
        activation=low_rank["activation"],
        crossing=low_rank.get("crossing", False),
    )
    model.load_state_dict(load_file(os.path.join(folder, WEIGHTS)))
    return model
