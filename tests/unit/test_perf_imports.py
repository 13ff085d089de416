"""`boost_titan.perf` is a library: it imports no command-line module and no measurement
harness (`boost_titan.bench`), and its modules import each other without a cycle, function-
local imports included (read from the source with `ast`)."""

from __future__ import annotations

import ast
from pathlib import Path

import boost_titan.perf as perf

PERF = Path(perf.__file__).parent
CLI_MODULES = (
    "boost_titan.train",
    "boost_titan.plan",
    "boost_titan.export",
    "boost_titan.eval",
    "boost_titan.generate",
    "boost_titan.activation_memory",
    "boost_titan.loss_compare",
    "boost_titan.torchrun",
    "boost_titan.torchrun_relay",
    "boost_titan.bench",
)
"""Entry points and the measurement harnesses, none of which perf may import. (Not yet
`boost_titan.check`: `perf/job.py` still takes check_batch / resolve_world from it.)"""


def imported(source: str) -> set[str]:
    """Every module an import statement anywhere in `source` names (`from P import m`
    names P.m as well, since m may be a module)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def perf_imports() -> dict[str, set[str]]:
    return {p.stem: imported(p.read_text()) for p in sorted(PERF.glob("*.py"))}


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph` (module -> modules it imports), or []."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str]:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return []
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt, [*path, node])
            if found:
                return found
        done.add(node)
        return []

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return []


def test_perf_imports_no_command_line_module_and_no_harness():
    for module, names in perf_imports().items():
        bad = sorted(n for n in names if n.startswith(CLI_MODULES))
        assert not bad, f"perf/{module}.py imports {bad}"


def test_perf_modules_import_each_other_without_a_cycle():
    graph = {
        module: {n.removeprefix("boost_titan.perf.") for n in names}
        & {p.stem for p in PERF.glob("*.py")}
        for module, names in perf_imports().items()
    }
    assert graph["memory"] == {"layout", "step_model"}  # the cycle that was: memory <-> step
    assert cycle(graph) == []


def test_the_checks_find_what_they_look_for():
    """Break it on purpose: a lazy upward import and a two-module loop are both found."""
    lazy = "def f():\n    from boost_titan.bench.measure import trace\n"
    assert "boost_titan.bench.measure.trace" in imported(lazy)
    assert any(n.startswith(CLI_MODULES) for n in imported(lazy))
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) == []
