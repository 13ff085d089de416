"""Every write to torch's own modules, classes and objects that this library makes (its
process-wide settings, its private state), behind named functions: the library's one
module that may assign them (`tests/unit/test_no_patches.py`). The rooms above it write
through their own adapter, `boost_titan.runtime.torch_internals`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


# ---- settings ----------------------------------------------------------------------------
def set_cp_load_balance(enabled: bool) -> None:
    """torch's global context-parallel option: whether the ring's causal masking assumes
    head-tail load-balanced shards."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as ring

    ring._cp_options.enable_load_balance = enabled


@contextmanager
def ring_merges_in_f32(enabled: bool) -> Iterator[None]:
    """torch's ring attention merges its partial results in fp32 (`convert_to_f32`) when
    `enabled`, inside the block; the option as it was after it."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as ring

    options = ring._cp_options
    kept = options.convert_to_f32
    options.convert_to_f32 = enabled
    try:
        yield
    finally:
        options.convert_to_f32 = kept


def add_dtensor_op_handlers(handlers: dict[Any, Callable[..., Any]]) -> None:
    """Add `handlers` (op -> handler) to DTensor's custom op handlers, after those it has."""
    from torch.distributed.tensor import DTensor

    dispatcher = DTensor._op_dispatcher
    dispatcher._custom_op_handlers = {**dispatcher._custom_op_handlers, **handlers}


def set_compile_cache_tag(tag: str) -> None:
    """torch.compile's cache key tag (`torch.compiler.config.cache_key_tag`)."""
    torch.compiler.config.cache_key_tag = tag
