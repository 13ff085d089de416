"""Command line: `boost_titan.check` one-line errors, and a 2-process training smoke run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from boost_titan.config.cli import condense_tyro_message, with_boost_section

ROOT = Path(__file__).resolve().parents[1]
DEBUG_TOML = ROOT / "train_configs" / "debug.toml"


def run_module(module: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("NGPU", "WORLD_SIZE")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_one_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """Non-zero exit, exactly one `error:` line in the output, no traceback; return it."""
    output = result.stdout + result.stderr
    lines = [line for line in output.splitlines() if line.strip()]
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return str(path)


def check(*args: str) -> subprocess.CompletedProcess:
    return run_module("boost_titan.check", *args)


# ---- one-line errors ------------------------------------------------------------------
def test_malformed_toml(tmp_path):
    path = write(tmp_path, "[training\nsteps = 3\n")
    assert_one_error(check("--job.config_file", path), "malformed TOML", path)


def test_missing_config_file(tmp_path):
    assert_one_error(check("--job.config_file", str(tmp_path / "nope.toml")), "not found")


def test_unknown_key_in_toml(tmp_path):
    path = write(tmp_path, "[training]\nstepz = 3\n")
    assert_one_error(check("--job.config_file", path), "training.stepz", "training.steps")


def test_unknown_section_in_toml(tmp_path):
    path = write(tmp_path, "[trainingg]\nsteps = 3\n")
    assert_one_error(check("--job.config_file", path), "[trainingg]", "training")


def test_wrong_value_type_in_toml(tmp_path):
    path = write(tmp_path, '[training]\nsteps = "many"\n')
    assert_one_error(check("--job.config_file", path), "training.steps", "int")


def test_unknown_command_line_option():
    line = assert_one_error(check("--job.config_file", str(DEBUG_TOML), "--training.stepz", "3"))
    assert "--training.stepz" in line and "--training.steps" in line


def test_bad_command_line_value():
    assert_one_error(
        check("--job.config_file", str(DEBUG_TOML), "--boost.rank", "x"), "--boost.rank"
    )


def test_nproc_mismatch():
    # debug.toml is TP=2 with dp_shard -1: 3 processes cannot be split into TP pairs.
    assert_one_error(check("--job.config_file", str(DEBUG_TOML), "--nproc", "3"), "3 processes")
    assert_one_error(
        check(
            "--job.config_file",
            str(DEBUG_TOML),
            "--nproc",
            "4",
            "--parallelism.data_parallel_shard_degree",
            "1",
        ),
        "need 2 processes",
        "4 were requested",
    )


def test_unwritable_output_folder(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert_one_error(
        check("--job.config_file", str(DEBUG_TOML), "--job.dump_folder", str(blocker / "out")),
        "not writable",
        "--job.dump_folder",
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_read_only_output_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    assert_one_error(
        check("--job.config_file", str(DEBUG_TOML), "--job.dump_folder", str(folder / "out")),
        "not writable",
    )


def test_valid_config_passes(tmp_path):
    result = check("--job.config_file", str(DEBUG_TOML), "--job.dump_folder", str(tmp_path / "o"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("config ok: boost_llama debug"), result.stdout
    assert "2 processes (tp 2)" in result.stdout


def readme_process_counts() -> list[tuple[str, int, str]]:
    """(config, processes, layout) rows of README's table of train_configs."""
    text = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `(\w+)\.toml` \| (\d+) \| ([^|]+?) \|$", text, re.MULTILINE)
    return [(config, int(nproc), layout) for config, nproc, layout in rows]


def test_readme_lists_every_config():
    configs = sorted(p.stem for p in (ROOT / "train_configs").glob("*.toml"))
    assert sorted(config for config, _, _ in readme_process_counts()) == configs


@pytest.mark.parametrize("config, nproc, layout", readme_process_counts())
def test_configs_validate_on_cpu_with_readme_process_count(
    config, nproc, layout, tmp_path, monkeypatch
):
    """Each config passes `check` with README's process count, which is also what `check`
    picks without --nproc."""
    from boost_titan.check import check as check_in_process

    monkeypatch.delenv("NGPU", raising=False)
    args = [
        "--job.config_file",
        str(ROOT / "train_configs" / f"{config}.toml"),
        "--job.dump_folder",
        str(tmp_path),
    ]
    where = f"on {nproc} process{'es' if nproc > 1 else ''} ({layout})"
    assert where in check_in_process(["--nproc", str(nproc), *args])
    summary = check_in_process(args)
    assert summary.startswith(f"config ok: boost_llama {config} (cola") and where in summary, (
        summary
    )


# ---- helpers --------------------------------------------------------------------------
def test_boost_section_added_once():
    flag = "--job.custom_config_module=boost_titan.config"
    assert with_boost_section(["--a", "1"]) == ["--a", "1", flag]
    assert with_boost_section(["--job.custom_config_module", "x"]) == [
        "--job.custom_config_module",
        "x",
    ]


def test_condense_tyro_message():
    boxed = (
        "╭─ Unrecognized options ─────╮\n│ Unrecognized options: --x  │\n"
        "│ ────────────────────────── │\n│ Perhaps you meant:         │\n"
        "│     --training.steps INT   │\n╰────────────────────────────╯\n"
    )
    message = condense_tyro_message(boxed)
    assert "\n" not in message
    assert message.startswith("Unrecognized options: --x; did you mean --training.steps?")


# ---- 2-process training smoke run -----------------------------------------------------
LOSS = re.compile(r"step:\s*(\d+)\s+loss:\s*([0-9.]+)")


@pytest.mark.slow
def test_two_process_training_learns(two_process_run):
    """debug.toml (CoLA, BTP TP=2) on 2 CPU processes: the logged loss goes down."""
    output = two_process_run.output
    losses = [(int(s), float(v)) for s, v in LOSS.findall(output)]
    assert [s for s, _ in losses][:2] == [1, 5] and losses[-1][0] == 30, output[-4000:]
    assert losses[-1][1] < losses[0][1] - 0.5, losses
    assert "Summary: ran 30 steps (1-30)" in output
    assert (two_process_run.folder / "checkpoint" / "step-30" / ".metadata").is_file()
    assert len(two_process_run.rows) == 30
