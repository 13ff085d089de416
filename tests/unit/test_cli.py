"""Command line: `boost_titan.check` one-line errors (`tests/distributed/test_cli.py`: the
2-process training smoke run)."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from boost_titan.config.cli import condense_tyro_message, with_boost_section
from tests.helpers import DEBUG_TOML, ROOT
from tests.helpers.commands import assert_one_error, check_each, run_module


def _toml(text: str) -> Callable[[Path], list[str]]:
    """A case whose job file (under its folder) holds `text`."""

    def args(folder: Path) -> list[str]:
        path = folder / "job.toml"
        path.write_text(text)
        return ["--job.config_file", str(path)]

    return args


def _debug(*args: str) -> Callable[[Path], list[str]]:
    """A case on debug.toml, its outputs under its folder."""
    return lambda folder: [
        "--job.config_file",
        str(DEBUG_TOML),
        "--job.dump_folder",
        str(folder / "o"),
        *args,
    ]


def _blocked_output(folder: Path) -> list[str]:
    (folder / "file").write_text("not a folder")
    return ["--job.config_file", str(DEBUG_TOML), "--job.dump_folder", str(folder / "file/out")]


# name -> (check's arguments, made in the case's own folder; fragments of its one error line)
ERRORS: dict[str, tuple[Callable[[Path], list[str]], list[str]]] = {
    "malformed toml": (_toml("[training\nsteps = 3\n"), ["malformed TOML", "job.toml"]),
    "missing config file": (
        lambda folder: ["--job.config_file", str(folder / "nope.toml")],
        ["not found"],
    ),
    "unknown key in toml": (_toml("[training]\nstepz = 3\n"), ["training.stepz", "training.steps"]),
    "unknown section in toml": (_toml("[trainingg]\nsteps = 3\n"), ["[trainingg]", "training"]),
    "wrong value type in toml": (_toml('[training]\nsteps = "many"\n'), ["training.steps", "int"]),
    "unknown command-line option": (
        _debug("--training.stepz", "3"),
        ["--training.stepz", "--training.steps"],
    ),
    "bad command-line value": (_debug("--boost.rank", "x"), ["--boost.rank"]),
    # debug.toml is TP=2 with dp_shard -1: 3 processes cannot be split into TP pairs
    "nproc not a multiple of TP": (_debug("--nproc", "3"), ["3 processes"]),
    "nproc above the degrees": (
        _debug("--nproc", "4", "--parallelism.data_parallel_shard_degree", "1"),
        ["need 2 processes", "4 were requested"],
    ),
    "unwritable output folder": (_blocked_output, ["not writable", "--job.dump_folder"]),
}
VALID = "valid config"


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """`python -m boost_titan.check` on every case of ERRORS and on debug.toml (VALID), all
    in one child process, each case in a folder of its own."""
    root = tmp_path_factory.mktemp("cli")
    argvs = {}
    for i, name in enumerate([*ERRORS, VALID]):
        folder = root / f"case{i}"
        folder.mkdir()
        argvs[name] = _debug()(folder) if name == VALID else ERRORS[name][0](folder)
    return dict(zip(argvs, check_each(list(argvs.values()), root), strict=True))


# ---- one-line errors ------------------------------------------------------------------
@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_config_or_command_line(checked, case):
    assert_one_error(checked[case], *ERRORS[case][1])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_read_only_output_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    result = run_module(
        "boost_titan.check",
        "--job.config_file",
        str(DEBUG_TOML),
        "--job.dump_folder",
        str(folder / "out"),
    )
    assert_one_error(result, "not writable")


def test_valid_config_passes(checked):
    result = checked[VALID]
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
