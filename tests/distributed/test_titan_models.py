"""TorchTitan's own llama3 (debugmodel) trained by `boost_titan.train`, which serves any
TrainSpec: 3 steps at TP 1 with a checkpoint every step, then its step-1 checkpoint resumed
at TP 2 on 2 processes for steps 2 and 3, with the same `training.steps` (so the same LR
schedule). The resumed steps' losses and gradient norms equal the uninterrupted run's (TP
changes only the order of sums: a wrong load, data position or schedule moves them by far
more). A dataloader state with a payload planted in that checkpoint is refused by `check`
and by a worker started without it (issue 39's guard on TorchTitan's own loader).

`tests/unit/test_microbatches.py`: the micro-batch protocol of a model with none of our
attributes; `tests/unit/test_construction.py`: what `check` builds for such a model.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from boost_titan.check import main as check_main
from boost_titan.job.launch import train_command
from tests.helpers import DEBUG_TOML, ROOT
from tests.helpers.checkpoints import PAYLOAD_NAMES, plant_byte_item
from tests.helpers.corpus import write_hf_tokenizer

STEPS = 3


def llama3_args(tokenizer: Path, tp: int) -> list[str]:
    """The llama3 debugmodel job on debug.toml at TP `tp`: a checkpoint every step, all kept."""
    return [
        "--model.name",
        "llama3",
        "--model.flavor",
        "debugmodel",
        "--model.hf_assets_path",
        str(tokenizer),
        "--training.dataset",
        "stdlib",
        "--training.steps",
        str(STEPS),
        "--training.seq_len",
        "64",
        "--training.local_batch_size",
        "4",
        "--parallelism.tensor_parallel_degree",
        str(tp),
        "--validation.no_enable",
        "--checkpoint.interval",
        "1",
        "--checkpoint.keep_latest_k",
        "0",
        "--metrics.log_freq",
        "1",
        "--metrics.disable_color_printing",
    ]


def _train(nproc: int, folder: Path, args: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("NGPU", "WORLD_SIZE")}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    command = train_command(nproc, DEBUG_TOML, folder, args, launcher_args=("--role", "rank"))
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@dataclass
class Llama3Runs:
    tokenizer: Path
    tp1: Path
    """The uninterrupted TP 1 run's dump folder."""
    tp2: Path
    """The TP 2 run resumed from tp1's step-1 checkpoint."""
    rows: dict[int, list[dict]]
    """Each run's losses.jsonl training rows, by TP degree."""
    outputs: dict[int, str]


@pytest.fixture(scope="module")
def llama3_runs(tmp_path_factory) -> Llama3Runs:
    from boost_titan.runtime.run_log import read_log

    root = tmp_path_factory.mktemp("llama3")
    tokenizer = write_hf_tokenizer(root / "tokenizer")
    tp1, tp2 = root / "tp1", root / "tp2"
    rows, outputs = {}, {}
    for tp, folder in ((1, tp1), (2, tp2)):
        if tp == 2:
            shutil.copytree(tp1 / "checkpoint" / "step-1", tp2 / "checkpoint" / "step-1")
        result = _train(tp, folder, llama3_args(tokenizer, tp))
        outputs[tp] = result.stdout + result.stderr
        assert result.returncode == 0, outputs[tp][-4000:]
        rows[tp], _ = read_log(str(folder / "losses.jsonl"))
    return Llama3Runs(tokenizer, tp1, tp2, rows, outputs)


def test_llama3_trains_and_resumes_at_tp2(llama3_runs):
    """Steps 1-3 at TP 1; steps 2-3 at TP 2 from its step-1 checkpoint, equal to the
    uninterrupted run's to 1e-5 (measured: 7.5e-8); a fresh start at TP 2 differs at once
    (other initial weights: 8.040 vs 8.062), a lost data position or LR schedule from step 2."""
    uninterrupted = {row["step"]: row for row in llama3_runs.rows[1]}
    resumed = {row["step"]: row for row in llama3_runs.rows[2]}
    assert sorted(uninterrupted) == [1, 2, 3] and sorted(resumed) == [2, 3]
    assert "Training starts at step 2" in llama3_runs.outputs[2]
    for step, row in resumed.items():
        reference = uninterrupted[step]
        for key in ("loss", "grad_norm"):
            assert math.isfinite(row[key]), (step, key)
            assert math.isclose(row[key], reference[key], rel_tol=1e-5), (step, key, row, reference)
    assert uninterrupted[3]["loss"] < uninterrupted[1]["loss"] - 0.5  # it learns


REFUSED = "refusing to load it; a checkpoint holds tensors and metadata only"


def test_llama3_dataloader_payload_is_refused(llama3_runs, tmp_path, capsys):
    """The TP 1 run's step-1 checkpoint with a payload in TorchTitan's dataloader state, as
    the resume folder: `check` says one line, exit 2; a worker started without `check`
    (torchrun) stops with the same line, exit 2, no traceback; the payload never runs."""
    dump = tmp_path / "dump"
    folder = dump / "checkpoint" / "step-1"
    shutil.copytree(llama3_runs.tp1 / "checkpoint" / "step-1", folder)
    marker = tmp_path / "MARKER"
    plant_byte_item(folder, "dataloader.dp_rank_0", "os", marker, nested=True)
    args = llama3_args(llama3_runs.tokenizer, 1)
    expected = f"error: the checkpoint to resume from, {folder}: "
    with pytest.raises(SystemExit) as exit_info:
        check_main(
            [
                "--nproc",
                "1",
                "--job.config_file",
                str(DEBUG_TOML),
                "--job.dump_folder",
                str(dump),
                *args,
            ]
        )
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith(expected) and err.rstrip().endswith(
        f"asks for {PAYLOAD_NAMES['os']}: {REFUSED}"
    ), err
    result = _train(1, dump, args)  # bare torchrun: its own report follows the worker's line
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "(exitcode: 2)" in output, output[-4000:]
    worker = [line.removeprefix("[rank0]:") for line in output.splitlines() if "[rank0]:" in line]
    assert not any("Traceback" in line for line in worker), output[-4000:]
    assert [line for line in worker if line.startswith("error:")] == [err.rstrip()]
    assert "Training starts" not in output and not marker.exists()
