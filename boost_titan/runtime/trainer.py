"""`BoostTrainer`: TorchTitan's Trainer with a PP gradient-scale fix, a run summary and a NaN stop.

- Pipeline parallelism: TorchTitan 0.2.2 backpropagates the *summed* per-microbatch loss
  under PP while every other layout divides it by the step's global valid-token count, so
  PP gradients come out batch*seq times too large (clipping and AdamW hide most of it).
  Here the PP schedule's loss function divides by that count during training steps.
- Every step, after clipping and before the optimizer, one all-reduce over the world group
  carries the step's loss and each rank's stop flags (`runtime.stopping`). A NaN/inf global
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
  the ranks met (`boost_titan.parallelize.teardown`); `train.py` then ends the process
  without interpreter finalization, so that a complete run cannot end in a SIGABRT. The
  meeting replaces TorchTitan's 2 s sleep of rank 0 "for other ranks to complete" at the
  end of `train` (its only sleep, skipped here; TorchTitan still logs the line).
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
  injects a SIGKILL for testing.
- Every rank loads the checkpoint rank 0 picks, and only after reading its pickles
  through the checkpoint allowlist (`boost_titan.runtime.resume.prepare_to_load`): DCP's
  loads are guarded for the whole process (`boost_titan.parallelize.safe_load`), and a
  checkpoint that asks for anything else stops every rank with one line before the load.
- Gradient clipping uses the exact fp64 global norm (`runtime.grad_norm`), the same in every
  layout; `losses.jsonl` rows carry it as `grad_norm`. TorchTitan's `train_step` finds
  its clipping function through `torchtitan.distributed.utils`, which this trainer points
  at its own `clip_grad_norm_` (`[boost] exact_grad_norm = false`: TorchTitan's norm).
- Precision (`config.precision`): one of the first log lines states it ("Precision: bf16
  compute, fp32 master weights and gradient reductions" or "Precision: fp32"). TorchTitan's
  `maybe_enable_amp` (autocast on one device and under DDP; fp32 and a warning for TP or PP
  without FSDP) is replaced by `no_autocast` before `Trainer.__init__` calls it: FSDP2's
  mixed-precision policy or, where nothing is sharded, `runtime.compute_copies` does every
  cast (`boost_llama.data_parallel`), once per weight per step where nothing is sharded
  (the copies held from a step's first micro-batch to its last backward; FSDP2's switches
  set before every micro-batch, `runtime.accumulation`).
- On CPU the NCCL-only settings stay quiet: the flight recorder is off (it would only leave
  an empty `comm_traces/`), and torchrun's TORCH_NCCL_ASYNC_ERROR_HANDLING is dropped
  (TorchTitan warns that it overrides it).
"""

from __future__ import annotations

import copy
import functools
import os
import sys
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
import torchtitan.distributed.utils as titan_dist_utils
import torchtitan.train as titan_train
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.tensor import DTensor
from torchtitan.components.checkpoint import AsyncMode
from torchtitan.tools.logging import logger
from torchtitan.train import Trainer

from boost_titan.config import data_parallel_degree, global_batch
from boost_titan.config.errors import ConfigError
from boost_titan.config.precision import Precision, no_autocast
from boost_titan.parallelize.teardown import end_process_groups
from boost_titan.runtime.accumulation import Accumulation, fsdp_modules
from boost_titan.runtime.checkpoint_files import AsyncSaveFolder, latest_checkpoint, save_failure
from boost_titan.runtime.compute_copies import compute_copies_of
from boost_titan.runtime.cuda_graphs import CudaGraphs, GraphedCall
from boost_titan.runtime.device import on_cpu
from boost_titan.runtime.grad_norm import clip_grad_norm_exact_
from boost_titan.runtime.held_out_loss import owns_loss
from boost_titan.runtime.nonfinite import (
    NonFiniteGuard,
    RankView,
    TrainingDiverged,
    blame,
    nonfinite,
)
from boost_titan.runtime.restarts import Fault, incomplete_checkpoints
from boost_titan.runtime.resume import prepare_to_load
from boost_titan.runtime.rss import current_rss, peak_rss
from boost_titan.runtime.run_log import RunLog
from boost_titan.runtime.saved_activations import PeakSavedActivations
from boost_titan.runtime.step_clock import StepClock, appended
from boost_titan.runtime.stopping import StoppedEarly, StopRequest, finished_line, stopped_line

TITAN_CLIP = titan_dist_utils.clip_grad_norm_
"""TorchTitan's own clipping, kept before the trainer points `train_step` at its own."""

LOSS_LOG = "losses.jsonl"
"""Per-step global loss and tokens, appended by rank 0 under the dump folder."""


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a (DTensor) gradient, sharing its storage."""
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


class NonFiniteStep(Exception):
    """Raised between clipping and the optimizer step when the step must not update."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


class TokenScaledLoss:
    """A loss function divided by `denominator` (1 outside training steps, e.g. validation)."""

    def __init__(self, loss_fn: Callable[..., torch.Tensor]):
        self.loss_fn = loss_fn
        self.denominator: torch.Tensor | float = 1.0

    def __call__(self, pred: torch.Tensor, labels: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.loss_fn(pred, labels, **kwargs) / self.denominator


MemoryModel = Callable[[Any, int, int], tuple[int | None, str]]
"""(job config, world size, vocabulary) -> (rank 0's predicted peak bytes or None, what it
covers)."""


class BoostTrainer(Trainer):
    """TorchTitan's Trainer plus the fixes and reporting described in the module docstring."""

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
        titan_dist_utils.maybe_enable_amp = no_autocast  # Trainer.__init__ calls it
        world = int(os.environ.get("WORLD_SIZE", 1))
        self.memory_model = memory_model
        self.rss_before_model = current_rss()
        self.priced = copy.deepcopy(job_config)  # as written: before the batch is filled in
        # [boost] gradient_accumulation_steps: the global batch follows the DP degree
        dp = data_parallel_degree(job_config.parallelism, world)
        job_config.training.global_batch_size = global_batch(job_config.training, boost, dp)
        # the ranks meet in close() instead of rank 0 sleeping 2 s at the end of train()
        titan_train.time = SimpleNamespace(perf_counter=time.perf_counter, sleep=lambda s: None)
        super().__init__(job_config)
        self.async_save = AsyncSaveFolder(self.checkpointer)
        self.failed_save: CheckpointException | None = None
        dims = self.parallel_dims
        self.pp_loss: TokenScaledLoss | None = None
        if dims.pp_enabled:
            # The schedule keeps its own reference to the loss (`_loss_fn`) and reads it lazily.
            self.pp_loss = TokenScaledLoss(self.pp_schedule._loss_fn)
            self.pp_schedule._loss_fn = self.pp_loss
        # The loss lives on the last PP stage and is replicated over TP: count it once.
        self.owns_loss = owns_loss(dims, dims.pp_enabled and self.pp_has_last_stage)
        # PP schedules defer resharding and reduction to a stage's last backward themselves
        self.fsdp_modules = [] if dims.pp_enabled else fsdp_modules(self.model_parts)
        self.accumulation = Accumulation.for_layout(
            shards_weights=dims.fsdp_enabled,
            reshard_policy=job_config.parallelism.fsdp_reshard_after_forward,
        )
        self.copies = None if dims.pp_enabled else compute_copies_of(self.model_parts[0])
        self.microbatch = 0
        self.graphed = self.graphed_microbatch() if boost.cuda_graphs else None
        self.dp_degree = dims.dp_replicate * dims.dp_shard
        log_path = None
        if dist.get_rank() == 0:
            os.makedirs(job_config.job.dump_folder, exist_ok=True)
            log_path = os.path.join(job_config.job.dump_folder, LOSS_LOG)
        self.run_log = RunLog(path=log_path)
        self.memory_compared = False
        self.clock = StepClock(job_config.training.steps)
        self.metrics_processor.log = functools.partial(self.log_step, self.metrics_processor.log)
        self.grad_norm: float | None = None
        titan_dist_utils.clip_grad_norm_ = self.clip_grad_norm_
        self.step_losses: list[torch.Tensor] = []
        self.fault = Fault.from_env(dist.get_rank(), dist.get_world_size())
        if job_config.validation.enable:  # held-out results go to losses.jsonl and the summary
            self.validator.on_result = lambda step, result, seconds: self.run_log.record_validation(
                step, result.loss, result.tokens, seconds
            )

    def graphed_microbatch(self) -> GraphedCall | None:
        """The CUDA-graphed micro-batch (`runtime.cuda_graphs`), or None off CUDA."""
        if self.device.type != "cuda":
            logger.info("CUDA graphs: off (no CUDA device; --boost.cuda_graphs does nothing here)")
            return None
        # every micro-batch the same work; gradients zeroed in place (fixed addresses)
        self.accumulation = Accumulation(keep_weights=False, defer_reduction=False)
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

    def forward_backward_step(
        self,
        *,
        input_dict: dict[str, torch.Tensor],
        labels: torch.Tensor,
        global_valid_tokens: torch.Tensor,
    ) -> torch.Tensor:
        if self.pp_loss is None:
            self.accumulation.before_microbatch(
                self.fsdp_modules, self.microbatch, self.gradient_accumulation_steps
            )
            if self.copies is not None:
                self.copies.before_microbatch(self.microbatch, self.gradient_accumulation_steps)
            self.microbatch += 1
            # a device tensor (TorchTitan passes a float under DP): CUDA graphs copy it in
            tokens = torch.as_tensor(global_valid_tokens, dtype=torch.float32, device=self.device)
            if self.graphed is not None and self.step > 1:
                if set(input_dict) != {"input"}:
                    raise ConfigError(
                        f"CUDA graphs take the token input only, got {sorted(input_dict)}; "
                        "train without --boost.cuda_graphs"
                    )
                loss = self.graphed(labels, tokens, input_dict["input"])
            else:
                loss = super().forward_backward_step(
                    input_dict=input_dict, labels=labels, global_valid_tokens=tokens
                )
        else:
            self.pp_loss.denominator = global_valid_tokens
            try:
                loss = super().forward_backward_step(
                    input_dict=input_dict, labels=labels, global_valid_tokens=global_valid_tokens
                )
            finally:
                self.pp_loss.denominator = 1.0
            if self.pp_has_last_stage:
                # The parent divides the microbatch losses by the token count once more.
                loss = loss * global_valid_tokens
        if self.copies is not None and self.microbatch == self.gradient_accumulation_steps:
            self.copies.end_step()  # the masters' gradients are complete
        detached = loss.detach()
        # Under loss parallel the loss is a replicated DTensor.
        detached = detached.full_tensor() if isinstance(detached, DTensor) else detached
        if self.fault is not None:
            detached = self.fault.poison_loss(self.step, detached)
        self.step_losses.append(detached)
        return loss

    def clip_grad_norm_(self, parameters, max_norm, **kwargs) -> torch.Tensor:
        """TorchTitan's clipping (through `torchtitan.distributed.utils`, whose function
        `train_step` calls), with the exact fp64 norm of `runtime.grad_norm` unless
        `[boost] exact_grad_norm` is off; the norm is kept for the run log."""
        clip = clip_grad_norm_exact_ if self.job_config.boost.exact_grad_norm else TITAN_CLIP
        parameters = list(parameters)
        if self.fault is not None:
            grads = [_local(p.grad) for p in parameters if p.grad is not None]
            self.fault.poison_grads(self.step, grads)
        norm = clip(parameters, max_norm, **kwargs)
        self.grad_norm = norm.item()
        self.agree_on_step()
        what = nonfinite(self.step_loss, self.grad_norm)
        if what is not None:  # before train_step reaches the optimizer
            raise NonFiniteStep(what)
        return norm

    def agree_on_step(self) -> None:
        """One all-reduce: the step's global loss and every rank's stop flags."""
        local = torch.stack(self.step_losses).sum() if self.owns_loss else torch.zeros(())
        values = [local.to(device=self.device, dtype=torch.float64).reshape(1)]
        values.append(torch.tensor(self.stop.flags(), dtype=torch.float64, device=self.device))
        summed = torch.cat(values)
        dist.all_reduce(summed)
        loss, *flags = summed.tolist()
        self.step_loss = loss
        self.stop_reason = self.stop_reason or self.stop.reason(flags)

    def log_step(self, titan_log: Callable[..., None], step: int, *args, **kwargs) -> None:
        """TorchTitan's step line with the clock's ETA and data wait appended; after the
        first one, rank 0's measured peak memory against the prediction."""
        measured = None if self.memory_compared else self.peak_memory()  # before its reset
        with appended(logger, self.clock.tail(step)):
            titan_log(step, *args, **kwargs)
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
        predicted, covers = self.memory_model(self.priced, world, self.model_args.vocab_size)
        if predicted is None:
            return f"{head}; {covers}"
        change = 100 * (measured - predicted) / predicted
        return f"{head} vs {predicted / 2**30:.3f} GiB predicted ({change:+.1f}%; {covers})"

    def train_step(self, data_iterator: Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]):
        self.clock.start()
        data_iterator = self.clock.waiting(data_iterator)
        self.run_log.start()
        self.microbatch = 0
        # an eager forward since the last step (validation) may have left weights unsharded
        for module in self.fsdp_modules:
            module.reshard()
        if self.copies is not None:  # a step that raised mid-way left the copies in place
            self.copies.end_step()
        self.step_losses = []
        self.grad_norm = None
        tokens_before = self.ntokens_seen
        try:
            if self.run_log.saved_activations is None:
                counter = self.activation_counter()
                with counter.watching():
                    super().train_step(data_iterator)
                self.run_log.saved_activations = (self.step, counter.peak)
                if dist.get_rank() == 0:
                    logger.info(self.run_log.activations_line())
            else:
                super().train_step(data_iterator)
        except NonFiniteStep as e:
            self.skip_or_stop(e.what)
            return
        tokens = (self.ntokens_seen - tokens_before) * self.dp_degree
        self.run_log.record(self.step, self.step_loss, tokens, self.grad_norm)
        if self.fault is not None:
            self.fault.after_step(self.step)

    def skip_or_stop(self, what: str) -> None:
        """A non-finite step (collective): skip it within the limit, else raise
        `TrainingDiverged`; either way the optimizer has not run."""
        local = torch.stack(self.step_losses).sum().item() if self.owns_loss else None
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

    def should_continue_training(self) -> bool:
        """False once the ranks agreed to stop early, after saving the step they finished."""
        if self.stop_reason is None:
            return super().should_continue_training()
        if self.stopped is None and super().should_continue_training():
            self.stopped = (self.step, self.save_stop_checkpoint())
        return False

    def save_stop_checkpoint(self) -> str | None:
        """A complete checkpoint of this step, written now (collective), or None without
        checkpointing. The loop's own save of this step, if any, is only waited for."""
        ckpt = self.checkpointer
        if not ckpt.enable or ckpt.load_only:
            return None
        saved_by_loop = ckpt._should_save(self.step, self.step == self.job_config.training.steps)
        ckpt._async_wait()
        path = ckpt._create_checkpoint_id(self.step)
        if not saved_by_loop:
            logger.info(f"Saving the checkpoint of step {self.step} before stopping.")
            states = ckpt._flattened_model_states_sd()
            ckpt.dcp_save(states, path, AsyncMode.DISABLED, enable_garbage_collection=True)
            ckpt._purge_stale_checkpoints()
        return path

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

    def train(self):
        if self.checkpointer.enable:
            prepare_to_load(self.checkpointer, self.job_config.checkpoint.load_step)
            if dist.get_rank() == 0:
                self.log_resume_state()
        try:
            super().train()
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

    def close(self) -> None:
        """The orderly end of every rank; TorchTitan's `main` calls it after training and
        after an error: the checkpointer's pending write, its threads, then the process
        groups (`parallelize.teardown`: ranks meet only after a finished run)."""
        ckpt = getattr(self, "checkpointer", None)
        try:
            if ckpt is not None and ckpt.enable:
                ckpt._async_wait()  # an async save still writing
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
        current = self.checkpointer._create_checkpoint_id(self.step)
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
