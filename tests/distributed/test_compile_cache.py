"""A compiled job rerun on a warm torch.compile cache equals eager, through `run_train.sh`.

`tests/distributed/test_bench_compile.py` runs the BTP low-rank cell of `bench compile` at
TP 2 on a cold and a warm cache; `tests/unit/test_compile_cache.py` checks the cache key
tags in one process.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from boost_titan.runtime.run_log import read_log
from tests.helpers import ROOT


def _aot_entries(cache: Path) -> set[str]:
    """The AOTAutograd cache entries in an Inductor cache folder (key/entry paths)."""
    return {str(p.relative_to(cache)) for p in (cache / "aotautograd").glob("*/*")}


def _compiled_run(
    folder: Path, cache: Path, shared: tuple[str, ...], flags: tuple[str, ...]
) -> list[tuple[float, float]]:
    """(loss, grad norm) of the 2 steps of `./run_train.sh` (debug.toml, TP 2) with
    torch.compile, Inductor caching in `cache`."""
    env = {k: v for k, v in os.environ.items() if k not in ("NGPU", "WORLD_SIZE")}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(cache), OMP_NUM_THREADS="1")
    result = subprocess.run(
        [
            "./run_train.sh",
            *shared,
            "--training.steps",
            "2",
            "--compile.enable",
            "--job.dump_folder",
            str(folder),
            "--checkpoint.no_enable",
            "--validation.no_enable",
            *flags,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    rows, _ = read_log(str(folder / "losses.jsonl"))
    return [(r["loss"], r["grad_norm"]) for r in rows]


def test_compiled_training_rerun_on_a_warm_cache_equals_eager(two_process_run, tmp_path):
    """Through run_train.sh, debug.toml at TP 2, torch.compile with Inductor: a first job
    compiles only the loss into a fresh cache folder (`--compile.components loss`, the
    graph that ranks used to take from each other), then a second job compiles model and
    loss (TorchTitan's default) with low-rank AC on the folder the first one filled and
    loads that loss graph from it, as every rerun of a compiled job does (the blocks bypass
    the AOTAutograd cache: custom autograd functions). Each job's 2 steps equal the eager
    run's first 2 (the 2-process training run: same seed, data and LR warmup): loss and
    exact fp64 grad norm. With the rank tag switched off, the second job's step-1 loss was
    1.78 instead of 8.85 (default corpus and tokenizer, before this run took the real-data
    path)."""
    eager = [(r["loss"], r["grad_norm"]) for r in two_process_run.rows[:2]]
    cache = tmp_path / "inductor-cache"
    entries = []
    for i, flags in enumerate([("--compile.components", "loss"), ("--boost.lowrank_ac",)]):
        steps = _compiled_run(tmp_path / f"run{i}", cache, two_process_run.flags, flags)
        for (loss, norm), (want_loss, want_norm) in zip(steps, eager, strict=True):
            assert loss == pytest.approx(want_loss, rel=2e-6, abs=0), (flags, steps, eager)
            assert norm == pytest.approx(want_norm, rel=2e-6, abs=0), (flags, steps, eager)
        entries.append(_aot_entries(cache))
    assert entries[0] and entries[1] == entries[0]  # the second job loaded the loss graph
