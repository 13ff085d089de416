"""What one profiled training step launched: `bench step`'s reading of a torch.profiler trace.

The trainer under `bench step` marks the step (`STEP`) and each micro-batch's forward +
loss + backward (`MICROBATCH`) with `record_function` ranges; the trace is torch.profiler's
Chrome-trace JSON (`export_chrome_trace`). Counted, from the trace's complete events:

- launches: on CUDA the host's kernel launches (CUDA runtime/driver launch calls, graph
  launches, async copies and memsets): what costs host time per kernel; on CPU every
  dispatched ATen op that no other ATen op called (an op and its internal calls are one
  launch), plus each Inductor C++ kernel (compiled code records them only with
  `TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE=1`, which `bench step` sets).
- kernels (CUDA): GPU kernels of the step; busy = the union of their intervals over the
  step's wall time.
- parameter casts: ATen casts into the compute dtype inside the compute copies' range
  (`runtime.compute_copies.CAST_RANGE`: a `to` per weight) or while FSDP2 unshards weights
  (inside its pre-forward, pre-backward and all-gather ranges; the casts of a module's
  inputs are activations, not weights): a `to` per weight on a 1-rank mesh, one
  `_foreach_copy_` of every weight of a unit when it all-gathers (FSDP2 takes that path
  only to cast; its copy into the all-gather buffer, `fsdp::all_gather_copy_in`, is not
  one).
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

from boost_titan.runtime.compute_copies import CAST_RANGE

STEP = "boost::step"
MICROBATCH = "boost::microbatch"
LAUNCH_CALLS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cudaLaunchCooperativeKernel",
        "cudaGraphLaunch",
        "cudaMemcpyAsync",
        "cudaMemsetAsync",
    }
)
"""Host calls that each put work on the GPU."""
CAST_SCOPES = (
    CAST_RANGE,
    "FSDP::pre_forward",
    "FSDP::pre_backward",
    "FSDP::all_gather",
    "FSDP::unshard",
)
"""The record_function ranges in which the compute copies or FSDP2 cast weights to the
compute dtype."""
INPUT_CASTS = "FSDP::cast_forward_inputs"
"""FSDP2's range for casting a module's inputs (activations, not weights)."""
COPY_IN = "fsdp::all_gather_copy_in"
"""FSDP2's op that copies the already cast weights into the all-gather buffer."""
CAST_OPS = frozenset({"aten::to", "aten::_to_copy", "aten::_foreach_copy_"})
COMPUTE_DTYPES = {"bfloat16": 15, "float16": 5}
"""c10::ScalarType codes of the compute dtypes, as a trace's concrete inputs print them."""


@dataclass(frozen=True)
class Event:
    """One complete ('X') event of the trace."""

    name: str
    cat: str
    start: float
    end: float
    tid: str
    args: dict = field(default_factory=dict, compare=False, hash=False)

    def within(self, other: Event) -> bool:
        return other.start <= self.start and self.end <= other.end


@dataclass(frozen=True)
class StepCounts:
    """What the profiled step launched (module docstring)."""

    launches_per_step: int
    launches_per_microbatch: float
    microbatches: int
    casts_per_step: int
    step_ms: float
    kernels_per_step: int | None = None
    gpu_busy: float | None = None
    top: list[dict] = field(default_factory=list)
    """The most frequent launches (CPU: ops) or the longest kernels in total (CUDA)."""


def events(trace: dict) -> list[Event]:
    """The trace's complete events, by start time."""
    found = [
        Event(
            str(e.get("name", "")),
            str(e.get("cat", "")),
            float(e["ts"]),
            float(e["ts"]) + float(e.get("dur", 0.0)),
            f"{e.get('pid')}/{e.get('tid')}",
            e.get("args") or {},
        )
        for e in trace.get("traceEvents", [])
        if e.get("ph") == "X" and "ts" in e
    ]
    return sorted(found, key=lambda e: (e.start, -e.end))


def _top_level_ops(found: list[Event]) -> list[Event]:
    """ATen ops on each thread that no other ATen op encloses."""
    tops, open_until = [], {}
    for e in found:
        if e.cat != "cpu_op" or not e.name.startswith("aten::"):
            continue
        if e.start < open_until.get(e.tid, float("-inf")):
            continue  # inside the previous top-level op of this thread
        tops.append(e)
        open_until[e.tid] = e.end
    return tops


def _is_inductor_cpp_kernel(e: Event) -> bool:
    return "cpp_fused" in e.name


def _count_within(items: list[Event], windows: list[Event]) -> int:
    """Items that start inside one of `windows` (non-overlapping, sorted)."""
    starts = [w.start for w in windows]
    count = 0
    for item in items:
        i = bisect.bisect_right(starts, item.start) - 1
        if i >= 0 and item.start < windows[i].end:
            count += 1
    return count


def _casts(found: list[Event], tops: list[Event], dtype: str) -> int:
    """Weight casts to `dtype` inside the cast ranges (module docstring)."""
    code = str(COMPUTE_DTYPES.get(dtype, -1))
    scopes = [e for e in found if e.name.startswith(CAST_SCOPES)]
    skipped = [e for e in found if e.name in (INPUT_CASTS, COPY_IN)]
    count = 0
    for op in tops:
        if op.name not in CAST_OPS or not any(op.within(s) for s in scopes):
            continue
        if any(op.within(s) for s in skipped):
            continue
        if op.name != "aten::_foreach_copy_":
            concrete = op.args.get("Concrete Inputs") or []
            count += len(concrete) > 1 and str(concrete[1]) == code
        else:  # FSDP2 casts a unit's weights with one foreach copy: count the tensors
            dims = op.args.get("Input Dims") or [[]]
            count += len(dims[0]) if dims and isinstance(dims[0], list) else 1
    return count


def _busy(kernels: list[Event], window: Event) -> float:
    """Fraction of `window` during which at least one kernel ran."""
    covered, edge = 0.0, window.start
    for k in sorted(kernels, key=lambda k: k.start):
        start, end = max(k.start, edge), min(k.end, window.end)
        if end > start:
            covered += end - start
            edge = end
    return covered / max(window.end - window.start, 1e-9)


def step_counts(
    trace: dict, compute_dtype: str, cuda: bool, microbatches: int | None = None, top: int = 10
) -> StepCounts:
    """Count the profiled step of `trace` (the module docstring's quantities); `microbatches`
    (default: the marked ranges) divides the launches inside the ranges (a pipeline schedule
    runs all its micro-batches in one range)."""
    found = events(trace)
    steps = [e for e in found if e.name == STEP]
    if not steps:
        raise ValueError(f"the trace has no {STEP!r} range: the step was not profiled")
    step = steps[0]
    windows = [e for e in found if e.name == MICROBATCH and e.within(step)]
    tops = [e for e in _top_level_ops(found) if e.within(step)]
    if cuda:
        launches = [e for e in found if e.name in LAUNCH_CALLS and e.within(step)]
        kernels = [e for e in found if e.cat == "kernel" and e.start >= step.start]
        time_by_kernel: Counter[str] = Counter()
        count_by_kernel: Counter[str] = Counter()
        for k in kernels:
            time_by_kernel[k.name] += k.end - k.start
            count_by_kernel[k.name] += 1
        ranked = [
            {"name": name, "count": count_by_kernel[name], "ms": round(us / 1e3, 3)}
            for name, us in time_by_kernel.most_common(top)
        ]
        extra = {"kernels_per_step": len(kernels), "gpu_busy": _busy(kernels, step)}
    else:
        kernels_cpp = [e for e in found if _is_inductor_cpp_kernel(e) and e.within(step)]
        launches = sorted(tops + kernels_cpp, key=lambda e: e.start)
        counts = Counter(e.name for e in launches)
        ranked = [{"name": n, "count": c} for n, c in counts.most_common(top)]
        extra = {}
    microbatches = microbatches or len(windows)
    per_microbatch = _count_within(launches, windows) / max(microbatches, 1)
    return StepCounts(
        launches_per_step=len(launches),
        launches_per_microbatch=per_microbatch,
        microbatches=microbatches,
        casts_per_step=_casts(found, tops, compute_dtype),
        step_ms=(step.end - step.start) / 1e3,
        top=ranked,
        **extra,
    )


__all__ = ["MICROBATCH", "STEP", "StepCounts", "events", "step_counts"]
