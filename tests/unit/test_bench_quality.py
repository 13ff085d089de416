"""`bench quality` without training: each method's trainer flags, the refusals before any
launch, the reuse of finished runs, the summary's statistics and table, the same-start
check and the plot. The launcher is replaced by a fake that writes a run's losses.jsonl."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from boost_titan.bench.__main__ import main
from boost_titan.bench.commands.quality import _band, plot
from boost_titan.bench.measure import quality
from boost_titan.bench.measure.quality import METHODS, QualityRuns, run_args, same_start, table
from boost_titan.config.errors import ConfigError
from tests.helpers.commands import assert_one_error

FINAL = {0: 5.0, 1: 5.3, 2: 5.9}
"""The fake runs' final held-out loss per seed (method `svd`; the others add an offset)."""
OFFSET = {"fullrank": -0.2, "svd": 0.0, "svd-loro": 0.1, "cola": 0.3, "lax": 0.2}


def _runs(tmp_path: Path, **changes) -> QualityRuns:
    base = QualityRuns(
        methods=["fullrank", "svd", "svd-loro"],
        seeds=[0, 1, 2],
        out=tmp_path / "runs",
        config="train_configs/debug.toml",
        steps=4,
        batch=2,
        seq_len=16,
        validation_steps=1,
        validate_every=2,
        loro_exact_every=3,
        parallel=2,
    )
    return replace(base, **changes)


def _value(args: list[str], option: str) -> str:
    return args[args.index(option) + 1]


def test_each_method_gets_its_arch_seed_and_optimizer(tmp_path):
    runs = _runs(tmp_path)
    for name, method in METHODS.items():
        args = run_args(runs, name, 7, ["--optimizer.lr", "1e-3"])
        assert _value(args, "--boost.arch") == method.arch
        assert _value(args, "--debug.seed") == "7"
        assert _value(args, "--parallelism.tensor_parallel_degree") == "1"
        assert _value(args, "--training.steps") == "4"
        assert _value(args, "--validation.freq") == "2"
        assert args[-2:] == ["--optimizer.lr", "1e-3"]
        if method.loro:
            assert _value(args, "--optimizer.name") == "LORO"
            assert _value(args, "--boost.loro_exact_every") == "3"
        else:
            assert "--optimizer.name" not in args and "--boost.loro_exact_every" not in args
    # SVD with AdamW and with LORO differ in the optimizer only
    svd, loro = run_args(runs, "svd", 0, []), run_args(runs, "svd-loro", 0, [])
    assert loro == [*svd, "--optimizer.name", "LORO", "--boost.loro_exact_every", "3"]


def _fake_launch(calls: list[Path], fail: str | None = None):
    """A stand-in for launch_training: the run's losses.jsonl, from its arguments."""

    def launch(nproc, config, dump, args):
        dump = Path(dump)
        calls.append(dump)
        if fail and dump.name == fail:
            raise ConfigError(f"training into {dump} failed (exit 1): boom")
        method = dump.name.rpartition("-seed")[0]
        seed, steps = int(_value(args, "--debug.seed")), int(_value(args, "--training.steps"))
        every = int(_value(args, "--validation.freq"))
        final = FINAL[seed] + OFFSET[method]
        rows = [{"step": s, "loss": 9.0 - s + seed, "tokens": 32} for s in range(1, steps + 1)]
        rows += [
            {"step": s, "validation_loss": final + (steps - s), "validation_perplexity": 1.0}
            for s in range(every, steps + 1, every)
        ]
        dump.mkdir(parents=True)
        (dump / "losses.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return "fake run\n"

    return launch


def test_runs_train_once_and_summarise(tmp_path, monkeypatch):
    calls: list[Path] = []
    monkeypatch.setattr(quality, "launch_training", _fake_launch(calls))
    monkeypatch.setattr(quality, "loro_available", lambda: True)
    runs = _runs(tmp_path)
    summary = quality.run(runs, [])
    assert sorted(p.name for p in calls) == sorted(
        f"{m}-seed{s}" for m in runs.methods for s in runs.seeds
    )
    svd = summary["methods"]["svd"]
    assert quality.final_losses(svd) == [5.0, 5.3, 5.9]
    assert svd["runs"][1]["validation_steps"] == [2, 4]
    assert svd["runs"][1]["loss"] == [9.0, 8.0, 7.0, 6.0]
    text = table(summary)
    std = statistics.stdev([5.0, 5.3, 5.9])
    assert (
        f"| SVD-style, AdamW | 5.4000 | 5.0000 - 5.9000 | {std:.4f} | 5.0000 / 5.3000 / 5.9000 |"
        in text
    )
    assert "| full-rank, AdamW | 5.2000 | 4.8000 - 5.7000 |" in text
    assert text.splitlines()[0].startswith("| method | final held-out loss, mean |")
    assert "3 seeds; 4 steps of 2 x 16 tokens (128 tokens)" in text
    assert "LORO's exact step every 3 steps" in text
    # a rerun reuses the finished runs; changed arguments retrain only what they change
    calls.clear()
    assert quality.run(runs, []) == summary
    assert calls == []
    quality.run(replace(runs, loro_exact_every=2), [])
    assert sorted(p.name for p in calls) == ["svd-loro-seed0", "svd-loro-seed1", "svd-loro-seed2"]


def test_a_failed_run_is_one_error_and_leaves_no_record(tmp_path, monkeypatch):
    calls: list[Path] = []
    monkeypatch.setattr(quality, "launch_training", _fake_launch(calls, fail="svd-seed0"))
    runs = _runs(tmp_path, methods=["svd"], seeds=[0, 1], parallel=1)
    with pytest.raises(ConfigError, match="svd-seed0 failed"):
        quality.run(runs, [])
    assert not (runs.out / "svd-seed0" / quality.RECORD).exists()


def test_a_run_without_the_final_held_out_loss_is_refused(tmp_path, monkeypatch):
    calls: list[Path] = []
    monkeypatch.setattr(quality, "launch_training", _fake_launch(calls))
    runs = _runs(tmp_path, methods=["cola"], seeds=[1])
    quality.run(runs, [])
    log = runs.out / "cola-seed1" / "losses.jsonl"
    log.write_text(
        "".join(line for line in log.read_text().splitlines(True) if '"step": 4, "v' not in line)
    )
    with pytest.raises(ConfigError, match="cola-seed1 holds no held-out loss after step 4"):
        quality.run(runs, [])


def test_methods_of_one_arch_must_start_alike(tmp_path, monkeypatch):
    calls: list[Path] = []
    monkeypatch.setattr(quality, "launch_training", _fake_launch(calls))
    monkeypatch.setattr(quality, "loro_available", lambda: True)
    summary = quality.run(_runs(tmp_path), [])
    same_start(summary["methods"])  # svd and svd-loro logged the same step-1 losses
    summary["methods"]["svd-loro"]["runs"][2]["loss"][0] += 1e-4
    with pytest.raises(ConfigError, match="svd-loro and svd .seed 2. start from other weights"):
        same_start(summary["methods"])


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--methods", "svd,adam"], "unknown: adam"),
        (["--methods", "svd,svd"], "must not repeat"),
        (["--seeds", "0,0"], "must not repeat"),
        (["--steps", "0"], "--steps 0: each must be >= 1"),
        (["--steps", "30", "--validate-every", "20"], "--validate-every 20 must divide --steps 30"),
    ],
)
def test_bad_settings_are_one_line_before_any_run(argv, fragment, tmp_path, capsys, monkeypatch):
    calls: list[Path] = []
    monkeypatch.setattr(quality, "launch_training", _fake_launch(calls))
    monkeypatch.setattr(quality, "loro_available", lambda: True)
    code = main(["quality", *_outputs(tmp_path), *argv])
    assert calls == []
    out = capsys.readouterr()
    assert_one_error(_completed(code, out), fragment)
    assert not (tmp_path / "runs").exists()


def test_loro_without_the_optimizer_is_one_line(tmp_path, capsys, monkeypatch):
    calls: list[Path] = []
    monkeypatch.setattr(quality, "launch_training", _fake_launch(calls))
    monkeypatch.setattr(quality, "loro_available", lambda: False)
    code = main(["quality", *_outputs(tmp_path)])
    assert calls == []
    line = assert_one_error(_completed(code, capsys.readouterr()), "svd-loro needs the LORO")
    assert line.endswith("--methods fullrank,svd,cola,lax")
    assert not (tmp_path / "runs").exists()


def _outputs(tmp_path: Path) -> list[str]:
    """The command's output options, all under `tmp_path` (never the docs' files)."""
    runs, results, png = tmp_path / "runs", tmp_path / "quality.json", tmp_path / "quality.png"
    return ["--out", str(runs), "--results", str(results), "--plot", str(png)]


def _completed(code: int, out) -> CompletedProcess:
    """A finished command's result from `main`'s exit code and the captured output."""
    return CompletedProcess([], code, out.out, out.err)


def test_plot_bands_and_file(tmp_path, monkeypatch):
    assert _band([[1.0, 4.0], [3.0, 2.0], [2.0, 6.0]]) == ([2.0, 4.0], [1.0, 2.0], [3.0, 6.0])
    calls: list[Path] = []
    monkeypatch.setattr(quality, "launch_training", _fake_launch(calls))
    summary = quality.run(_runs(tmp_path, methods=["svd", "cola"]), [])
    plot(summary, tmp_path / "quality.png", 2)
    assert (tmp_path / "quality.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
