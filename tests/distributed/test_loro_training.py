"""LORO trained by `boost_titan.train` (arch svd, `--boost.loro_exact_every 2`): 3 steps at
TP 2 with a checkpoint after each (steps 2 is exact, 1 and 3 approximate); then its
step-1 checkpoint, taken right before the exact step, resumed at TP 1. Two launches.

- The resumed run's steps 2 and 3 log the uninterrupted run's losses and gradient norms:
  the optimizer state (moments, the exact-step counter) is resharded from TP 2 to TP 1,
  and step 2 is exact again (a counter restarted at 0 would make it approximate, and
  step 3 would differ).
- The step-2 checkpoint, saved right after an exact step, holds balanced factors: per
  pair B^T B = A A^T, diagonal (the singular values of B A), to fp32 rounding.

`tests/unit/test_loro_wiring.py`: the builder's pairs and settings; test_bad_inputs: the
refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from boost_titan.job.launch import launch_training
from boost_titan.runtime.run_log import read_log
from tests.helpers import DEBUG_TOML
from tests.helpers.checkpoints import checkpoint_weights

LOSS_TOLERANCE, GRAD_NORM_TOLERANCE = 1e-5, 1e-6
"""The layouts' tolerances (tests/distributed/test_training_parity.py), fp32."""
BALANCE_TOLERANCE = 1e-5
"""|B^T B - A A^T| and the off-diagonal of each, relative to the largest singular value."""
ARGS = [
    *("--boost.arch", "svd", "--optimizer.name", "LORO", "--boost.loro_exact_every", "2"),
    *("--training.steps", "3", "--training.seq_len", "32", "--training.local_batch_size", "2"),
    *("--lr_scheduler.warmup_steps", "1", "--validation.no_enable", "--debug.seed", "7"),
    *("--checkpoint.enable", "--checkpoint.interval", "1", "--checkpoint.keep_latest_k", "0"),
    *("--metrics.log_freq", "1", "--metrics.no_enable_tensorboard"),
]
TP = "--parallelism.tensor_parallel_degree"


def _rows(dump: Path) -> dict[int, dict]:
    return {row["step"]: row for row in read_log(str(dump / "losses.jsonl"))[0]}


@pytest.fixture(scope="module")
def loro_runs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("loro")
    full, resumed = root / "tp2", root / "tp1-resumed"
    launch_training(2, DEBUG_TOML, full, [*ARGS, TP, "2"], timeout=600)
    shutil.copytree(full / "checkpoint" / "step-1", resumed / "checkpoint" / "step-1")
    launch_training(1, DEBUG_TOML, resumed, [*ARGS, TP, "1"], timeout=600)
    return full, resumed


def test_resume_before_an_exact_step_at_another_tp_degree(loro_runs):
    full, resumed = map(_rows, loro_runs)
    assert sorted(full) == [1, 2, 3] and sorted(resumed) == [2, 3]
    for step in (2, 3):
        assert abs(resumed[step]["loss"] - full[step]["loss"]) <= LOSS_TOLERANCE, step
        norm = full[step]["grad_norm"]
        assert abs(resumed[step]["grad_norm"] - norm) <= GRAD_NORM_TOLERANCE * norm, step


def test_factors_after_an_exact_step_are_balanced(loro_runs, tmp_path):
    weights = checkpoint_weights(loro_runs[0] / "checkpoint" / "step-2", tmp_path)
    ups = sorted(k for k in weights if k.endswith(".up.weight"))
    assert len(ups) == 4 * 7  # every projection of the debug flavor's 4 blocks
    for key in ups:
        b = weights[key].double()
        a = weights[key.removesuffix("up.weight") + "down.weight"].double()
        gram_b, gram_a = b.T @ b, a @ a.T
        scale = gram_b.diagonal().max()
        off = gram_b - torch.diag(gram_b.diagonal())
        assert (gram_b - gram_a).abs().max() <= BALANCE_TOLERANCE * scale, key
        assert off.abs().max() <= BALANCE_TOLERANCE * scale, key
