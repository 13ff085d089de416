"""A checkpoint the trainer wrote (the shared `two_process_run`'s step-10, 2 ranks), with a
payload planted in its `.metadata` (given as `checkpoint.initial_load_path`), in a byte
item or in the dataloader state (found in the dump folder): `boost_titan.check` refuses
each in one line, exit 2, and nothing runs; `run_train.sh` stops at that check and starts
no worker. `tests/unit/test_safe_load.py`: every place in both roles, the allowlist, DCP's
guarded loads and every other reader, on checkpoints written in one process."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from boost_titan.check import main as check_main
from tests.helpers import DEBUG_TOML, ROOT
from tests.helpers.checkpoints import PAYLOAD_NAMES, plant_byte_item, plant_metadata
from tests.helpers.commands import assert_one_error, clean_env

# name -> (payload kind, plant(folder, kind, marker), where it sits: resume or initial)
CASES = {
    ".metadata, initial_load_path": ("os", plant_metadata, "initial"),
    "byte item, resume folder": (
        "subprocess",
        lambda f, k, m: plant_byte_item(f, "train_state.step", k, m),
        "resume",
    ),
    "dataloader state, resume folder": (
        "os",
        lambda f, k, m: plant_byte_item(f, "dataloader.dp_rank_0", k, m, nested=True),
        "resume",
    ),
}
REFUSED = "refusing to load it; a checkpoint holds tensors and metadata only"


def test_trained_checkpoint_with_a_payload_runs_nothing(two_process_run, tmp_path, capsys):
    trained = two_process_run.folder / "checkpoint" / "step-10"
    for i, (name, (kind, plant, where)) in enumerate(CASES.items()):
        case = tmp_path / f"case{i}"
        resume = where == "resume"
        folder = case / "dump" / "checkpoint" / "step-10" if resume else case / "seed" / "step-10"
        shutil.copytree(trained, folder)
        plant(folder, kind, case / "MARKER")
        args = ["--job.dump_folder", str(case / "dump"), "--training.steps", "20"]  # work to do
        args += [] if resume else ["--checkpoint.initial_load_path", str(folder)]
        with pytest.raises(SystemExit) as exit_info:  # check, in this process
            check_main(["--nproc", "2", "--job.config_file", str(DEBUG_TOML), *args])
        out, err = capsys.readouterr()
        role = "the checkpoint to resume from," if resume else "checkpoint.initial_load_path"
        assert exit_info.value.code == 2 and out == "" and len(err.splitlines()) == 1, (name, err)
        assert err.startswith(f"error: {role} {folder}: "), (name, err)
        assert err.rstrip().endswith(f"asks for {PAYLOAD_NAMES[kind]}: {REFUSED}"), (name, err)
    # run_train.sh on the last case: its check refuses, no worker starts
    result = subprocess.run(
        ["./run_train.sh", *args],
        cwd=ROOT,
        env=clean_env() | {"NGPU": "2"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert_one_error(result, f"asks for {PAYLOAD_NAMES[kind]}", REFUSED)
    assert result.returncode == 2 and "[rank" not in result.stdout + result.stderr
    assert not list(tmp_path.glob("case*/MARKER"))
