"""`./run_train.sh --boost.arch X`: an arch trains a few steps on 2 processes and validates
on the held-out split (debug.toml). Run for fullrank, the one arch no other launch trains
(Megatron TP); cola is test_cli's smoke run, lax trains in test_training_parity.py, and svd
is CoLA's code without the activation (its TP numerics: test_tp_equivalence.py)."""

from __future__ import annotations

import os
import subprocess

import pytest

from boost_titan.runtime.run_log import read_log
from tests.helpers import ROOT

STEPS = 4


@pytest.mark.parametrize("arch", ["fullrank"])
def test_run_train_each_arch(arch, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("NGPU", "WORLD_SIZE", "CONFIG_FILE")}
    env.update(NGPU="2", OMP_NUM_THREADS="1")
    dump = tmp_path / arch
    result = subprocess.run(
        [
            "./run_train.sh",
            "--boost.arch",
            arch,
            "--job.dump_folder",
            str(dump),
            "--training.steps",
            str(STEPS),
            "--training.seq_len",
            "64",
            "--lr_scheduler.warmup_steps",
            "1",
            "--metrics.log_freq",
            "1",
            "--metrics.no_enable_tensorboard",
            "--checkpoint.interval",
            str(STEPS),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    rows, validations = read_log(str(dump / "losses.jsonl"))
    losses = [row["loss"] for row in rows]
    assert len(losses) == STEPS
    assert losses[-1] < losses[0], losses
    strategy = "megatron" if arch == "fullrank" else "btp"
    assert f"Summary: ran {STEPS} steps" in output
    # debug.toml validates at the last step; the summary carries it
    [validation] = validations
    assert validation["step"] == STEPS and validation["validation_tokens"] == 4 * 8 * 256
    assert f"validation loss {validation['validation_loss']:.4f} (step {STEPS})" in output
    assert f"Applied {strategy} tensor parallelism (TP=2" in output, output[-3000:]
