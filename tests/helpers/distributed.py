"""Run a function on N gloo ranks (CPU processes) and collect what each rank returns."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from boost_titan.bench.measure.ports import free_port


def _worker(rank: int, world_size: int, port: int, out_dir: str, fn: Callable, kwargs: dict):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        result = fn(rank=rank, world_size=world_size, **kwargs)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int = 0) -> None:
    """Give every parameter random values: 1-D ones (norm weights, biases) uniform in
    [0.5, 1.5], matrices their own values plus 10% noise. Unit norm weights and zero
    biases hide dropped factors and terms in backward formulas."""
    generator = torch.Generator().manual_seed(seed)
    for param in model.parameters():
        noise = torch.rand(param.shape, generator=generator, dtype=param.dtype)
        if param.dim() == 1:
            param.copy_(0.5 + noise)
        else:
            param.add_((noise - 0.5) * 0.2 * param.abs().mean())


def run_on_ranks(fn: Callable[..., Any], world_size: int, **kwargs) -> list[Any]:
    """Spawn `world_size` processes running `fn(rank=, world_size=, **kwargs)` inside an
    initialised gloo process group; return their results in rank order. `fn` must be a
    module-level function (it is pickled)."""
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(
            _worker,
            args=(world_size, free_port(), out_dir, fn, kwargs),
            nprocs=world_size,
            join=True,
            start_method="spawn",
        )
        return [
            torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False)
            for r in range(world_size)
        ]
