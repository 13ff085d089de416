"""Held-out loss: one evaluation loop shared by training's validator and `boost_titan.eval`.

`evaluate` runs batches through a per-batch loss function, sums the loss and the scored
tokens in float64 on the ranks that own the loss (the last PP stage, TP rank 0 of each
replica) and all-reduces both once over the world, so every rank gets the global
token-weighted mean.

`BoostValidator` is the TrainSpec's `build_validator_fn` (a TorchTitan
`BaseValidator`), built by TorchTitan's Trainer when `[validation] enable` is set. Where
TorchTitan's `Validator` would not fit our runs it differs:
- the data are fixed `ValidationBatches` (`boost_titan.data.held_out`): every validation
  scores the same windows (TorchTitan's dataset continues where the previous validation
  stopped, and with `steps = -1` has nothing left for the second), every DP rank runs the
  same number of batches (no hang), and the default corpus's held-out split replaces the
  C4 download;
- the loss is the token-weighted mean over the whole set, reported on every rank (under PP
  TorchTitan logs -1 on all but the last stage);
- it validates every `freq` steps and at the last step, so the run summary carries the
  final value (not at step 1: an untrained model scores about ln(vocab));
- the console line, TensorBoard (`validation_metrics/*`) and `on_result` (the trainer's run
  log) get loss, perplexity, tokens and seconds; the time spent is taken out of the next
  training log line's throughput.
Model parts are put in eval mode and back. The PP path calls the schedule's `eval` as
TorchTitan does; under context parallelism each CP rank scores its shard of every sequence
(sharded as the trainer shards training batches).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining.schedules import _PipelineSchedule
from torch.distributed.tensor import DTensor
from torchtitan.components.loss import IGNORE_INDEX, LossFunction
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.components.validate import BaseValidator
from torchtitan.distributed import ParallelDims
from torchtitan.distributed.context_parallel import prepare_context_parallel_input
from torchtitan.tools.logging import logger

from boost_titan.data.held_out import (
    Batch,
    ValidationBatches,
    build_validation_batches,
    validation_data,
)
from boost_titan.runtime.loss_owner import owns_loss
from boost_titan.runtime.run_log import perplexity

BatchLoss = Callable[[dict[str, torch.Tensor], torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""(input dict, labels) -> (summed loss, scored tokens) of one batch on this rank."""


@dataclass(frozen=True)
class HeldOutLoss:
    """Summed cross-entropy and scored tokens over a whole validation set."""

    loss_sum: float
    tokens: int

    @property
    def loss(self) -> float:
        return self.loss_sum / self.tokens if self.tokens else math.nan

    @property
    def perplexity(self) -> float:
        return perplexity(self.loss)


def plain(tensor: torch.Tensor) -> torch.Tensor:
    """A loss as a local tensor (under loss parallel it is a replicated DTensor)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


@torch.no_grad()
def evaluate(
    batches: Iterable[Batch], batch_loss: BatchLoss, owner: bool, device: torch.device | str
) -> HeldOutLoss:
    """Sum `batch_loss` over `batches` where `owner`, then all-reduce over the world."""
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    for input_dict, labels in batches:
        input_dict = {key: value.to(device) for key, value in input_dict.items()}
        loss_sum, tokens = batch_loss(input_dict, labels.to(device))
        if owner:
            totals[0] += plain(loss_sum.detach()).to(device=device, dtype=torch.float64)
            totals[1] += tokens.to(device)
    if dist.is_initialized():
        dist.all_reduce(totals)
    return HeldOutLoss(totals[0].item(), round(totals[1].item()))


class BoostValidator(BaseValidator):
    """Validation during training on a fixed held-out set (see the module docstring)."""

    def __init__(
        self,
        job_config,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: BaseTokenizer,
        parallel_dims: ParallelDims,
        loss_fn: LossFunction,
        validation_context: Callable[[], AbstractContextManager[None]],
        maybe_enable_amp: AbstractContextManager[None],
        metrics_processor: MetricsProcessor | None = None,
        pp_schedule: _PipelineSchedule | None = None,
        pp_has_first_stage: bool | None = None,
        pp_has_last_stage: bool | None = None,
    ) -> None:
        super().__init__(job_config)
        self.parallel_dims = parallel_dims
        self.loss_fn = loss_fn
        self.validation_context = validation_context
        self.maybe_enable_amp = maybe_enable_amp
        self.metrics_processor = metrics_processor
        self.pp_schedule = pp_schedule
        self.pp_has_first_stage = pp_has_first_stage
        self.pp_has_last_stage = pp_has_last_stage
        self.owner = owns_loss(parallel_dims, pp_has_last_stage)
        self.on_result: Callable[[int, HeldOutLoss, float], None] | None = None
        """Called on every rank with (step, result, seconds) after each validation."""

        data = validation_data(job_config)
        self.batches: ValidationBatches | None = None
        if data is None:
            logger.warning(
                "validation is off for this run: it trains on training.dataset_path and "
                "validation.dataset_path names no held-out documents; pass "
                "--validation.dataset_path to validate"
            )
            return
        validation = job_config.validation
        self.batches = build_validation_batches(
            data,
            tokenizer,
            validation.seq_len,
            validation.local_batch_size,
            validation.steps,
            dp_rank=dp_rank,
            dp_degree=dp_world_size,
        )
        logger.info(
            f"Validation on {data.describe()}: {self.batches.tokens:,} tokens in "
            f"{len(self.batches)} batches of {validation.local_batch_size} x {validation.seq_len} "
            f"per data-parallel rank, every {validation.freq} steps and at the last step"
        )

    def should_validate(self, step: int) -> bool:
        every = self.job_config.validation.freq
        return self.batches is not None and (
            step % every == 0 or step == self.job_config.training.steps
        )

    def batch_loss(
        self,
        model_parts: list[nn.Module],
        input_dict: dict[str, torch.Tensor],
        labels: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed loss (zero off the last PP stage) and scored tokens of one batch."""
        inputs = input_dict["input"]
        kwargs: dict[str, Any] = {}
        if self.parallel_dims.cp_enabled:  # each CP rank scores its shard of the sequences
            inputs, labels, kwargs = prepare_context_parallel_input(
                inputs,
                labels,
                kwargs,
                self.parallel_dims.get_mesh("cp"),
                labels.device,
                self.job_config.parallelism.context_parallel_load_balancer,
            )
        tokens = (labels != IGNORE_INDEX).sum()
        if not self.parallel_dims.pp_enabled:
            with self.validation_context(), self.maybe_enable_amp:
                return self.loss_fn(model_parts[0](inputs, **kwargs), labels), tokens
        assert self.pp_schedule is not None
        targets, losses = (labels, []) if self.pp_has_last_stage else (None, None)
        with self.validation_context():
            if self.pp_has_first_stage:
                self.pp_schedule.eval(inputs, target=targets, losses=losses)
            else:
                self.pp_schedule.eval(target=targets, losses=losses)
        if not self.pp_has_last_stage:
            return torch.zeros((), device=labels.device), tokens
        # the microbatch losses are sums (the trainer's PP loss divides only while training)
        return torch.stack([plain(loss) for loss in losses]).sum().to(labels.device), tokens

    @torch.no_grad()
    def validate(self, model_parts: list[nn.Module], step: int) -> None:
        assert self.batches is not None
        start = time.perf_counter()
        for model in model_parts:
            model.eval()
        try:
            device = next(model_parts[0].parameters()).device
            result = evaluate(
                self.batches,
                lambda input_dict, labels: self.batch_loss(model_parts, input_dict, labels),
                self.owner,
                device,
            )
        finally:
            for model in model_parts:
                model.train()
        seconds = time.perf_counter() - start
        self.report(step, result, seconds)
        if self.on_result is not None:
            self.on_result(step, result, seconds)

    def report(self, step: int, result: HeldOutLoss, seconds: float) -> None:
        """Console line and TensorBoard scalars; keep validation time out of training's tps."""
        metrics: dict[str, Any] = {
            "validation_metrics/loss": result.loss,
            "validation_metrics/perplexity": result.perplexity,
            "validation_metrics/tokens": result.tokens,
            "validation_metrics/seconds": seconds,
        }
        processor = self.metrics_processor
        color = processor.color if processor is not None else None
        if processor is not None:
            processor.logger.log(metrics, step)
            processor.time_last_log += seconds
        yellow, green, blue, reset = (
            (color.yellow, color.green, color.blue, color.reset) if color else ("",) * 4
        )
        logger.info(
            f"{yellow}validate step: {step:2}  {green}loss: {result.loss:8.5f}  "
            f"perplexity: {result.perplexity:,.2f}  {blue}tokens: {result.tokens:,}  "
            f"time: {seconds:.1f}s{reset}"
        )
