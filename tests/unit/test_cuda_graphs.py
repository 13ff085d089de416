"""CUDA graphs of the training step (`runtime.cuda_graphs`): the capture-and-replay plumbing on
a CPU stand-in, the refusals, and the switch doing nothing on CPU (bench step's trainer logs
it). Capture itself needs a GPU: `scripts/gpu_check.sh` compares graphed and eager runs.

The stand-in records at capture without running (as CUDA does) and replays by running the
recorded function on the captured inputs, writing into the output it handed out.
"""

from __future__ import annotations

import pytest
import torch

from boost_titan.config import Boost, check_cuda_graphs
from boost_titan.config.errors import ConfigError
from boost_titan.runtime.cuda_graphs import WARMUP_CALLS, GraphedCall


class RecordingBackend:
    """Capture records `fn` and its inputs; replay runs it and writes into the output."""

    def __init__(self, output_shape: tuple[int, ...]) -> None:
        self.output_shape = output_shape
        self.calls: list[str] = []

    def warmup(self, fn, args):
        self.calls.append("warmup")
        return fn(*args)

    def capture(self, fn, args):
        self.calls.append("capture")
        output = torch.empty(self.output_shape)
        return (fn, list(args), output), output

    def replay(self, graph):
        self.calls.append("replay")
        fn, args, output = graph
        output.copy_(fn(*args))


def _weighted_sum(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x * w).sum(dim=0)


def test_warmup_then_one_capture_then_replays_with_new_inputs():
    backend = RecordingBackend((3,))
    call = GraphedCall(_weighted_sum, backend)
    outputs, wanted = [], []
    for i in range(4):
        x, w = torch.full((2, 3), float(i)), torch.arange(6.0).view(2, 3)
        outputs.append(call(x, w))
        wanted.append(_weighted_sum(x, w))
    assert backend.calls == ["warmup"] * WARMUP_CALLS + ["capture"] + ["replay"] * (
        4 - WARMUP_CALLS
    )
    for got, want in zip(outputs, wanted, strict=True):
        assert torch.equal(got, want)  # each call's own inputs; earlier outputs not overwritten


def test_changed_shape_is_one_error_naming_the_switch():
    call = GraphedCall(_weighted_sum, RecordingBackend((3,)))
    for _ in range(WARMUP_CALLS + 1):
        call(torch.ones(2, 3), torch.ones(2, 3))
    with pytest.raises(ConfigError, match=r"fixed shapes.*without --boost.cuda_graphs"):
        call(torch.ones(4, 3), torch.ones(4, 3))


def test_failed_capture_is_one_error_naming_the_switch():
    class Failing(RecordingBackend):
        def capture(self, fn, args):
            raise RuntimeError("operation not permitted when stream is capturing\nmore")

    call = GraphedCall(_weighted_sum, Failing((3,)))
    for _ in range(WARMUP_CALLS):
        call(torch.ones(2, 3), torch.ones(2, 3))
    with pytest.raises(ConfigError, match=r"not permitted when stream is capturing\);"):
        call(torch.ones(2, 3), torch.ones(2, 3))


def test_pipeline_parallelism_is_refused():
    check_cuda_graphs(Boost(cuda_graphs=True), pipeline_degree=1)
    check_cuda_graphs(Boost(cuda_graphs=False), pipeline_degree=2)
    with pytest.raises(ConfigError, match="does not support pipeline parallelism"):
        check_cuda_graphs(Boost(cuda_graphs=True), pipeline_degree=2)
