"""CUDA graphs for the training step: a micro-batch's forward + loss + backward, captured once
and replayed, so the host issues one graph launch instead of thousands of kernel launches.

`[boost] cuda_graphs = true` (`--boost.cuda_graphs`). The trainer runs its first step eagerly
(torch.compile compiles, FSDP2 initialises, the activation count runs), then the first
micro-batch of the second step eagerly on a side stream (`WARMUP_CALLS`: CUDA libraries
create their handles outside capture), captures the next one, and replays that graph for
every micro-batch after it, as TorchTitan's main branch does (pytorch/torchtitan#3559).
What a replay needs, the trainer provides:

- fixed shapes: every micro-batch has the same [local_batch_size, seq_len] tokens (a
  changed shape is one error line);
- inputs at fixed addresses: each call copies the tokens, labels and the step's token
  count (a device tensor, also in eager mode so both divide the loss alike) into the
  captured input tensors;
- gradients at fixed addresses: the optimizer zeroes them in place (`set_to_none=False`);
- the same work for every micro-batch: FSDP2 reshards and reduces after each one (the
  micro-batch protocol keeps nothing: `runtime.data_parallel`), so on a layout that
  shards nothing the weight cast runs inside each replay, on the GPU only;
- a loss that survives the next replay: the output is cloned.

Refused in one line (`config.check_cuda_graphs`): pipeline parallelism (its schedule runs
many micro-batches and host-side bookkeeping per step). Anything inside the step that waits
for the host (`.item()`, data-dependent shapes) fails the capture: the error line names it
and the switch. On a machine without CUDA the switch does nothing and the log says so.

Not yet run on a GPU: default off until a CUDA run has shown that losses and gradients
equal eager's bit for bit (docs/performance.md says how to check).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from boost_titan.config.errors import ConfigError

WARMUP_CALLS = 1
"""Eager calls on the capture stream's side before the capture."""


class GraphBackend(Protocol):
    """How a graph is warmed up, captured and replayed (CUDA, or a CPU stand-in in tests)."""

    def warmup(self, fn: Callable[..., Any], args: Sequence[torch.Tensor]) -> Any: ...

    def capture(self, fn: Callable[..., Any], args: Sequence[torch.Tensor]) -> tuple[Any, Any]:
        """(graph, output): `fn(*args)` recorded, not run."""
        ...

    def replay(self, graph: Any) -> None: ...


class CudaGraphs:
    """torch.cuda graphs on one side stream and one memory pool."""

    def __init__(self) -> None:
        self.stream = torch.cuda.Stream()
        self.pool = torch.cuda.graph_pool_handle()

    def warmup(self, fn: Callable[..., Any], args: Sequence[torch.Tensor]) -> Any:
        current = torch.cuda.current_stream()
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            output = fn(*args)
        current.wait_stream(self.stream)
        return output

    def capture(self, fn: Callable[..., Any], args: Sequence[torch.Tensor]) -> tuple[Any, Any]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(
            graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"
        ):
            output = fn(*args)
        return graph, output

    def replay(self, graph: Any) -> None:
        graph.replay()


class GraphedCall:
    """`fn(*tensors) -> tensor`, eager for `WARMUP_CALLS` calls, then captured once and
    replayed: inputs copied into the captured ones, the output cloned."""

    def __init__(self, fn: Callable[..., Any], backend: GraphBackend) -> None:
        self.fn = fn
        self.backend = backend
        self.warmups_left = WARMUP_CALLS
        self.graph: Any = None
        self.inputs: list[torch.Tensor] = []
        self.output: Any = None

    def __call__(self, *args: torch.Tensor) -> Any:
        if self.graph is None and self.warmups_left > 0:
            self.warmups_left -= 1
            return self.backend.warmup(self.fn, args)
        if self.graph is None:
            self.inputs = [a.clone() for a in args]
            try:
                self.graph, self.output = self.backend.capture(self.fn, self.inputs)
            except RuntimeError as e:
                reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ConfigError(
                    f"a micro-batch could not be captured as a CUDA graph ({reason}); "
                    "train without --boost.cuda_graphs"
                ) from None
        for captured, arg in zip(self.inputs, args, strict=True):
            if captured.shape != arg.shape or captured.dtype != arg.dtype:
                raise ConfigError(
                    f"a CUDA graph replays fixed shapes: it was captured for "
                    f"{tuple(captured.shape)} {captured.dtype}, got {tuple(arg.shape)} "
                    f"{arg.dtype}; train without --boost.cuda_graphs"
                )
            captured.copy_(arg)
        self.backend.replay(self.graph)
        return self.output.clone()


__all__ = ["CudaGraphs", "GraphBackend", "GraphedCall", "WARMUP_CALLS"]
