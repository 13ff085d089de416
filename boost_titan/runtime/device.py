"""Run TorchTitan on CPU processes when the machine has no accelerator.

TorchTitan 0.2.2 assumes one: the trainer calls `device_module.set_device`, the metrics
read CUDA allocator statistics, and the process-group backend follows `device_type`.
`use_cpu_if_no_accelerator()` swaps `torchtitan.tools.utils.device_type/device_module`
for "cpu" and `CpuDevice` (every loaded torchtitan module holding a copy is re-patched);
torch then maps "cpu" to the gloo backend, and DTensor's warnings about CPU meshes are
silenced. On a CUDA machine nothing is touched.

On CPU the memory column of TorchTitan's step log is the process RSS: `max_reserved` is
the peak RSS since the previous log line, `max_active` the RSS when the line is written,
percentages are of total RAM. The peak FLOPS behind its `mfu` column are measured
(`measured_peak_flops`: the best fp32 matmul rate of the process's threads) instead of
TorchTitan's guess (an A100, after probing `lspci`).

FSDP2 on gloo needs `force_sum_reductions(model)` after `fully_shard` (see there).
"""

from __future__ import annotations

import functools
import platform
import time
import warnings
from types import SimpleNamespace

import torch
from torch import nn
from torch._utils import _get_available_device_type

from boost_titan.runtime import rss
from boost_titan.runtime.titan_internals import point_at_cpu

Device = torch.device | str | int | None
"""What `torch.cuda` functions accept as a device; ignored on the CPU."""

CPU_MESH_WARNING = r"DTensor .* may not have complete support on cpu device mesh"
"""What DTensor warns on every CPU mesh (gloo), where everything we run is supported."""
_EXPECTED_CPU_WARNINGS = (CPU_MESH_WARNING, r"Set timeout is now only supported")


def on_cpu() -> bool:
    """True when TorchTitan would find no accelerator, so training runs on CPU processes."""
    return _get_available_device_type() is None


def graphs_on_cuda(job_config) -> bool:
    """`--boost.cuda_graphs` where it takes effect (off the GPU it does nothing)."""
    return job_config.boost.cuda_graphs and not on_cpu()


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return "CPU " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU " + (platform.processor() or platform.machine())


class CpuDevice:
    """The part of `torch.cuda` that TorchTitan calls, answered for the host CPU.

    Memory figures are RSS-based (see the module docstring); anything not defined here
    falls through to `torch.cpu`.
    """

    def __getattr__(self, name: str):
        return getattr(torch.cpu, name)

    def set_device(self, device: Device) -> None:
        pass

    def current_device(self) -> int:
        return 0

    def synchronize(self, device: Device = None) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_name(self, device: Device = None) -> str:
        return _cpu_name()

    def get_device_properties(self, device: Device = None):
        return SimpleNamespace(name=_cpu_name(), total_memory=rss.total_ram())

    def mem_get_info(self, device: Device = None) -> tuple[int, int]:
        return rss.available_ram(), rss.total_ram()

    def memory_stats(self, device: Device = None) -> dict[str, int]:
        now, peak = rss.current_rss(), rss.peak_rss()
        return {
            "active_bytes.all.current": now,
            "active_bytes.all.peak": now,
            "reserved_bytes.all.current": now,
            "reserved_bytes.all.peak": peak,
            "num_alloc_retries": 0,
            "num_ooms": 0,
        }

    def reset_peak_memory_stats(self, device: Device = None) -> None:
        rss.reset_peak_rss()


PEAK_MATMUL_SIZE = 512
"""Side of the square fp32 matmuls `measured_peak_flops` times (about 40 ms in all)."""


def measured_peak_flops(device_name: str = "") -> float:
    """FLOPS of the CPU for MFU: the best of 10 fp32 `n x n` matmuls on this process's
    threads, measured once per process (TorchTitan's `get_peak_flops` replacement;
    `device_name` is ignored)."""
    return _best_matmul_flops()


@functools.cache
def _best_matmul_flops() -> float:
    from torchtitan.tools.logging import logger

    n = PEAK_MATMUL_SIZE
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(10):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    flops = 2 * n**3 / best
    logger.info(
        f"CPU peak for MFU: {flops:.3e} FLOPS, measured (best fp32 {n}x{n} matmul on "
        f"{torch.get_num_threads()} thread(s))"
    )
    return flops


def use_cpu_if_no_accelerator() -> str:
    """Point TorchTitan at the CPU when no accelerator exists; return the device type in use.

    Idempotent. Call it before building the Trainer (ideally before importing
    `torchtitan.train`); modules imported later pick the patched names up themselves.
    """
    import torchtitan.tools.utils as titan_utils

    if not on_cpu() or isinstance(titan_utils.device_module, CpuDevice):
        return titan_utils.device_type
    for pattern in _EXPECTED_CPU_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=UserWarning)
    point_at_cpu(CpuDevice(), measured_peak_flops)
    return "cpu"


def force_sum_reductions(model: nn.Module) -> int:
    """Make every FSDP2 module of `model` reduce gradients with plain SUM; return how many.

    Gloo has no `ReduceOp.PREMUL_SUM`, which FSDP2 uses by default. TorchTitan already
    divides the loss by the global token count (gradient divide factor 1), so SUM gives
    the same gradients. Call it after `fully_shard` (or TorchTitan's `apply_fsdp`); it does
    nothing when an accelerator is present.
    """
    from torch.distributed.fsdp import FSDPModule

    if not on_cpu():
        return 0
    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in modules:
        m.set_force_sum_reduction_for_comms(True)
    return len(modules)
