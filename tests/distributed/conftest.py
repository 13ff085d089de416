"""Every test in this folder launches processes (torchrun, run_train.sh, spawned gloo ranks)
and is marked `slow` here (`-m "not slow"` leaves them out). Also the launch that
several files share: `two_process_run`."""

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from boost_titan.job.launch import train_command
from tests.helpers import DEBUG_TOML, ROOT
from tests.helpers.corpus import real_data_args

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark this folder's tests `slow` (before `-m` selects on markers)."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.slow)


@dataclass
class TrainingRun:
    """A finished `boost_titan.train` run of debug.toml (CoLA, BTP TP 2) on 2 processes,
    on the documented real-data path (a local corpus and a tiktoken tokenizer)."""

    folder: Path
    output: str
    flags: tuple[str, ...]
    """The flags that set its LR schedule, batch and data: a run given them too takes the
    same first steps."""
    rows: list[dict]
    """Its losses.jsonl training rows (loss, exact fp64 grad norm per step)."""


@pytest.fixture(scope="session")
def two_process_run(tmp_path_factory) -> TrainingRun:
    """10 eager steps of debug.toml under torchrun on 2 processes, shared by the tests that
    need a real training run (one launch for all of them). It trains on a JSON-lines corpus
    with a tiktoken `tokenizer.model` folder (Llama 3's format), both written here: the
    `--training.dataset_path` / `--model.hf_assets_path` path of docs/gpus.md; its steps
    accumulate 2 micro-batches (`[boost] gradient_accumulation_steps`)."""
    from boost_titan.runtime.run_log import read_log

    root = tmp_path_factory.mktemp("two-process-run")
    folder = root / "out"
    schedule = ("--lr_scheduler.warmup_steps", "2")  # capped the same in a 2-step run
    # debug.toml's 8 sequences per step as 2 accumulated micro-batches of 4
    batch = ("--training.local_batch_size", "4", "--boost.gradient_accumulation_steps", "2")
    flags = (*schedule, *batch, *real_data_args(root / "data"))
    env = {k: v for k, v in os.environ.items() if k not in ("NGPU", "WORLD_SIZE")}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    result = subprocess.run(
        train_command(
            2,
            DEBUG_TOML,
            folder,
            [
                "--training.steps",
                "10",
                "--metrics.log_freq",
                "5",
                "--metrics.disable_color_printing",
                "--checkpoint.interval",
                "5",
                *flags,
            ],
            launcher_args=("--role", "rank"),
        ),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    rows, _ = read_log(str(folder / "losses.jsonl"))
    return TrainingRun(folder, output, flags, rows)
