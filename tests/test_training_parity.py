"""Training runs under different parallelisms, from one seed checkpoint, log the same loss.

The dataset repeats one document whose packed token stream has a period that divides
seq_len + 1, so every sample is the same window: data-parallel ranks and a single process
then see the same global batch whatever the sharding of documents.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = "def add(a, b):\n    return a + b\n"
STEPS = 5
TOLERANCE = 5e-4


def _token_period() -> int:
    """Tokens per document in the packed stream (text + BOS + EOS), default tokenizer."""
    code = (
        "from boost_titan.data.tokenizer import load_tokenizer\n"
        f"print(len(load_tokenizer('default').encode({DOC!r}, add_bos=True, add_eos=True)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return int(out.stdout.strip().splitlines()[-1])


def _torchrun(nproc: int, dump: Path, *args: str) -> None:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
        "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0",
        "-m", "boost_titan.train", "--job.config_file", str(ROOT / "train_configs/debug.toml"),
        "--job.dump_folder", str(dump), *args,
    ]  # fmt: skip
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _losses(dump: Path) -> list[float]:
    lines = (dump / "losses.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("parity")
    period = _token_period()
    seq_len = period * (64 // period + 1) - 1
    data = root / "data"
    data.mkdir()
    (data / "docs.jsonl").write_text("".join(json.dumps({"text": DOC}) + "\n" for _ in range(64)))
    common = [
        "--training.dataset_path", str(data), "--training.seq_len", str(seq_len),
        "--training.steps", str(STEPS), "--metrics.log_freq", "1",
        "--metrics.no_enable_tensorboard", "--lr_scheduler.warmup_steps", "2",
        "--debug.seed", "7", "--model.flavor", "debug",
    ]  # fmt: skip
    seed = root / "seed"
    _torchrun(
        1, seed, *common, "--checkpoint.enable", "--checkpoint.create_seed_checkpoint",
        "--parallelism.tensor_parallel_degree", "1",
    )  # fmt: skip
    load = [
        "--checkpoint.enable", "--checkpoint.initial_load_path",
        str(seed / "checkpoint" / "step-0"), "--checkpoint.interval", "1000",
    ]  # fmt: skip
    return root, common + load


def _run(setup, name: str, nproc: int, *parallel: str) -> list[float]:
    root, args = setup
    dump = root / name
    _torchrun(nproc, dump, *args, *parallel)
    return _losses(dump)


@pytest.fixture(scope="module")
def reference(setup) -> list[float]:
    return _run(setup, "tp1", 1, "--parallelism.tensor_parallel_degree", "1",
                "--training.local_batch_size", "4")  # fmt: skip


LAYOUTS = {
    "tp2-btp": (2, "--parallelism.tensor_parallel_degree", "2",
                "--training.local_batch_size", "4"),
    "dp2-tp2": (4, "--parallelism.tensor_parallel_degree", "2",
                "--parallelism.data_parallel_shard_degree", "2",
                "--training.local_batch_size", "2"),
    "pp2-tp2": (4, "--parallelism.tensor_parallel_degree", "2",
                "--parallelism.pipeline_parallel_degree", "2",
                "--parallelism.pipeline_parallel_schedule", "1F1B",
                "--parallelism.pipeline_parallel_microbatch_size", "2",
                "--training.local_batch_size", "4"),
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_same_losses_as_one_process(setup, reference, layout):
    nproc, *parallel = LAYOUTS[layout]
    losses = _run(setup, layout, nproc, *parallel)
    assert len(losses) == len(reference) == STEPS
    diffs = [abs(a - b) for a, b in zip(losses, reference)]
    print(f"{layout}: losses {losses} vs tp1 {reference}; max diff {max(diffs):.2e}")
    assert max(diffs) <= TOLERANCE
    assert reference[-1] < reference[0]  # the runs do train
