"""`BoostTrainer`: TorchTitan's Trainer with a PP gradient-scale fix, a run summary and a NaN stop.

- Pipeline parallelism: TorchTitan 0.2.2 backpropagates the *summed* per-microbatch loss
  under PP while every other layout divides it by the step's global valid-token count, so
  PP gradients come out batch*seq times too large (clipping and AdamW hide most of it).
  Here the PP schedule's loss function divides by that count during training steps.
- Every step the global average loss is all-reduced (one scalar over the world group); a
  NaN/inf loss raises `TrainingDiverged` before the step could be checkpointed.
- Rank 0 appends each step's global loss (and each validation's held-out loss,
  `boost_titan.runtime.validator`) to `<dump_folder>/losses.jsonl` and, at the end, logs
  steps run, tokens/s, first/last loss, the last validation and where outputs went.
- The first step run measures the activations its forwards keep for backward (peak, on
  each rank; `PeakSavedActivations`); rank 0 logs them after that step and in the summary.
- Crash recovery (`boost_titan.runtime.restarts`): before loading, rank 0 logs a torchrun
  restart and any interrupted (incomplete) checkpoint that is skipped; `BOOST_TITAN_FAULT_*`
  injects a SIGKILL for testing.
- Every rank loads the checkpoint rank 0 picks (`boost_titan.runtime.resume`).
- Gradient clipping uses the exact fp64 global norm (`runtime.grad_norm`), the same in every
  layout; `losses.jsonl` rows carry it as `grad_norm`. TorchTitan's `train_step` finds
  its clipping function through `torchtitan.distributed.utils`, which this trainer points
  at its own `clip_grad_norm_` (`[boost] exact_grad_norm = false`: TorchTitan's norm).
- Precision (`runtime.precision`): one of the first log lines states it ("Precision: bf16
  compute, fp32 master weights and gradient reductions" or "Precision: fp32"). TorchTitan's
  `maybe_enable_amp` (autocast on one device and under DDP; fp32 and a warning for TP or PP
  without FSDP) is replaced by `no_autocast` before `Trainer.__init__` calls it: FSDP2's
  mixed-precision policy does every cast, on every layout (`boost_llama.data_parallel`).
- On CPU the NCCL-only settings stay quiet: the flight recorder is off (it would only leave
  an empty `comm_traces/`), and torchrun's TORCH_NCCL_ASYNC_ERROR_HANDLING is dropped
  (TorchTitan warns that it overrides it).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torchtitan.distributed.utils as titan_dist_utils
from torch.distributed.tensor import DTensor
from torchtitan.tools.logging import logger
from torchtitan.train import Trainer

from boost_titan.runtime.checkpoint_files import latest_checkpoint
from boost_titan.runtime.device import on_cpu
from boost_titan.runtime.grad_norm import clip_grad_norm_exact_
from boost_titan.runtime.precision import Precision, no_autocast
from boost_titan.runtime.restarts import Fault, incomplete_checkpoints
from boost_titan.runtime.resume import agree_on_checkpoint
from boost_titan.runtime.run_log import RunLog
from boost_titan.runtime.saved_activations import PeakSavedActivations
from boost_titan.runtime.validator import owns_loss

TITAN_CLIP = titan_dist_utils.clip_grad_norm_
"""TorchTitan's own clipping, kept before the trainer points `train_step` at its own."""

LOSS_LOG = "losses.jsonl"
"""Per-step global loss and tokens, appended by rank 0 under the dump folder."""


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the message says at which step and what was kept."""


class TokenScaledLoss:
    """A loss function divided by `denominator` (1 outside training steps, e.g. validation)."""

    def __init__(self, loss_fn: Callable[..., torch.Tensor]):
        self.loss_fn = loss_fn
        self.denominator: torch.Tensor | float = 1.0

    def __call__(self, pred: torch.Tensor, labels: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.loss_fn(pred, labels, **kwargs) / self.denominator


class BoostTrainer(Trainer):
    """TorchTitan's Trainer plus the fixes and reporting described in the module docstring."""

    def __init__(self, job_config):
        titan_dist_utils.maybe_enable_amp = no_autocast  # Trainer.__init__ calls it
        super().__init__(job_config)
        dims = self.parallel_dims
        self.pp_loss: TokenScaledLoss | None = None
        if dims.pp_enabled:
            # The schedule keeps its own reference to the loss (`_loss_fn`) and reads it lazily.
            self.pp_loss = TokenScaledLoss(self.pp_schedule._loss_fn)
            self.pp_schedule._loss_fn = self.pp_loss
        # The loss lives on the last PP stage and is replicated over TP: count it once.
        self.owns_loss = owns_loss(dims, dims.pp_enabled and self.pp_has_last_stage)
        self.dp_degree = dims.dp_replicate * dims.dp_shard
        log_path = None
        if dist.get_rank() == 0:
            os.makedirs(job_config.job.dump_folder, exist_ok=True)
            log_path = os.path.join(job_config.job.dump_folder, LOSS_LOG)
        self.run_log = RunLog(path=log_path)
        self.grad_norm: float | None = None
        titan_dist_utils.clip_grad_norm_ = self.clip_grad_norm_
        self.step_losses: list[torch.Tensor] = []
        self.fault = Fault.from_env(dist.get_rank(), dist.get_world_size())
        if job_config.validation.enable:  # held-out results go to losses.jsonl and the summary
            self.validator.on_result = lambda step, result, seconds: self.run_log.record_validation(
                step, result.loss, result.tokens, seconds
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
            loss = super().forward_backward_step(
                input_dict=input_dict, labels=labels, global_valid_tokens=global_valid_tokens
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
        detached = loss.detach()
        # Under loss parallel the loss is a replicated DTensor.
        self.step_losses.append(
            detached.full_tensor() if isinstance(detached, DTensor) else detached
        )
        return loss

    def clip_grad_norm_(self, parameters, max_norm, **kwargs) -> torch.Tensor:
        """TorchTitan's clipping (through `torchtitan.distributed.utils`, whose function
        `train_step` calls), with the exact fp64 norm of `runtime.grad_norm` unless
        `[boost] exact_grad_norm` is off; the norm is kept for the run log."""
        clip = clip_grad_norm_exact_ if self.job_config.boost.exact_grad_norm else TITAN_CLIP
        norm = clip(parameters, max_norm, **kwargs)
        self.grad_norm = norm.item()
        return norm

    def train_step(self, data_iterator: Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]):
        self.run_log.start()
        self.step_losses = []
        self.grad_norm = None
        tokens_before = self.ntokens_seen
        if self.run_log.saved_activations is None:
            counter = self.activation_counter()
            with counter.watching():
                super().train_step(data_iterator)
            self.run_log.saved_activations = (self.step, counter.peak)
            if dist.get_rank() == 0:
                logger.info(self.run_log.activations_line())
        else:
            super().train_step(data_iterator)
        loss = self.global_step_loss()
        if not math.isfinite(loss):
            kept = latest_checkpoint(self.checkpointer.folder) if self.checkpointer.enable else None
            resume = (
                f"rerun to resume from {kept}" if kept else "rerun (no checkpoint was saved yet)"
            )
            raise TrainingDiverged(
                f"loss became {loss} at step {self.step}; stopped without checkpointing it; "
                f"lower --optimizer.lr or raise --lr_scheduler.warmup_steps, then {resume}"
            )
        self.run_log.record(
            self.step, loss, (self.ntokens_seen - tokens_before) * self.dp_degree, self.grad_norm
        )
        if self.fault is not None:
            self.fault.after_step(self.step)

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

    def global_step_loss(self) -> float:
        """The step's global average loss, known to every rank (one scalar all-reduce)."""
        local = torch.stack(self.step_losses).sum() if self.owns_loss else torch.zeros(())
        total = local.to(device=self.device, dtype=torch.float64).reshape(1)
        dist.all_reduce(total)
        return total.item()

    def train(self):
        if self.checkpointer.enable:
            agree_on_checkpoint(self.checkpointer, self.job_config.checkpoint.load_step)
            if dist.get_rank() == 0:
                self.log_resume_state()
        super().train()
        if dist.get_rank() == 0:
            logger.info(f"Summary: {self.run_log.summary(self.step)}")
            logger.info(f"Outputs: {self.output_locations()}")

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
