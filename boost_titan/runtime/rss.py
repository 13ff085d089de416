"""Resident memory of this process: current, peak since the last reset, and total RAM.

Linux only reads `/proc`; elsewhere the peak falls back to `getrusage`, which never resets.
"""

from __future__ import annotations

import os
import resource
import sys

_PAGE = os.sysconf("SC_PAGE_SIZE")


def current_rss() -> int:
    """Resident set size now, in bytes."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return lifetime_peak_rss()


def lifetime_peak_rss() -> int:
    """Largest resident set size since the process started, in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def peak_rss() -> int:
    """Largest resident set size since the last `reset_peak_rss` (or process start), in bytes."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return lifetime_peak_rss()


def reset_peak_rss() -> bool:
    """Restart peak tracking at the current RSS (Linux `clear_refs` 5); False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def total_ram() -> int:
    """Physical memory available to this process in bytes (cgroup limit if lower)."""
    total = os.sysconf("SC_PHYS_PAGES") * _PAGE
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


def available_ram() -> int:
    """Memory the kernel reports as available for new allocations, in bytes."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * _PAGE
