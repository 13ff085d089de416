"""Preflight with processes: a worker started on a held dump folder, ranks that agree on the
checkpoint and refuse one with a payload (gloo), and `run_train.sh` ending on a worker's
error or skipping a finished job (`tests/unit/test_preflight.py`: what `boost_titan.check`
refuses in this process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import torch

from boost_titan.config.errors import ConfigError
from boost_titan.runtime.dump_lock import LOCK_FILE
from tests.helpers import DEBUG_TOML, ROOT
from tests.helpers.checkpoints import plant_byte_item, plant_metadata, save_model_checkpoint
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
            env=clean_env() | {"RANK": "0", "WORLD_SIZE": "2"},  # rank 0 of a 2-process job
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


# ---- ranks agree on the checkpoint, and read it safely -----------------------------------------
class _TrainState:
    """A step counter saved as TorchTitan's train state (a byte item)."""

    def state_dict(self) -> dict:
        return {"step": 0, "ntokens_seen": 0}

    def load_state_dict(self, state: dict) -> None:
        pass


def _manager(root: str, scenario: str, rank: int, model: torch.nn.Module, **config):
    """TorchTitan's CheckpointManager of `model` whose dump folder is
    `root/<scenario>/rank<r>` (each rank its own copy); a `planted` scenario's also loads
    the train state."""
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.config import Checkpoint

    checkpoint = Checkpoint(
        enable=True,
        keep_latest_k=0,
        exclude_from_loading=["optimizer", "lr_scheduler", "dataloader"],
        **config,
    )
    return CheckpointManager(
        dataloader=None,
        model_parts=[model],
        optimizers=None,
        lr_schedulers=None,
        states={"train_state": _TrainState()} if scenario.startswith("planted") else {},
        checkpoint_config=checkpoint,
        sd_adapter=None,
        base_folder=os.path.join(root, scenario, f"rank{rank}"),
    )


def _load_on_ranks(rank: int, world_size: int, root: str) -> dict[str, object]:
    """Each rank resumes from its own copy of the dump folder (`root/<scenario>/rank<r>`), as
    if the ranks saw one folder differently; then, as BoostTrainer does, from a checkpoint
    with a payload (resumed, or the initial one): the check before the load, then DCP's load
    itself through the allowlist. Returns the loaded weight or the error of each."""
    from boost_titan.checkpoint.agree import agree_on_checkpoint
    from boost_titan.runtime.resume import Resume, load_checkpoint, prepare_to_load

    model = torch.nn.Module()  # loads one tensor of the debug-model checkpoints: norm.weight
    model.norm = torch.nn.RMSNorm(256)
    results: dict[str, object] = {}
    for scenario in ("rank1-sees-newer", "rank1-misses-newest"):
        manager = _manager(root, scenario, rank, model)
        try:
            load_checkpoint(manager, prepare_to_load(manager, load_step=-1))
            results[scenario] = model.norm.weight[0].item()
        except ConfigError as e:
            results[scenario] = str(e)
    for scenario in ("planted-resume", "planted-initial"):
        initial = os.path.join(root, scenario, "seed")
        config = {} if scenario == "planted-resume" else {"initial_load_path": initial}
        manager = _manager(root, scenario, rank, model, **config)
        try:
            prepare_to_load(manager, load_step=-1)  # as BoostTrainer.train, before the load
        except ConfigError as e:
            results[scenario] = str(e)
        unchecked = Resume(agree_on_checkpoint(manager, load_step=-1), metadata=None)
        try:
            load_checkpoint(manager, unchecked)  # DCP's reads alone, without the check first
        except ConfigError as e:  # DCP's CheckpointException, with our refusal inside
            results[f"{scenario}, load"] = str(e)
    return results


def test_ranks_load_the_checkpoint_rank0_picks(tmp_path):
    """Rank 1 sees a newer step-9 (another job wrote it): both ranks load rank 0's step-6.
    Rank 1 misses rank 0's newest step-9: both ranks stop with the same one-line error.
    A payload in the checkpoint to resume from (a byte item) or in the initial one (its
    .metadata): every rank refuses it before the load, and DCP's guarded load refuses it
    too; nothing runs."""
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
    for rank in (0, 1):
        resume = tmp_path / "planted-resume" / f"rank{rank}" / "checkpoint" / "step-3"
        save_model_checkpoint(resume, with_state=True)
        plant_byte_item(resume, "train_state.step", "subprocess", tmp_path / "MARKER")
    save_model_checkpoint(tmp_path / "planted-initial" / "seed", with_state=True)
    plant_metadata(tmp_path / "planted-initial" / "seed", "eval", tmp_path / "MARKER")
    results = run_on_ranks(_load_on_ranks, 2, root=str(tmp_path))
    assert [r["rank1-sees-newer"] for r in results] == [6.0, 6.0]
    errors = [r["rank1-misses-newest"] for r in results]
    assert errors[0] == errors[1] and "\n" not in errors[0], errors
    assert errors[0].startswith(
        f"rank 1 does not see a complete {tmp_path}/rank1-misses-newest/rank1/checkpoint/step-9 "
        f"(rank 0 resumes from {tmp_path}/rank1-misses-newest/rank0/checkpoint/step-9)"
    ), errors[0]
    for rank, r in enumerate(results):
        assert r["planted-resume"] == (
            f"the checkpoint to resume from, {tmp_path}/planted-resume/rank{rank}/checkpoint/"
            "step-3: __0_0.distcp (train_state.step) asks for subprocess.call: refusing to "
            "load it; a checkpoint holds tensors and metadata only"
        ), r
        assert r["planted-initial"] == (
            f"checkpoint.initial_load_path {tmp_path}/planted-initial/seed: .metadata asks for "
            "builtins.eval: refusing to load it; a checkpoint holds tensors and metadata only"
        ), r
        assert "asks for subprocess.call" in r["planted-resume, load"], r
        assert "asks for builtins.eval" in r["planted-initial, load"], r
    assert not (tmp_path / "MARKER").exists()


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
    assert lines[-1].startswith(f"error: cannot read the files under {data} ("), output[-3000:]
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
