"""Command line: `boost_titan.check` one-line errors (`tests/distributed/test_cli.py`: the
2-process training smoke run)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from boost_titan.config.cli import condense_tyro_message, with_boost_section
from tests.helpers import DEBUG_TOML, ROOT
from tests.helpers.commands import assert_one_error, run_module


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
