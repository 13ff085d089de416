"""Every write to torch's own modules, classes and objects made by the rooms above the
parallelism library (fault injection in tests, torchrun's agent, the bench's stand-in
kernels, float8's compile setting, compute copies), behind named functions: with
`boost_titan.parallelize.torch_internals` (the library's own) and `titan_internals`, the
only modules that may assign them (`tests/unit/test_no_patches.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


# ---- settings ----------------------------------------------------------------------------
def emulate_precision_casts() -> None:
    """Make inductor emulate eager's precision casts (TorchTitan's float8 rowwise does)."""
    import torch._inductor.config

    torch._inductor.config.emulate_precision_casts = True


# ---- a module's state --------------------------------------------------------------------
def set_parameter(module: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Put `tensor` in `module`'s parameter slot `name` as it is (a non-leaf compute copy
    too, which `register_parameter` refuses), as `torch.func.functional_call` swaps them."""
    module._parameters[name] = tensor


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
