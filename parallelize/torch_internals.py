"""Every write to torch's own modules, classes and objects (its process-wide settings, its
private state, the functions rebound at run time), behind named functions: the one module
outside `boost_titan.runtime.titan_internals` that may assign them
(`tests/unit/test_no_patches.py`). Imported by this library and every room above it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


# ---- settings ----------------------------------------------------------------------------
def set_cp_load_balance(enabled: bool) -> None:
    """torch's global context-parallel option: whether the ring's causal masking assumes
    head-tail load-balanced shards."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as ring

    ring._cp_options.enable_load_balance = enabled


def add_dtensor_op_handlers(handlers: dict[Any, Callable[..., Any]]) -> None:
    """Add `handlers` (op -> handler) to DTensor's custom op handlers, after those it has."""
    from torch.distributed.tensor import DTensor

    dispatcher = DTensor._op_dispatcher
    dispatcher._custom_op_handlers = {**dispatcher._custom_op_handlers, **handlers}


def set_compile_cache_tag(tag: str) -> None:
    """torch.compile's cache key tag (`torch.compiler.config.cache_key_tag`)."""
    torch.compiler.config.cache_key_tag = tag


def emulate_precision_casts() -> None:
    """Make inductor emulate eager's precision casts (TorchTitan's float8 rowwise does)."""
    import torch._inductor.config

    torch._inductor.config.emulate_precision_casts = True


# ---- functions rebound -------------------------------------------------------------------
def replace_rms_norm(rms_norm: Callable[..., Any]) -> Callable[..., Any]:
    """Make `torch.nn.functional.rms_norm` be `rms_norm`; returns the one it replaced."""
    import torch.nn.functional as F

    original = F.rms_norm
    F.rms_norm = rms_norm
    return original


def replace_dcp_write(write_data: Callable[..., Any]) -> Callable[..., Any]:
    """Make DCP's `FileSystemWriter.write_data` be `write_data`; returns the one it
    replaced."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    original = FileSystemWriter.write_data
    FileSystemWriter.write_data = write_data
    return original


def replace_torchrun_agent(
    on_signal: Callable[..., Any], monitor: Callable[..., Any], shutdown: Callable[..., Any]
) -> None:
    """Make torchrun's elastic agent handle termination signals with `on_signal` (looked up
    in its module when the workers start), monitor its workers with `monitor` and shut them
    down with `shutdown` (methods of `LocalElasticAgent`)."""
    import torch.distributed.elastic.multiprocessing.api as elastic_api
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    elastic_api._terminate_process_handler = on_signal
    LocalElasticAgent._monitor_workers = monitor
    LocalElasticAgent._shutdown = shutdown
