"""Runnable examples: `own_model` applies BTP to a decoder written in plain PyTorch,
`hf_llama` to a transformers Llama."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from boost_titan.config.cli import fail

HF_EXTRA = 'pip install -e ".[hf]"'
"""What installs transformers (the `hf` extra of pyproject.toml) for `hf_llama`."""


def start_process_group() -> tuple[str, int, int]:
    """Join torchrun's process group (NCCL on CUDA, else gloo) unless already in one;
    (device, rank, world size)."""
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            spec = getattr(sys.modules["__main__"], "__spec__", None)
            module = spec.name if spec else "boost_titan.examples.own_model"
            fail(f"no torchrun job to join; run it as torchrun --nproc_per_node=2 -m {module}")
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return device, dist.get_rank(), dist.get_world_size()
