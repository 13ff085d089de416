"""`BoostTrainer`: TorchTitan's Trainer with its own step and loop, a PP gradient-scale fix, a
run summary and a NaN stop.

- The step (`train_step`) reads top to bottom in the order it runs: the micro-batches inside
  the run's micro-batch protocol (`runtime.microbatches`, read from the parallel layout
  the TrainSpec's `parallelize_fn` built, so any TrainSpec's model trains), clipping, one
  all-reduce of the loss and the stop flags, the non-finite skip or stop, the optimizer and
  learning-rate step, the metrics line and the run log's row. The loop (`run_steps`,
  TorchTitan's `train` loop) saves the checkpoint, validates, and after a stop the ranks
  agreed on saves the stop checkpoint and ends. Every use of TorchTitan's private API is
  in `runtime.titan_internals`.
- Pipeline parallelism: TorchTitan 0.2.2 backpropagates the *summed* per-microbatch loss
  under PP while every other layout divides it by the step's global valid-token count, so
  PP gradients come out batch*seq times too large (clipping and AdamW hide most of it).
  Here the PP schedule's loss function divides by that count during training steps.
- Every step, after clipping and before the optimizer, one all-reduce over the world group
  carries the step's loss and each rank's stop flags (`runtime.stopping`), and the host
  reads the step's figures in one sync: that sum, the gradient norm and (on a logging step
  without data parallelism) the logged loss, as one tensor (`agree_on_step`). A NaN/inf global
  loss or gradient norm never reaches the optimizer (`runtime.nonfinite`): the run stops
  with `TrainingDiverged` naming the rank, or skips the step (`[boost] skip_nonfinite_steps`).
  A SIGTERM/SIGUSR1 on any rank, or the end of `[boost] time_budget_minutes`, ends training
  on every rank after the same step, with a checkpoint of it, and `StoppedEarly` (exit
  status 75); during the last step, with a line saying the run is complete.
- A checkpoint save that fails on any rank (disk full, a file-size limit, an unwritable
  folder) ends the run with one line (`ConfigError`); DCP writes no `.metadata` then, so
  the newest complete checkpoint stays the one a rerun loads.
- The end of a run is orderly on every rank (`close`): pending checkpoint writes are
  waited for, the checkpointer's threads joined, and every process group destroyed after
  the ranks met (`boost_titan.processes.teardown`); `train.py` then ends the process
  without interpreter finalization, so that a complete run cannot end in a SIGABRT. The
  meeting replaces TorchTitan's 2 s sleep of rank 0 "for other ranks to complete" at the
  end of its `train` loop.
- Rank 0 appends each step's global loss (and each validation's held-out loss,
  `boost_titan.runtime.held_out_loss`) to `<dump_folder>/losses.jsonl` and, at the end, logs
  steps run, tokens/s, first/last loss, the last validation and where outputs went.
- The first step run measures the activations its forwards keep for backward (peak, on
  each rank; `PeakSavedActivations`); rank 0 logs them after that step and in the summary.
- The step log line ends with an ETA (median of the recent step times x the steps left)
  and the step's wait for data (time in `next()` on the data iterator,
  `runtime.step_clock`); the summary adds the run's total wait. At the first step rank 0
  logs its measured peak memory (CUDA: max reserved; CPU: peak RSS above the process's RSS
  before the model was built) next to the memory model's prediction (`memory_model`,
  which the `train` command passes: `boost_titan.perf.fits.rank0_prediction`).
- Crash recovery (`boost_titan.runtime.restarts`): before loading, rank 0 logs a torchrun
  restart and any interrupted (incomplete) checkpoint that is skipped; `BOOST_TITAN_FAULT_*`
  injects a SIGKILL (or a NaN, an inf, a SIGTERM) for testing, by wrapping the trainer's
  step methods at construction (`Fault.install`): the step itself has no fault check.
- Every rank loads the checkpoint rank 0 picks, and only after reading its pickles
  through the checkpoint allowlist (`boost_titan.runtime.resume`: `prepare_to_load`, then
  `load_checkpoint`, DCP reading through the same allowlist); a checkpoint that asks for
  anything else stops every rank with one line before the load.
- Gradient clipping uses the exact fp64 global norm (`runtime.grad_norm`), the same in every
  layout; `losses.jsonl` rows carry it as `grad_norm` (`[boost] exact_grad_norm = false`:
  TorchTitan's norm).
- Precision (`config.precision`): one of the first log lines states it ("Precision: bf16
  compute, fp32 master weights and gradient reductions" or "Precision: fp32"). TorchTitan's
  `maybe_enable_amp` (autocast on one device and under DDP; fp32 and a warning for TP or PP
  without FSDP) is replaced by `autocast_for_layout`: where the built layout casts for
  compute itself (FSDP2's mixed-precision policy or the compute copies: every layout of our
  model in bf16, `runtime.data_parallel`) there is no autocast; a layout that casts
  nothing (a TorchTitan model on one device or under DDP) gets TorchTitan's own.
- On CPU the NCCL-only settings stay quiet: the flight recorder is off (it would only leave
  an empty `comm_traces/`), and torchrun's TORCH_NCCL_ASYNC_ERROR_HANDLING is dropped
  (TorchTitan warns that it overrides it).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.tensor import DTensor
from torchtitan.components.dataloader import DataloaderExhaustedError
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.distributed.utils import clip_grad_norm_ as titan_clip_grad_norm_
from torchtitan.distributed.utils import dist_max, dist_sum, set_pg_timeouts
from torchtitan.tools.logging import logger
from torchtitan.tools.profiling import maybe_enable_memory_snapshot, maybe_enable_profiling
from torchtitan.train import Trainer

from boost_titan.checkpoint.files import latest_checkpoint, save_failure
from boost_titan.config import data_parallel_degree, global_batch
from boost_titan.config.errors import ConfigError
from boost_titan.config.precision import Precision, no_autocast
from boost_titan.processes.teardown import end_process_groups
from boost_titan.runtime.cuda_graphs import CudaGraphs, GraphedCall
from boost_titan.runtime.device import on_cpu
from boost_titan.runtime.grad_norm import clip_grad_norm_exact_
from boost_titan.runtime.loss_owner import owns_loss
from boost_titan.runtime.microbatches import casts_itself, protocol_for
from boost_titan.runtime.nonfinite import (
    NonFiniteGuard,
    RankView,
    TrainingDiverged,
    blame,
    nonfinite,
)
from boost_titan.runtime.restarts import Fault, incomplete_checkpoints
from boost_titan.runtime.resume import Resume, load_checkpoint, prepare_to_load
from boost_titan.runtime.rss import current_rss, peak_rss
from boost_titan.runtime.run_log import RunLog
from boost_titan.runtime.saved_activations import PeakSavedActivations
from boost_titan.runtime.saves import SaveWatch
from boost_titan.runtime.step_clock import StepClock, appended
from boost_titan.runtime.stopping import StoppedEarly, StopRequest, finished_line, stopped_line
from boost_titan.runtime.titan_internals import (
    checkpoint_path,
    replace_amp,
    replace_schedule_loss,
    save_now,
    saves_at,
    schedule_loss,
    wait_for_save,
)

LOSS_LOG = "losses.jsonl"
"""Per-step global loss and tokens, appended by rank 0 under the dump folder."""


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a (DTensor) gradient, sharing its storage."""
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


class TokenScaledLoss:
    """A loss function divided by `denominator` (1 outside training steps, e.g. validation)."""

    def __init__(self, loss_fn: Callable[..., torch.Tensor]):
        self.loss_fn = loss_fn
        self.denominator: torch.Tensor | float = 1.0

    def __call__(self, pred: torch.Tensor, labels: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.loss_fn(pred, labels, **kwargs) / self.denominator


Batch = tuple[dict[str, torch.Tensor], torch.Tensor]
"""A micro-batch as the data loader gives it: the inputs by name, and the labels."""

MemoryModel = Callable[[Any, int, int | None], tuple[int | None, str]]
"""(job config, world size, vocabulary where the model's args give one) -> (rank 0's
predicted peak bytes or None, what it covers)."""


class BoostTrainer(Trainer):
    """TorchTitan's Trainer with its own step and loop (module docstring)."""

    def __init__(self, job_config, memory_model: MemoryModel | None = None):
        boost = job_config.boost
        self.stop = StopRequest(boost.time_budget_minutes)
        self.stop.install()  # before the long set-up: a SIGTERM now stops after step 1
        self.stop_reason: str | None = None
        self.stopped: tuple[int, str | None] | None = None
        """(step, checkpoint saved) once training stopped early."""
        self.guard = NonFiniteGuard(boost.skip_nonfinite_steps)
        self.finished = False
        self.step_loss = 0.0
        self.titan_amp = replace_amp(self.autocast_for_layout)  # Trainer.__init__ calls it
        world = int(os.environ.get("WORLD_SIZE", 1))
        self.memory_model = memory_model
        self.rss_before_model = current_rss()
        self.priced = copy.deepcopy(job_config)  # as written: before the batch is filled in
        # [boost] gradient_accumulation_steps: the global batch follows the DP degree
        dp = data_parallel_degree(job_config.parallelism, world)
        job_config.training.global_batch_size = global_batch(job_config.training, boost, dp)
        super().__init__(job_config)
        self.async_save = SaveWatch(self.checkpointer)
        self.failed_save: CheckpointException | None = None
        self.resume: Resume | None = None  # what `train` agreed to load
        dims = self.parallel_dims
        self.pp_loss: TokenScaledLoss | None = None
        if dims.pp_enabled:
            # The schedule keeps its own reference to the loss (`_loss_fn`) and reads it lazily.
            self.pp_loss = TokenScaledLoss(schedule_loss(self.pp_schedule))
            replace_schedule_loss(self.pp_schedule, self.pp_loss)
        # The loss lives on the last PP stage and is replicated over TP: count it once.
        self.owns_loss = owns_loss(dims, dims.pp_enabled and self.pp_has_last_stage)
        self.microbatch_protocol = protocol_for(self.model_parts, dims, job_config)
        """Read from the layout `parallelize_fn` built (`runtime.microbatches`)."""
        self.graphed = self.graphed_microbatch() if boost.cuda_graphs else None
        self.dp_degree = dims.dp_replicate * dims.dp_shard
        log_path = None
        if dist.get_rank() == 0:
            os.makedirs(job_config.job.dump_folder, exist_ok=True)
            log_path = os.path.join(job_config.job.dump_folder, LOSS_LOG)
        self.run_log = RunLog(path=log_path)
        self.memory_compared = False
        self.clock = StepClock(job_config.training.steps)
        self.grad_norm: float | None = None
        self.logged: float | None = None
        """The step line's loss, fetched with the step's figures (`agree_on_step`)."""
        fault = Fault.from_env(dist.get_rank(), dist.get_world_size())
        if fault is not None:  # wraps this trainer's step methods: no check per step
            fault.install(self)
        if job_config.validation.enable:  # held-out results go to losses.jsonl and the summary
            self.validator.on_result = lambda step, result, seconds: self.run_log.record_validation(
                step, result.loss, result.tokens, seconds
            )

    def autocast_for_layout(self, parallel_dims, mixed_precision_param: str, device_type: str):
        """The autocast context of the built model (module docstring): none where the layout
        casts for compute itself or the job computes in fp32, else TorchTitan's."""
        precision = Precision.of(self.job_config.training)
        if casts_itself(self.model_parts) or not precision.casts_for_compute:
            return no_autocast()
        return self.titan_amp(parallel_dims, mixed_precision_param, device_type)

    def graphed_microbatch(self) -> GraphedCall | None:
        """The CUDA-graphed micro-batch (`runtime.cuda_graphs`), or None off CUDA."""
        if self.device.type != "cuda":
            logger.info("CUDA graphs: off (no CUDA device; --boost.cuda_graphs does nothing here)")
            return None
        # gradients zeroed in place (fixed addresses)
        self.optimizers.zero_grad = functools.partial(self.optimizers.zero_grad, set_to_none=False)
        logger.info(
            "CUDA graphs: each micro-batch's forward + loss + backward is captured in step 2 "
            "and replayed (unverified on GPUs: compare with a run without --boost.cuda_graphs)"
        )
        return GraphedCall(self.eager_microbatch, CudaGraphs())

    def eager_microbatch(
        self, labels: torch.Tensor, global_valid_tokens: torch.Tensor, inputs: torch.Tensor
    ) -> torch.Tensor:
        """TorchTitan's forward + loss + backward of one micro-batch (what a graph captures)."""
        return Trainer.forward_backward_step(
            self,
            input_dict={"input": inputs},
            labels=labels,
            global_valid_tokens=global_valid_tokens,
        )

    def init_distributed(self):
        if on_cpu():  # both are NCCL's (see the module docstring)
            self.job_config.comm.trace_buf_size = 0
            os.environ.pop("TORCH_NCCL_ASYNC_ERROR_HANDLING", None)
        dims = super().init_distributed()
        precision = Precision.of(self.job_config.training).describe(fsdp=dims.fsdp_enabled)
        logger.info(f"Precision: {precision}")
        return dims

    # ---- the step, in the order it runs ------------------------------------------------------
    def train_step(self, data_iterator: Iterator[Batch]) -> None:
        """One optimizer step: the micro-batches, clipping, one all-reduce of the loss and
        the stop flags, then the optimizer (or the skip of a non-finite step), the step's
        log line and its row in losses.jsonl."""
        self.clock.start()
        data_iterator = self.clock.waiting(data_iterator)
        self.run_log.start()
        self.microbatch_protocol.start_step()
        self.optimizers.zero_grad()
        lr = self.lr_schedulers.schedulers[0].get_last_lr()[0]
        tokens_before = self.ntokens_seen
        microbatches, local_tokens, global_tokens = self.next_microbatches(data_iterator)
        counter = self.activation_counter() if self.run_log.saved_activations is None else None
        with counter.watching() if counter is not None else contextlib.nullcontext():
            losses = self.run_microbatches(microbatches, global_tokens)
        norm = self.clip_gradients()
        logged = self.logged_loss(losses)
        self.agree_on_step(losses, norm, logged)
        what = nonfinite(self.step_loss, self.grad_norm)
        if what is not None:  # the optimizer never sees it
            self.skip_or_stop(what, losses)
            return
        self.checkpointer.maybe_wait_for_staging()
        self.optimizers.step()
        self.lr_schedulers.step()
        if self.metrics_processor.should_log(self.step):
            self.log_metrics(losses, local_tokens, global_tokens, lr)
        if counter is not None:
            self.run_log.saved_activations = (self.step, counter.peak)
            if dist.get_rank() == 0:
                logger.info(self.run_log.activations_line())
        tokens = (self.ntokens_seen - tokens_before) * self.dp_degree
        self.run_log.record(self.step, self.step_loss, tokens, self.grad_norm)

    def next_microbatches(
        self, data_iterator: Iterator[Batch]
    ) -> tuple[list[Batch], torch.Tensor, torch.Tensor | float]:
        """The step's micro-batches (on the CPU), this rank's count of valid tokens and the
        global one (summed over the batch mesh), which every micro-batch's loss divides by."""
        microbatches = []
        local_tokens = torch.tensor(0, dtype=torch.int64)
        for _ in range(self.gradient_accumulation_steps):
            input_dict, labels = next(data_iterator)
            local_tokens += (labels != IGNORE_INDEX).sum()
            microbatches.append((input_dict, labels))
        local_tokens = local_tokens.to(self.device)
        if self.parallel_dims.dp_enabled:
            global_tokens = dist_sum(local_tokens, self.parallel_dims.get_mesh("batch"))
        else:
            global_tokens = local_tokens.float()
        return microbatches, local_tokens, global_tokens

    def run_microbatches(
        self, microbatches: list[Batch], global_tokens: torch.Tensor | float
    ) -> list[torch.Tensor]:
        """Each micro-batch's forward, loss and backward inside the micro-batch protocol
        (`runtime.microbatches`); their detached losses."""
        count = len(microbatches)
        losses = []
        for index, (input_dict, labels) in enumerate(microbatches):
            self.microbatch_protocol.before_microbatch(index, count)
            on_device = {
                k: v.to(self.device) if isinstance(v, torch.Tensor) else v
                for k, v in input_dict.items()
            }
            loss = self.forward_backward_step(
                input_dict=on_device,
                labels=labels.to(self.device),
                global_valid_tokens=global_tokens,
            )
            losses.append(loss.detach())
        self.microbatch_protocol.end_step()
        return losses

    def forward_backward_step(
        self,
        *,
        input_dict: dict[str, torch.Tensor],
        labels: torch.Tensor,
        global_valid_tokens: torch.Tensor | float,
    ) -> torch.Tensor:
        """One micro-batch's forward, loss and backward: its loss summed over its tokens and
        divided by the step's global valid tokens (under PP, the schedule's micro-batches)."""
        if self.pp_loss is not None:
            return self.pipeline_microbatch(input_dict, labels, global_valid_tokens)
        # a device tensor (a float under DP): CUDA graphs copy it in
        tokens = torch.as_tensor(global_valid_tokens, dtype=torch.float32, device=self.device)
        if self.graphed is None or self.step == 1:
            return super().forward_backward_step(
                input_dict=input_dict, labels=labels, global_valid_tokens=tokens
            )
        if set(input_dict) != {"input"}:
            raise ConfigError(
                f"CUDA graphs take the token input only, got {sorted(input_dict)}; "
                "train without --boost.cuda_graphs"
            )
        return self.graphed(labels, tokens, input_dict["input"])

    def pipeline_microbatch(
        self,
        input_dict: dict[str, torch.Tensor],
        labels: torch.Tensor,
        global_valid_tokens: torch.Tensor | float,
    ) -> torch.Tensor:
        """The PP schedule's forwards and backwards of one micro-batch, each loss divided by
        the step's global valid tokens in the schedule's loss function (TorchTitan 0.2.2
        backpropagates the sum); the sum of those losses on the last stage, else -1."""
        inputs, labels, extra_inputs, extra_kwargs = self.post_dataloading_process(
            input_dict, labels
        )
        first = self.pp_has_first_stage
        last = self.pp_has_last_stage
        losses: list[torch.Tensor] | None = [] if last else None
        self.pp_loss.denominator = global_valid_tokens
        try:
            with self.train_context():
                self.pp_schedule.step(
                    *([inputs] if first else []),
                    **(extra_inputs if first else {}),
                    **extra_kwargs,
                    target=labels if last else None,
                    losses=losses,
                    return_outputs=False,
                )
        finally:
            self.pp_loss.denominator = 1.0  # validation runs the same schedule
        if losses is None:
            return torch.tensor([-1.0], device=self.device)
        # PP+FSDP puts the loss back on the CPU (TorchTitan's note)
        return torch.sum(torch.stack(losses)).to(self.device)

    def local_grads(self) -> list[torch.Tensor]:
        """This rank's shards of the gradients (sharing their storage)."""
        parameters = [p for m in self.model_parts for p in m.parameters()]
        return [_local(p.grad) for p in parameters if p.grad is not None]

    def clip_gradients(self) -> torch.Tensor:
        """Clip the gradients to `training.max_norm` by their global norm, returned as a
        tensor (read with the step's loss, `agree_on_step`): the exact fp64 norm
        (`runtime.grad_norm`), TorchTitan's with `[boost] exact_grad_norm = false`."""
        parameters = [p for m in self.model_parts for p in m.parameters()]
        exact = self.job_config.boost.exact_grad_norm
        clip = clip_grad_norm_exact_ if exact else titan_clip_grad_norm_
        norm = clip(
            parameters,
            self.job_config.training.max_norm,
            foreach=True,
            pp_mesh=self.parallel_dims.get_optional_mesh("pp"),
            ep_enabled=self.parallel_dims.ep_enabled,
        )
        return norm

    def local_loss(self, losses: list[torch.Tensor]) -> torch.Tensor:
        """This rank's part of the step's loss."""
        # Under loss parallel the loss is a replicated DTensor.
        full = [loss.full_tensor() if isinstance(loss, DTensor) else loss for loss in losses]
        return torch.stack(full).sum()

    def logged_loss(self, losses: list[torch.Tensor]) -> torch.Tensor | None:
        """The loss of the step's log line where it is this rank's own sum (no data
        parallelism) and the step logs, else None (`log_metrics` reduces it)."""
        if self.parallel_dims.dp_cp_enabled or not self.metrics_processor.should_log(self.step):
            return None
        return torch.sum(torch.stack(losses))

    def agree_on_step(
        self, losses: list[torch.Tensor], norm: torch.Tensor, logged: torch.Tensor | None
    ) -> None:
        """One all-reduce: the step's global loss and every rank's stop flags; then the
        step's one host sync: those, the gradient norm and the logged loss in one fetch."""
        local = self.local_loss(losses) if self.owns_loss else torch.zeros(())
        flags = self.stop.flags()
        values = [local.to(device=self.device, dtype=torch.float64).reshape(1)]
        values.append(torch.tensor(flags, dtype=torch.float64, device=self.device))
        summed = torch.cat(values)
        dist.all_reduce(summed)
        fetched = [summed, norm.to(device=self.device, dtype=torch.float64).reshape(1)]
        if logged is not None:
            fetched.append(_local(logged).to(device=self.device, dtype=torch.float64).reshape(1))
        loss, *figures = torch.cat(fetched).tolist()
        self.step_loss = loss
        self.stop_reason = self.stop_reason or self.stop.reason(figures[: len(flags)])
        self.grad_norm = figures[len(flags)]
        self.logged = figures[len(flags) + 1] if logged is not None else None

    def skip_or_stop(self, what: str, losses: list[torch.Tensor]) -> None:
        """A non-finite step (collective): skip it within the limit, else raise
        `TrainingDiverged`; either way the optimizer has not run."""
        local = self.local_loss(losses).item() if self.owns_loss else None
        grads = [_local(p.grad) for m in self.model_parts for p in m.parameters()]
        finite = all(bool(torch.isfinite(g).all()) for g in grads if g is not None)
        views: list = [None] * dist.get_world_size()
        dist.all_gather_object(views, RankView(local, finite))
        where = blame(views)
        if self.guard.skip():
            self.lr_schedulers.step()  # the schedule stays aligned with the step numbers
            line = self.guard.skip_line(self.step, what, where)
            if dist.get_rank() == 0:
                logger.warning(line)
            self.run_log.record_skip(self.step, line, self.guard.skipped)
            return
        kept = latest_checkpoint(self.checkpointer.folder) if self.checkpointer.enable else None
        raise TrainingDiverged(self.guard.stop_message(self.step, what, where, kept))

    def log_metrics(
        self,
        losses: list[torch.Tensor],
        local_tokens: torch.Tensor,
        global_tokens: torch.Tensor | float,
        lr: float,
    ) -> None:
        """TorchTitan's metrics of the step (the step line, TensorBoard): the average and
        the largest loss over the data-parallel ranks, tokens seen, learning rate."""
        dims = self.parallel_dims
        if dims.dp_cp_enabled:
            loss = torch.sum(torch.stack(losses))
            loss_mesh = dims.get_optional_mesh("loss")
            # the largest of the ranks' own averages: local sum / local tokens
            local_average = loss * global_tokens / local_tokens
            seen = torch.tensor(self.ntokens_seen, dtype=torch.int64, device=self.device)
            average = dist_sum(loss, loss_mesh)
            largest = dist_max(local_average, loss_mesh)
            tokens_seen = dist_sum(seen, loss_mesh)
        else:
            average = largest = self.logged
            tokens_seen = self.ntokens_seen
        extra = {"n_tokens_seen": tokens_seen, "lr": lr}
        self.log_step(self.step, average, largest, self.grad_norm, extra_metrics=extra)

    def log_step(self, step: int, *args, **kwargs) -> None:
        """TorchTitan's step line with the clock's ETA and data wait appended; after the
        first one, rank 0's measured peak memory against the prediction."""
        measured = None if self.memory_compared else self.peak_memory()  # before its reset
        with appended(logger, self.clock.tail(step)):
            self.metrics_processor.log(step, *args, **kwargs)
        if measured is not None:
            self.memory_compared = True
            if dist.get_rank() == 0:
                logger.info(self.memory_line(step, *measured))

    def peak_memory(self) -> tuple[int, str]:
        """(bytes, what was measured): CUDA's max reserved since the last log line, else the
        process's peak RSS above what it held before the model (interpreter, libraries)."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_reserved(self.device), "CUDA max reserved"
        before = self.rss_before_model
        return peak_rss() - before, (
            f"peak RSS less the {before / 2**30:.3f} GiB the process held before building "
            "the model: data, buffers and allocator slack included"
        )

    def memory_line(self, step: int, measured: int, what: str) -> str:
        """`memory at step 1 on rank 0: 61.200 GiB measured (CUDA max reserved) vs 58.900
        GiB predicted (+3.9%; ...)`."""
        head = f"memory at step {step} on rank 0: {measured / 2**30:.3f} GiB measured ({what})"
        if self.memory_model is None:
            return f"{head}; no prediction (no memory model given to the trainer)"
        world = dist.get_world_size()
        vocab = getattr(self.model_args, "vocab_size", None)  # a user's model may have none
        predicted, covers = self.memory_model(self.priced, world, vocab)
        if predicted is None:
            return f"{head}; {covers}"
        change = 100 * (measured - predicted) / predicted
        return f"{head} vs {predicted / 2**30:.3f} GiB predicted ({change:+.1f}%; {covers})"

    def activation_counter(self) -> PeakSavedActivations:
        """Measures what the forwards save for backward; under PP the stages' micro-batch
        forwards (in the first step a stage also runs its model part to infer metadata)."""
        calls = None
        if self.parallel_dims.pp_enabled:
            schedule = self.pp_schedule
            stages = getattr(schedule, "_stages", None) or [schedule._stage]
            calls = [(stage, "forward_one_chunk") for stage in stages]
        compile_config = self.job_config.compile
        compiled = compile_config.enable and "model" in compile_config.components
        # torch.compile refuses the op-tracking dispatch mode (see saved_activation_bytes)
        return PeakSavedActivations(self.model_parts, calls=calls, track_ops=not compiled)

    # ---- the loop ----------------------------------------------------------------------------
    def train(self):
        """Load, run the steps (`run_steps`), then log the summary; a run stopped early
        raises `StoppedEarly`."""
        if self.checkpointer.enable:
            self.resume = prepare_to_load(self.checkpointer, self.job_config.checkpoint.load_step)
            if dist.get_rank() == 0:
                self.log_resume_state()
        try:
            self.run_steps()
        except CheckpointException as e:  # a BaseException: TorchTitan's main misses it
            self.failed_save = e
            raise self.save_failed(e) from None
        self.finished = True
        if dist.get_rank() == 0:
            self.clock.close()
            waited = self.clock.wait_line()
            logger.info(f"Summary: {self.run_log.summary(self.step)}{f'; {waited}' * bool(waited)}")
            shares = getattr(getattr(self.dataloader, "dataset", None), "shares_line", None)
            if shares is not None:  # prepared data: `data.mix`
                logger.info(shares())
            logger.info(f"Outputs: {self.output_locations()}")
        # on every node's first process: each node's relay (SLURM: one per node) ends on it
        first_local = os.environ.get("LOCAL_RANK", "0") == "0"
        if self.stopped is not None:
            line = stopped_line(self.stop_reason, *self.stopped)
            if first_local:
                print(line, file=sys.stderr, flush=True)
            raise StoppedEarly(line)  # exit status STOPPED (`job.entry`)
        reason = self.stop_reason or self.stop.signal
        if reason is not None and first_local:  # asked for during the last step or its save
            saved = (
                latest_checkpoint(self.checkpointer.folder) if self.checkpointer.enable else None
            )
            print(finished_line(reason, self.step, saved), file=sys.stderr, flush=True)

    @record
    def run_steps(self) -> None:
        """TorchTitan's loop: load the checkpoint, then each step followed by its checkpoint
        save, validation and profiler step, until the last step, the end of the data, or a
        stop the ranks agreed on (then this step's checkpoint is saved and the loop ends)."""
        job = self.job_config
        if self.checkpointer.enable:
            load_checkpoint(self.checkpointer, self.resume)
        logger.info(f"Training starts at step {self.step + 1}")
        profiling = maybe_enable_profiling(
            job.profiling, global_step=self.step, base_folder=job.job.dump_folder
        )
        snapshots = maybe_enable_memory_snapshot(
            job.profiling, global_step=self.step, base_folder=job.job.dump_folder
        )
        with profiling as torch_profiler, snapshots as memory_profiler:
            data_iterator = self.batch_generator(self.dataloader)
            while self.step < job.training.steps:
                self.step += 1
                self.gc_handler.run(self.step)
                try:
                    self.train_step(data_iterator)
                except DataloaderExhaustedError:
                    logger.warning("Ran out of data; last step was canceled.")
                    break
                self.checkpointer.save(self.step, last_step=self.step == job.training.steps)
                self.async_save.saved(self.step)
                if job.validation.enable and self.validator.should_validate(self.step):
                    self.validator.validate(self.model_parts, self.step)
                if torch_profiler:
                    torch_profiler.step()
                if memory_profiler:
                    memory_profiler.step()
                if self.step == 1:  # faster signal once lazy init and compilation are done
                    timeout = timedelta(seconds=job.comm.train_timeout_seconds)
                    set_pg_timeouts(timeout=timeout, parallel_dims=self.parallel_dims)
                if self.stop_reason is not None:
                    if self.step < job.training.steps:
                        self.stopped = (self.step, self.save_stop_checkpoint())
                    break
        if dist.get_rank() == 0:
            logger.info("Training completed")

    def save_stop_checkpoint(self) -> str | None:
        """A complete checkpoint of this step, written now (collective), or None without
        checkpointing. The loop's own save of this step, if any, is only waited for."""
        ckpt = self.checkpointer
        if not ckpt.enable or ckpt.load_only:
            return None
        saved_by_loop = saves_at(ckpt, self.step, self.step == self.job_config.training.steps)
        wait_for_save(ckpt)
        path = checkpoint_path(ckpt, self.step)
        if not saved_by_loop:
            logger.info(f"Saving the checkpoint of step {self.step} before stopping.")
            save_now(ckpt, path)
        return path

    def close(self) -> None:
        """The orderly end of every rank; TorchTitan's `main` calls it after training and
        after an error: the checkpointer's pending write, its threads, then the process
        groups (`processes.teardown`: ranks meet only after a finished run)."""
        ckpt = getattr(self, "checkpointer", None)
        try:
            if ckpt is not None and ckpt.enable:
                wait_for_save(ckpt)  # an async save still writing
        except CheckpointException as e:
            if self.finished:
                raise self.save_failed(e) from None
            if e is not self.failed_save:  # after another error: said, not raised over it
                logger.warning(str(self.save_failed(e)))
        finally:
            super().close()
            end_process_groups(finished=self.finished)

    def save_failed(self, error: CheckpointException) -> ConfigError:
        """The one-line error for a failed save: which checkpoint, why, and which complete
        one a rerun resumes from."""
        current = checkpoint_path(self.checkpointer, self.step)
        path = self.async_save.failed(error, current)
        kept = latest_checkpoint(self.checkpointer.folder)
        return ConfigError(save_failure(error.failures, path, kept))

    def log_resume_state(self) -> None:
        """Say that torchrun restarted the job and which interrupted checkpoints are skipped."""
        folder = self.checkpointer.folder
        for path in incomplete_checkpoints(folder):
            logger.warning(
                f"skipping incomplete checkpoint {path}: "
                "no DCP .metadata (its save was interrupted)"
            )
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
        if restart > 0:
            latest = latest_checkpoint(folder)
            logger.warning(
                f"torchrun restart {restart} of {os.environ.get('TORCHELASTIC_MAX_RESTARTS')} "
                "after a worker failure; "
                f"newest complete checkpoint: {latest or 'none (starting over)'}"
            )

    def output_locations(self) -> str:
        """Where this run's checkpoints and TensorBoard logs are."""
        job = self.job_config
        if self.checkpointer.enable:
            where = latest_checkpoint(self.checkpointer.folder) or self.checkpointer.folder
            parts = [f"checkpoint {where}"]
        else:
            parts = ["no checkpoint (checkpoint.enable is off)"]
        parts.append(f"losses {os.path.join(job.job.dump_folder, LOSS_LOG)}")
        if job.metrics.enable_tensorboard:
            tb_root = os.path.join(job.job.dump_folder, job.metrics.save_tb_folder)
            parts.append(f"tensorboard logs under {tb_root} (one folder per launch)")
        else:
            parts.append("no tensorboard (metrics.enable_tensorboard is off)")
        return ", ".join(parts)
