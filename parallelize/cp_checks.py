"""The one-line refusals of context parallelism on a model's first CP forward: what would
otherwise train silently wrong, because torch's CP swaps only SDPA and only where we run it.

- `FirstForward` (a torch function mode over the model's first CP forward): an
  `F.scaled_dot_product_attention` call outside the modules `ModelLayout.attention`
  names (it would attend over this rank's shard alone), and positions that no operation
  reads (the model computes its tokens' places itself: 0..s/cp-1 on every rank);
- `positions_of`: every CP forward must be given its shard's positions;
- `no_attention_called` (checked after every forward of a named module): a module that
  calls no SDPA, e.g. attention written by hand (softmax(QK^T)V sees this rank's keys
  only).

What they cannot see (positions read but not used for RoPE, hand-written attention outside
the named modules, any other mixing of tokens) is caught by `context_parallel_step(...,
verify=True)`, which compares the first CP forward with the unsharded one.
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from .styles import PlanError

_SKIP = (str(Path(torch.__file__).parent), str(Path(__file__).parent))
"""Frames of torch and of this library: a call site is the first frame outside them."""


def call_site() -> str:
    """`file:line in function` of the user code that made the current call."""
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith(_SKIP):
            return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    return "an unknown place"


class FirstForward(TorchFunctionMode):
    """Over the model's first CP forward: refuses SDPA run outside the named attention
    modules (`ring_active()` is False there) and records whether `positions` is read."""

    def __init__(self, positions: torch.Tensor, ring_active: Callable[[], bool], names: str):
        super().__init__()
        self.positions = positions
        self.ring_active = ring_active
        self.names = names
        self.positions_read = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and not self.ring_active():
            raise PlanError(
                f"context parallelism: F.scaled_dot_product_attention ran at {call_site()}, "
                f"outside the modules ModelLayout.attention names ({self.names}), so it "
                "would attend over this rank's shard alone; name the module whose forward "
                'calls it ("" names the block itself)'
            )
        if not self.positions_read:
            self.positions_read = any(t is self.positions for t in tree_leaves((args, kwargs)))
        return func(*args, **kwargs)


def unread_positions(model: torch.nn.Module, keyword: str) -> PlanError:
    return PlanError(
        f"context parallelism: {type(model).__name__}.forward took `{keyword}` but no "
        "operation read it, so its RoPE uses 0..s/cp-1 on every rank; compute the rotary "
        f"angles from `{keyword}` (each token's place in the whole sequence)"
    )


def no_attention_called(name: str) -> PlanError:
    return PlanError(
        f"context parallelism: {name}'s forward called no F.scaled_dot_product_attention; "
        "only SDPA runs as ring attention (attention written by hand sees this rank's keys "
        "alone): call F.scaled_dot_product_attention(q, k, v, is_causal=True) there, or "
        "name the module that does in ModelLayout.attention"
    )


def accepts_keyword(forward: Callable[..., Any], keyword: str) -> bool:
    """Whether `forward` takes `keyword` by name (or any keyword, `**kwargs`)."""
    parameters = inspect.signature(forward).parameters.values()
    return any(
        p.kind is p.VAR_KEYWORD
        or (p.name == keyword and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        for p in parameters
    )


def positions_of(
    model: torch.nn.Module,
    signature: inspect.Signature,
    keyword: str,
    args: tuple,
    kwargs: dict,
) -> torch.Tensor:
    """The positions a CP forward was given; PlanError when none were."""
    bound = signature.bind_partial(*args, **kwargs).arguments
    extra = next((v for k, v in bound.items() if _var_keyword(signature, k)), {})
    positions = bound.get(keyword, extra.get(keyword))
    if not isinstance(positions, torch.Tensor):
        raise PlanError(
            f"context parallelism: {type(model).__name__} was called without `{keyword}`; "
            "a rank holds a shard of each sequence, so its tokens are not at places "
            f"0..s/cp-1: pass the shard's `{keyword}` (context_parallel_step does)"
        )
    return positions


def _var_keyword(signature: inspect.Signature, name: str) -> bool:
    return signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD
