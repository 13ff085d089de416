"""CPU device adapter: TorchTitan's modules see the CPU stand-in, memory is the real RSS."""

from __future__ import annotations

import subprocess
import sys

import pytest

from boost_titan.runtime import rss
from boost_titan.runtime.device import on_cpu
from tests.helpers import ROOT

# Runs in a fresh interpreter: the adapter patches torchtitan module globals for good.
ADAPTER_CHECK = """
import torch
from boost_titan.runtime.device import CpuDevice, use_cpu_if_no_accelerator
assert use_cpu_if_no_accelerator() == "cpu"
assert use_cpu_if_no_accelerator() == "cpu"  # idempotent
from torchtitan.components import metrics
from torchtitan.distributed import utils as dist_utils
from torchtitan.tools import utils
assert isinstance(metrics.device_module, CpuDevice) and metrics.device_type == "cpu"
assert dist_utils.device_module is utils.device_module and dist_utils.device_type == "cpu"

monitor = metrics.build_device_memory_monitor()
assert monitor.device_capacity > 2**30
monitor.reset_peak_stats()
block = torch.ones(64 << 20)  # 256 MiB, touched
high = monitor.get_peak_stats()
del block
monitor.reset_peak_stats()
low = monitor.get_peak_stats()
assert high.max_reserved_gib > 0.25, high
assert high.max_reserved_gib - low.max_reserved_gib > 0.2, (high, low)
pct = 100 * high.max_reserved_gib * 2**30 / monitor.device_capacity
assert abs(high.max_reserved_pct - pct) < 1e-6
assert high.num_ooms == 0 and high.num_alloc_retries == 0

# MFU's peak: measured on this CPU, not TorchTitan's A100 guess after probing lspci
import subprocess
def no_lspci(*args, **kwargs):
    raise AssertionError(f"ran {args}")
subprocess.run = no_lspci
from boost_titan.runtime.device import measured_peak_flops
peak = utils.get_peak_flops(monitor.device_name)
assert peak == measured_peak_flops() and 1e8 < peak < 312e12, peak
print("adapter ok")
"""


@pytest.mark.skipif(not on_cpu(), reason="the adapter only acts without an accelerator")
def test_adapter_patches_torchtitan_and_reports_rss():
    result = subprocess.run(
        [sys.executable, "-c", ADAPTER_CHECK], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "adapter ok" in result.stdout, result.stdout + result.stderr


def test_rss_readings_are_consistent():
    assert 0 < rss.current_rss() <= rss.peak_rss()
    assert rss.lifetime_peak_rss() > 0
    assert 0 < rss.available_ram() <= rss.total_ram()
    if rss.reset_peak_rss():
        assert rss.peak_rss() <= rss.current_rss() + (16 << 20)
