"""`bench step`'s reading of a profiler trace (`bench.measure.step_trace`), on hand-made traces:
what counts as a launch on CPU and on CUDA, per micro-batch and per step, the weight casts
inside FSDP2's unshard ranges (not the input casts), and the GPU-busy fraction. The real
trainer's traces are read by `tests/distributed/test_bench_step.py` and
`tests/unit/test_accumulation.py`."""

from __future__ import annotations

import pytest

from boost_titan.bench.measure.step_trace import MICROBATCH, STEP, step_counts


def _x(name: str, start: float, dur: float, cat: str = "cpu_op", tid: int = 1, **args) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": start, "dur": dur, "tid": tid, "pid": 1,
            "args": args}  # fmt: skip


def _cpu_trace() -> dict:
    events = [
        _x(STEP, 0, 1000, cat="user_annotation"),
        _x(MICROBATCH, 10, 400, cat="user_annotation"),
        _x(MICROBATCH, 500, 400, cat="user_annotation"),
        # micro-batch 1: an unshard casting two weights and an input cast
        _x("FSDP::pre_forward (0)", 20, 100, cat="user_annotation"),
        _x("aten::to", 21, 10, **{"Concrete Inputs": ["", "15", "False"]}),
        _x("aten::_to_copy", 22, 5, **{"Concrete Inputs": ["", "15"]}),  # inside aten::to
        _x("aten::to", 40, 10, **{"Concrete Inputs": ["", "15", "False"]}),
        _x("aten::copy_", 60, 10),
        _x("FSDP::cast_forward_inputs", 80, 20, cat="user_annotation"),
        _x("aten::to", 81, 5, **{"Concrete Inputs": ["", "15", "False"]}),
        _x("aten::mm", 200, 50),
        _x("graph_0_cpp_fused_silu_1", 260, 5, cat="user_annotation"),
        # micro-batch 2: an fp32 upcast of a gradient is no weight cast
        _x("aten::mm", 600, 50),
        _x("FSDP::post_backward_accumulate (0)", 700, 50, cat="user_annotation"),
        _x("aten::to", 701, 10, **{"Concrete Inputs": ["", "6", "False"]}),
        # outside the micro-batches: the optimizer's ops count per step only
        _x("aten::_fused_adamw_", 950, 20),
        # before the step: not counted
        _x("aten::mm", -100, 50),
    ]
    return {"traceEvents": events}


def test_cpu_launches_are_top_level_ops_and_compiled_kernels():
    counts = step_counts(_cpu_trace(), "bfloat16", cuda=False)
    # micro-batch 1: 2 weight casts, copy_, input cast, mm, fused kernel; 2: mm, upcast
    assert counts.launches_per_step == 9
    assert counts.launches_per_microbatch == pytest.approx(8 / 2)
    assert counts.microbatches == 2
    assert counts.casts_per_step == 2
    assert counts.kernels_per_step is None and counts.gpu_busy is None
    assert counts.step_ms == pytest.approx(1.0)
    assert counts.top[0] == {"name": "aten::to", "count": 4}


def test_foreach_casts_count_every_tensor_and_fp16_casts_count():
    """Sharded FSDP2 casts a unit's weights with one foreach copy (its copy into the
    all-gather buffer is none); casts to fp16 count when fp16 is the compute dtype."""
    dims = {"Input Dims": [[[4], [8], [2]], [[4], [8], [2]]]}
    trace = {
        "traceEvents": [
            _x(STEP, 0, 100, cat="user_annotation"),
            _x(MICROBATCH, 1, 90, cat="user_annotation"),
            _x("FSDP::all_gather (0)", 20, 50, cat="user_annotation"),
            _x("aten::_foreach_copy_", 21, 10, **dims),
            _x("fsdp::all_gather_copy_in", 40, 20),
            _x("aten::_foreach_copy_", 41, 10, **dims),
        ]
    }
    assert step_counts(trace, "bfloat16", cuda=False).casts_per_step == 3
    fp16 = _x("aten::to", 5, 1, **{"Concrete Inputs": ["", "5", "False"]})
    scope = _x("FSDP::pre_backward (1)", 4, 5, cat="user_annotation")
    trace["traceEvents"] += [scope, fp16]
    assert step_counts(trace, "float16", cuda=False).casts_per_step == 3 + 1
    assert step_counts(trace, "bfloat16", cuda=False).casts_per_step == 3


def test_cuda_launches_kernels_and_busy_fraction():
    events = [
        _x(STEP, 0, 1000, cat="user_annotation"),
        _x(MICROBATCH, 0, 500, cat="user_annotation"),
        _x("cudaLaunchKernel", 10, 5, cat="cuda_runtime"),
        _x("cudaLaunchKernel", 20, 5, cat="cuda_runtime"),
        _x("cudaGraphLaunch", 30, 5, cat="cuda_runtime"),
        _x("cudaMemcpyAsync", 600, 5, cat="cuda_runtime"),
        _x("cudaStreamSynchronize", 700, 5, cat="cuda_runtime"),  # not a launch
        _x("gemm", 100, 300, cat="kernel", tid=7),
        _x("silu", 300, 200, cat="kernel", tid=8),  # overlaps the gemm: busy counts once
        _x("silu", 800, 100, cat="kernel", tid=7),
    ]
    counts = step_counts({"traceEvents": events}, "bfloat16", cuda=True, microbatches=4)
    assert counts.launches_per_step == 4
    assert counts.launches_per_microbatch == pytest.approx(3 / 4)  # a schedule's 4 in one range
    assert counts.kernels_per_step == 3
    assert counts.gpu_busy == pytest.approx((400 + 100) / 1000)
    assert counts.top[0] == {"name": "gemm", "count": 1, "ms": 0.3}


def test_a_trace_without_the_step_is_refused():
    with pytest.raises(ValueError, match="not profiled"):
        step_counts({"traceEvents": [_x("aten::mm", 0, 1)]}, "bfloat16", cuda=False)
