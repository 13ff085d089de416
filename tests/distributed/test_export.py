"""A real seed checkpoint, exported by `python -m boost_titan.export`, trains under BTP TP=2
exactly as the DCP checkpoint it came from (`tests/unit/test_export.py`: the one-process
export and import tests)."""

from __future__ import annotations

from pathlib import Path

from safetensors import safe_open

from boost_titan.export import load_model_state
from boost_titan.loss_compare import torchrun_train
from boost_titan.runtime.run_log import read_log
from tests.helpers import DEBUG_TOML
from tests.helpers.checkpoints import bits_equal, checkpoint_weights
from tests.helpers.commands import run_module


# ---- a real checkpoint, exported, trains like the original ---------------------------------
def _torchrun(nproc: int, dump: Path, *args: str) -> list[float]:
    """Two short steps of debug.toml on `nproc` processes; the logged losses (none for a seed
    checkpoint run, which trains no step)."""
    common = ["--training.seq_len", "64", "--training.local_batch_size", "2"]
    common += ["--training.steps", "2", "--metrics.log_freq", "1"]
    common += ["--metrics.no_enable_tensorboard", "--debug.seed", "7"]
    common += ["--checkpoint.interval", "1000"]
    torchrun_train(nproc, dump, [*common, *args], str(DEBUG_TOML), timeout=600)
    log = dump / "losses.jsonl"
    return [row["loss"] for row in read_log(str(log))[0]] if log.exists() else []


def test_trainer_starts_from_export(tmp_path):
    """Seed checkpoint (1 process) -> export (CLI) -> BTP TP=2 runs from the export and from
    the DCP checkpoint log the same losses."""
    seed = tmp_path / "seed"
    tp1, tp2 = (("--parallelism.tensor_parallel_degree", str(n)) for n in (1, 2))
    _torchrun(1, seed, *tp1, "--checkpoint.create_seed_checkpoint")
    step0, out = seed / "checkpoint" / "step-0", tmp_path / "export"
    result = run_module(
        "boost_titan.export", "--checkpoint", str(step0), "--out", str(out), "--arch", "cola"
    )
    assert result.returncode == 0, result.stderr
    assert f"-> {out}/model.safetensors" in result.stdout and "initial_load_in_hf" in result.stdout

    saved = checkpoint_weights(step0, tmp_path)  # the model's tensors (no optimizer etc.)
    with safe_open(out / "model.safetensors", framework="pt") as f:
        assert set(f.keys()) == set(saved)
        assert all(bits_equal(f.get_tensor(k), saved[k]) for k in saved)
    assert all(bits_equal(v, saved[k]) for k, v in load_model_state(str(step0)).items())

    from_dcp = _torchrun(2, tmp_path / "dcp", *tp2, "--checkpoint.initial_load_path", str(step0))
    from_export = _torchrun(
        2,
        tmp_path / "hf",
        *tp2,
        "--checkpoint.initial_load_path",
        str(out),
        "--checkpoint.initial_load_in_hf",
    )
    print(f"losses from DCP {from_dcp}, from export {from_export}")
    assert from_export[0] == from_dcp[0]
    assert from_export == from_dcp
