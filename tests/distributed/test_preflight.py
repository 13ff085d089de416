"""Preflight with processes: a worker started on a held dump folder, ranks that agree on the
checkpoint (gloo), and `run_train.sh` ending on a worker's error or skipping a finished job
(`tests/unit/test_preflight.py`: what `boost_titan.check` refuses in this process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import torch

from boost_titan.config.errors import ConfigError
from boost_titan.runtime.dump_lock import LOCK_FILE
from tests.helpers import DEBUG_TOML, ROOT
from tests.helpers.checkpoints import save_model_checkpoint
from tests.helpers.commands import assert_one_error, clean_env, hold_lock
from tests.helpers.distributed import run_on_ranks


def test_worker_refuses_a_held_dump_folder(tmp_path):
    """A worker started by hand (no check) on a held folder: one line, exit 2, and it wrote
    nothing there."""
    dump = tmp_path / "dump"
    holder = hold_lock(dump)
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "boost_titan.train",
                "--job.config_file",
                str(DEBUG_TOML),
                "--job.dump_folder",
                str(dump),
            ],
            cwd=ROOT,
            env=clean_env() | {"RANK": "0"},
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert_one_error(result, f"in use by another job (pid {holder.pid} on ")
    assert result.returncode == 2
    assert os.listdir(dump) == [LOCK_FILE]


# ---- ranks agree on the checkpoint ----------------------------------------------------------
def _load_with_own_view(rank: int, world_size: int, root: str) -> dict[str, object]:
    """Each rank resumes from its own copy of the dump folder (`root/<scenario>/rank<r>`), as
    if the ranks saw one folder differently; returns the loaded weight or the error."""
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.config import Checkpoint

    from boost_titan.runtime.resume import agree_on_checkpoint

    model = torch.nn.Module()  # loads one tensor of the debug-model checkpoints: norm.weight
    model.norm = torch.nn.RMSNorm(256)
    results: dict[str, object] = {}
    for scenario in ("rank1-sees-newer", "rank1-misses-newest"):
        config = Checkpoint(
            enable=True,
            keep_latest_k=0,
            exclude_from_loading=["optimizer", "lr_scheduler", "dataloader"],
        )
        manager = CheckpointManager(
            dataloader=None,
            model_parts=[model],
            optimizers=None,
            lr_schedulers=None,
            states={},
            checkpoint_config=config,
            sd_adapter=None,
            base_folder=os.path.join(root, scenario, f"rank{rank}"),
        )
        try:
            agree_on_checkpoint(manager, load_step=-1)
            manager.load()
            results[scenario] = model.norm.weight[0].item()
        except ConfigError as e:
            results[scenario] = str(e)
    return results


def test_ranks_load_the_checkpoint_rank0_picks(tmp_path):
    """Rank 1 sees a newer step-9 (another job wrote it): both ranks load rank 0's step-6.
    Rank 1 misses rank 0's newest step-9: both ranks stop with the same one-line error."""
    steps = {
        ("rank1-sees-newer", 0): (3, 6),
        ("rank1-sees-newer", 1): (3, 6, 9),
        ("rank1-misses-newest", 0): (3, 6, 9),
        ("rank1-misses-newest", 1): (3, 6),
    }
    for (scenario, rank), saved in steps.items():
        for step in saved:
            folder = tmp_path / scenario / f"rank{rank}" / "checkpoint" / f"step-{step}"
            save_model_checkpoint(folder, step)
    results = run_on_ranks(_load_with_own_view, 2, root=str(tmp_path))
    assert [r["rank1-sees-newer"] for r in results] == [6.0, 6.0]
    errors = [r["rank1-misses-newest"] for r in results]
    assert errors[0] == errors[1] and "\n" not in errors[0], errors
    assert errors[0].startswith(
        f"rank 1 does not see a complete {tmp_path}/rank1-misses-newest/rank1/checkpoint/step-9 "
        f"(rank 0 resumes from {tmp_path}/rank1-misses-newest/rank0/checkpoint/step-9)"
    ), errors[0]


# ---- run_train.sh: a worker's error ends the output ------------------------------------------
def test_run_train_ends_on_a_worker_error(tmp_path):
    """A text file whose damage lies past check's sample: check passes, the workers' loader
    fails, and run_train.sh ends with their one-line error, exit 2, no torchrun report."""
    data = tmp_path / "data"
    data.mkdir()
    good = ("def f(x):\n    return x + 1\n\n" * 100_000).encode()[: 2 << 20]
    (data / "corpus.txt").write_bytes(good + b"\x8f\xff" * 64)
    env = clean_env() | {"NGPU": "2", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            "./run_train.sh",
            "--job.dump_folder",
            str(tmp_path / "dump"),
            "--training.dataset_path",
            str(data),
            "--training.steps",
            "1",
            "--training.seq_len",
            "32",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    lines = output.strip().splitlines()
    assert result.returncode == 2, output[-3000:]
    assert lines[0].startswith("config ok"), output[-3000:]
    assert lines[-1].startswith(f"error: cannot read the text files under {data} ("), output[-3000:]
    assert "Traceback" not in output and "ChildFailedError" not in output
    assert not (tmp_path / "dump" / "checkpoint").exists()


def test_run_train_skips_a_finished_job(tmp_path):
    """run_train.sh on a dump folder at training.steps: check's line, exit 0, no worker."""
    save_model_checkpoint(tmp_path / "dump" / "checkpoint" / "step-3")
    result = subprocess.run(
        ["./run_train.sh", "--job.dump_folder", str(tmp_path / "dump"), "--training.steps", "3"],
        cwd=ROOT,
        env=clean_env() | {"NGPU": "2"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("nothing to train: already at step 3"), result.stdout
    assert "[rank" not in result.stdout + result.stderr
