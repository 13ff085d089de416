"""Runnable examples: `own_model` applies BTP to a decoder written in plain PyTorch,
`hf_llama` to a transformers Llama."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def start_process_group() -> tuple[str, int, int]:
    """Join torchrun's process group (NCCL on CUDA, else gloo) unless already in one;
    (device, rank, world size)."""
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    return device, dist.get_rank(), dist.get_world_size()
