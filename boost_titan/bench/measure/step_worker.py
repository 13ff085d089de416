"""The worker of `python -m boost_titan.bench step`: the real trainer, timed and profiled.

    torchrun ... -m boost_titan.bench.measure.step_worker --job.config_file X.toml [...]

Runs the training worker (`boost_titan.job.entry`) with `ProbedTrainer`: every step is
timed (the device synchronised at both ends) and so is each micro-batch's forward + loss +
backward on the host (no synchronisation: on a GPU, the time the host takes to issue it);
the steps after the first `BOOST_TITAN_STEP_WARMUP` and before the last are the timed ones;
the last step runs under torch.profiler (`bench.measure.step_trace` reads the trace). Rank 0
writes the report to the JSON file `BOOST_TITAN_STEP_REPORT` (and the trace to
`BOOST_TITAN_STEP_TRACE`, if set).
"""

from __future__ import annotations

import inspect
import json
import os
import statistics
import tempfile
import time

# isort: off
from boost_titan.job import entry  # the worker (`entry.run` prepares the process)

try:
    from boost_titan.processes.teardown import run_to_end
except ImportError:  # an earlier commit (scripts/compare_step.py): no orderly end to call
    run_to_end = None
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

from boost_titan.bench.measure.step import TRACE_ENV
from boost_titan.bench.measure.step_trace import MICROBATCH, STEP, step_counts

try:
    from boost_titan.perf.fits import rank0_prediction
except ImportError:  # an earlier commit (scripts/compare_step.py): no memory model to pass
    rank0_prediction = None
from boost_titan.config.precision import Precision
from boost_titan.runtime.trainer import BoostTrainer

# isort: on

REPORT_ENV = "BOOST_TITAN_STEP_REPORT"
WARMUP_ENV = "BOOST_TITAN_STEP_WARMUP"


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


class ProbedTrainer(BoostTrainer):
    """BoostTrainer whose steps are timed and whose last step is profiled (module docstring)."""

    def __init__(self, job_config):
        model = {"memory_model": rank0_prediction} if rank0_prediction else {}
        super().__init__(job_config, **model)
        self.warmup = int(os.environ.get(WARMUP_ENV, "1"))
        self.step_s: list[float] = []
        self.host_s: list[float] = []
        self.wait_s: list[float] = []
        """Each timed step's time in `next()` on the data iterator (`runtime.step_clock`)."""
        self.step_host_s = 0.0
        self.cuda = self.device.type == "cuda"

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def forward_backward_step(self, **kwargs) -> torch.Tensor:
        start = time.perf_counter()
        with record_function(MICROBATCH):
            loss = super().forward_backward_step(**kwargs)
        self.step_host_s += time.perf_counter() - start
        return loss

    def train_step(self, data_iterator) -> None:
        last = self.step == self.job_config.training.steps
        self.step_host_s = 0.0
        if last:
            self._profiled_step(data_iterator)
            return
        self._sync()
        start = time.perf_counter()
        super().train_step(data_iterator)
        self._sync()
        if self.step > self.warmup:
            self.step_s.append(time.perf_counter() - start)
            self.host_s.append(self.step_host_s / self.microbatches)
            clock = getattr(self, "clock", None)  # an earlier commit has none
            if clock is not None:
                self.wait_s.append(clock.wait)  # this step's, until the next one starts

    @property
    def microbatches(self) -> int:
        """Micro-batches per step: gradient accumulation x pipeline micro-batches."""
        per_schedule = 1
        if self.parallel_dims.pp_enabled:
            schedule = self.pp_schedule
            per_schedule = getattr(schedule, "_n_microbatches", 1)
        return self.gradient_accumulation_steps * per_schedule

    def _profiled_step(self, data_iterator) -> None:
        activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * self.cuda
        with profile(activities=activities, record_shapes=True) as prof:
            with record_function(STEP):
                super().train_step(data_iterator)
            self._sync()
        if dist.get_rank() == 0:
            self._report(prof)

    def _report(self, prof) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.environ.get(TRACE_ENV) or os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                trace = json.load(f)
        training = self.job_config.training
        counts = step_counts(
            trace, training.mixed_precision_param, self.cuda, microbatches=self.microbatches
        )
        if not self.step_s:
            raise RuntimeError("no timed step: raise --steps above the warm-up")
        tokens = self.tokens_per_step()
        step_s = _spread(self.step_s)
        report = {
            "device": torch.cuda.get_device_name(self.device) if self.cuda else "cpu",
            "world_size": dist.get_world_size(),
            "precision": Precision.of(training).describe(fsdp=self.parallel_dims.fsdp_enabled),
            "compile": self.job_config.compile.enable,
            "microbatches": self.microbatches,
            "tokens_per_step": tokens,
            "timed_steps": len(self.step_s),
            "tokens_per_s": tokens / step_s["median"],
            "step_ms": 1e3 * step_s["median"],
            "step_ms_min": 1e3 * step_s["min"],
            "step_ms_max": 1e3 * step_s["max"],
            **self.data_report(tokens // self.dp_degree),
            "host_ms_per_microbatch": 1e3 * statistics.median(self.host_s),
            "host_ms_per_microbatch_min": 1e3 * min(self.host_s),
            "host_ms_per_microbatch_max": 1e3 * max(self.host_s),
            "launches_per_microbatch": counts.launches_per_microbatch,
            "launches_per_step": counts.launches_per_step,
            "casts_per_step": counts.casts_per_step,
            "param_tensors": sum(len(list(m.parameters())) for m in self.model_parts),
            "profiled_step_ms": counts.step_ms,
            "kernels_per_step": counts.kernels_per_step,
            "gpu_busy": counts.gpu_busy,
            "top": counts.top,
        }
        with open(os.environ[REPORT_ENV], "w") as f:
            json.dump(report, f, indent=1)

    def data_report(self, rank_tokens: int) -> dict:
        """The timed steps' waits for data: median ms, median share of the step, and the
        loader's tokens/s on one rank (its tokens per step over its time in `next()`)."""
        if not self.wait_s:
            return {}
        wait = statistics.median(self.wait_s)
        shares = [w / s for w, s in zip(self.wait_s, self.step_s, strict=True)]
        return {
            "data_wait_ms": 1e3 * wait,
            "data_wait_ms_max": 1e3 * max(self.wait_s),
            "data_wait_share": statistics.median(shares),
            "data_wait_share_max": max(shares),
            "tokens_per_rank_step": rank_tokens,
            "loader_tokens_per_s_per_rank": rank_tokens / wait if wait > 0 else None,
        }

    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step over every data-parallel rank."""
        training = self.job_config.training
        local = training.local_batch_size * training.seq_len * self.gradient_accumulation_steps
        return local * self.dp_degree


def _run() -> None:
    if "trainer_cls" in inspect.signature(entry.run).parameters:
        entry.run(ProbedTrainer)
    else:  # a checkout from before `run` took the trainer (scripts/compare_step.py)
        entry.BoostTrainer = ProbedTrainer
        entry.run()


if __name__ == "__main__":
    if run_to_end is not None:
        run_to_end(_run)  # the worker's orderly end, as `boost_titan.train`'s
    else:
        _run()
