"""The commands are thin: no module of the package (nor of `boost_titan.parallelize` /
`.kernels`) imports a command module, at the top or inside a function. Read with `ast`,
nothing imported."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT

PACKAGES = {
    "boost_titan": "boost_titan",
    "boost_titan.parallelize": "parallelize",
    "boost_titan.kernels": "kernels",
}
COMMANDS = {
    f"boost_titan.{name}"
    for name in (
        "activation_memory",
        "check",
        "eval",
        "export",
        "generate",
        "hf_refusals",
        "loss_compare",
        "plan",
        "torchrun",
        "torchrun_relay",
        "train",
    )
} | {"boost_titan.bench.__main__", "boost_titan.boost_llama.__main__"}


def modules() -> dict[str, Path]:
    """Dotted name -> file of every module the package ships."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((package, *parts))] = path
    return found


def imported(module: str, path: Path) -> set[str]:
    """The dotted names `path` imports (relative imports resolved), anywhere in it."""
    names = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            base = ".".join(p for p in (base, node.module or "") if p)
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


def command_imports(found: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the command modules it imports (modules importing none left out)."""
    return {
        module: hits
        for module, path in found.items()
        if module not in COMMANDS and (hits := imported(module, path) & COMMANDS)
    }


def test_no_module_imports_a_command():
    found = modules()
    assert COMMANDS <= found.keys(), COMMANDS - found.keys()
    assert command_imports(found) == {}


def test_a_command_import_is_found(tmp_path):
    """Break it on purpose: a module that imports `check` inside a function is reported."""
    module = tmp_path / "job.py"
    module.write_text("def f():\n    from boost_titan.check import main\n")
    found = {"boost_titan.bench.model.job": module, "boost_titan.check": module}
    assert command_imports(found) == {"boost_titan.bench.model.job": {"boost_titan.check"}}
    relative = tmp_path / "worker.py"
    relative.write_text("from ... import train\n")
    found = {"boost_titan.bench.measure.step_worker": relative}
    assert command_imports(found) == {
        "boost_titan.bench.measure.step_worker": {"boost_titan.train"}
    }
