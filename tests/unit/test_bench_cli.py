"""The shape of the `bench` command line: one module per subcommand under `bench/commands/`
(listed once, in `bench.__main__.SUBCOMMANDS`), harnesses in `bench/measure/` that take
explicit arguments rather than argparse Namespaces, and one `--json` writer
(`bench/report.py`). Read from the source with `ast`, like `test_architecture.py`."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from boost_titan.bench.__main__ import SUBCOMMANDS
from boost_titan.bench.report import write_json
from tests.helpers import ROOT

BENCH = ROOT / "boost_titan" / "bench"
JSON_FILE_WRITERS = {"measure/step_worker.py", "measure/quality.py"}
"""Modules that write JSON that is not a `--json` report: the measured worker's report file,
which `bench.measure.step` reads back, and each quality run's record of its arguments."""


def _calls(path: Path) -> set[str]:
    """`module.function` of every call of an attribute of a plain name in `path`."""
    return {
        f"{node.func.value.id}.{node.func.attr}"
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
    }


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(node.module or "")
    return names


def test_each_subcommand_is_one_module_listed_once():
    modules = {p.stem for p in (BENCH / "commands").glob("*.py") if p.stem != "__init__"}
    assert {m.__name__.rpartition(".")[2] for m in SUBCOMMANDS.values()} == modules
    for name, module in SUBCOMMANDS.items():
        assert module.__name__ == f"boost_titan.bench.commands.{name}"
        assert isinstance(module.HELP, str) and callable(module.add_args) and callable(module.run)
    assert len((BENCH / "__main__.py").read_text().splitlines()) < 150


def test_measurement_harnesses_read_no_argparse_namespace():
    users = [
        str(p.relative_to(BENCH))
        for p in (BENCH / "measure").rglob("*.py")
        if "argparse" in _imports(p)
    ]
    assert users == [], f"bench/measure modules import argparse: {users}"


def test_json_reports_are_written_in_one_place():
    writers = sorted(
        str(p.relative_to(BENCH))
        for p in BENCH.rglob("*.py")
        if _calls(p) & {"json.dump", "json.dumps"}
    )
    assert writers == sorted({"report.py", *JSON_FILE_WRITERS})


def test_write_json_prints_or_writes_the_same_text(tmp_path, capsys):
    payload = [{"flavor": "1B", "step_s": 0.5}]
    text = json.dumps(payload, indent=1)
    write_json(payload, "-")
    assert capsys.readouterr().out == text + "\n"
    write_json(payload, str(tmp_path / "out.json"))
    assert (tmp_path / "out.json").read_text() == text
    for nothing in (None, ""):
        write_json(payload, nothing)
    assert capsys.readouterr().out == "" and [p.name for p in tmp_path.iterdir()] == ["out.json"]
