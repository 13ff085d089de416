"""torch.compile's caches keyed by rank (`parallelize.compile_cache`): the key tag names the
rank and its process groups, and a compiled job rerun on a warm cache equals eager.

`tests/test_bench_compile.py` runs every strategy x AC mode at TP 2 on a cold and a warm
cache; the test here runs the trainer itself through `run_train.sh`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from boost_titan.parallelize import key_compile_caches_by_rank
from boost_titan.runtime.run_log import read_log

ROOT = Path(__file__).resolve().parents[1]


def _tag(rank: int, shape: tuple[int, ...], user_tag: str = "", calls: int = 1) -> str:
    """The tag rank `rank` of a fake world of prod(shape) ranks sets for a mesh of `shape`."""
    world = 1
    for size in shape:
        world *= size
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    saved = torch.compiler.config.cache_key_tag
    try:
        torch.compiler.config.cache_key_tag = user_tag
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp")[-len(shape) :])
        for _ in range(calls):
            tag = key_compile_caches_by_rank(mesh)
        assert torch.compiler.config.cache_key_tag == tag
        return tag
    finally:
        torch.compiler.config.cache_key_tag = saved
        dist.destroy_process_group()


def test_every_rank_gets_its_own_tag():
    tags = [_tag(rank, (2,)) for rank in range(2)]
    assert tags[0] != tags[1]
    assert tags[0] == _tag(0, (2,))  # stable: the same rank reuses its own entries


def test_same_coordinate_in_other_groups_differs():
    """Ranks 1 and 3 of DP 2 x TP 2 hold the same TP coordinate in different TP groups, and
    rank 1 of TP 2 x DP 2 is not rank 1 of TP 4: the graphs name other process groups."""
    assert _tag(1, (2, 2)) != _tag(3, (2, 2))
    assert _tag(1, (2, 2)) != _tag(1, (4,))


def test_user_tag_kept_and_calls_replace_not_append():
    once = _tag(1, (2,), user_tag="mine|")
    assert once.startswith("mine|boost-titan-rank:1;")
    assert _tag(1, (2,), user_tag="mine|", calls=3) == once


def _aot_entries(cache: Path) -> set[str]:
    """The AOTAutograd cache entries in an Inductor cache folder (key/entry paths)."""
    return {str(p.relative_to(cache)) for p in (cache / "aotautograd").glob("*/*")}


def _compiled_run(
    folder: Path, cache: Path, schedule: tuple[str, ...], flags: tuple[str, ...]
) -> list[tuple[float, float]]:
    """(loss, grad norm) of the 2 steps of `./run_train.sh` (debug.toml, TP 2) with
    torch.compile, Inductor caching in `cache`."""
    env = {k: v for k, v in os.environ.items() if k not in ("NGPU", "WORLD_SIZE")}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(cache), OMP_NUM_THREADS="1")
    result = subprocess.run(
        [
            "./run_train.sh",
            *schedule,
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


@pytest.mark.slow
def test_compiled_training_rerun_on_a_warm_cache_equals_eager(two_process_run, tmp_path):
    """Through run_train.sh, debug.toml at TP 2, torch.compile with Inductor (model and loss,
    TorchTitan's default): selective AC compiled into a fresh cache folder, then low-rank AC
    in a second job on the folder the first one filled. The compiled loss graph is the same
    in both jobs: the second job loads it from the cache, which is how every rerun of a
    compiled job went wrong (its blocks bypass the AOTAutograd cache: custom autograd
    functions). Each job's 2 steps equal the eager run's first 2 (the 2-process training
    run: same seed, data and LR warmup): loss and exact fp64 grad norm."""
    eager = [(r["loss"], r["grad_norm"]) for r in two_process_run.rows[:2]]
    cache = tmp_path / "inductor-cache"
    entries = []
    for i, flags in enumerate(
        [("--activation_checkpoint.mode", "selective"), ("--boost.lowrank_ac",)]
    ):
        steps = _compiled_run(tmp_path / f"run{i}", cache, two_process_run.schedule, flags)
        for (loss, norm), (want_loss, want_norm) in zip(steps, eager, strict=True):
            assert loss == pytest.approx(want_loss, rel=2e-6, abs=0), (flags, steps, eager)
            assert norm == pytest.approx(want_norm, rel=2e-6, abs=0), (flags, steps, eager)
        entries.append(_aot_entries(cache))
    assert entries[0] and entries[1] == entries[0]  # the second job loaded the loss graph
