"""Run a function on N gloo ranks (CPU processes) and collect what each rank returns
(`run_on_ranks`: the library's, which every multi-process command shares, so the tests end
their ranks the same way; forked from one server that imported torch and the first
caller's module, which saves each launch re-importing them), and randomise a model's
weights."""

from __future__ import annotations

from functools import partial

import torch

from boost_titan.processes import local_ranks

run_on_ranks = partial(local_ranks.run_on_ranks, start_method="forkserver")

__all__ = ["randomize", "run_on_ranks"]


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
