"""The import rules of docs/architecture.md, read from the source with `ast`: every import
statement counts, the function-local ones included, so no rule can be dodged by importing
late. Each rule is also run on a small planted tree that breaks it, so none can pass vacuously.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

SOURCE_ROOTS = {
    "boost_titan": ROOT / "boost_titan",
    "boost_titan.parallelize": ROOT / "parallelize",
    "boost_titan.kernels": ROOT / "kernels",
}
"""Package name -> folder, as pyproject.toml's package-dir ships them."""

Graph = dict[str, set[str]]
"""Module -> the modules (internal or not) its import statements name."""


def module_files(roots: dict[str, Path]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the roots (`__init__` = the package)."""
    files = {}
    for package, folder in roots.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join([package, *parts])] = path
    return files


def import_graph(roots: dict[str, Path]) -> tuple[Graph, dict[str, Path]]:
    """Every module's imports, resolved to the longest internal module they name (`from a
    import b` names `a.b` where that is a module); names outside the roots stay as written."""
    files = module_files(roots)
    graph: Graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                targets.update(
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                    for alias in node.names
                )
        graph[name] = {_owner(target, files) for target in targets} - {name}
    return graph, files


def _owner(target: str, files: dict[str, Path]) -> str:
    """The internal module that defines `target` (a module or a name in one), else target."""
    probe = target
    while probe and probe not in files:
        probe = probe.rpartition(".")[0]
    return probe or target


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start] & graph.keys())))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child] & graph.keys()))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def entry_points(files: dict[str, Path]) -> set[str]:
    """Command-line modules: a `__main__.py`, or a module with an `if __name__ ==
    "__main__"` block."""
    return {
        name
        for name, path in files.items()
        if path.name == "__main__.py" or '__name__ == "__main__"' in path.read_text()
    }


def entry_point_imports(graph: Graph, files: dict[str, Path]) -> list[str]:
    """`importer -> entry point` for every import of a command-line module."""
    entries = entry_points(files)
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets & entries)


def forbidden_imports(graph: Graph, room: str, banned: tuple[str, ...]) -> list[str]:
    """`importer -> target` for imports from modules in `room` of anything under `banned`."""
    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        if a == room or a.startswith(room + ".")
        for b in targets
        if any(b == ban or b.startswith(ban + ".") for ban in banned)
    )


RULES = {
    # room: what it must not import (docs/architecture.md, "The rooms")
    "boost_titan.kernels": ("boost_titan", "torchtitan"),
    "boost_titan.parallelize": ("boost_titan", "torchtitan"),
    "boost_titan.processes": ("boost_titan", "torchtitan"),
    "boost_titan.checkpoint": ("boost_titan",),
    "boost_titan.checkpoint.safe_load": ("boost_titan", "torchtitan"),
    "boost_titan.checkpoint.dcp_layout": ("boost_titan", "torchtitan"),
    "boost_titan.checkpoint.reads": ("boost_titan", "torchtitan"),
    "boost_titan.config": ("boost_titan",),
    "boost_titan.data": ("boost_titan",),
    "boost_titan.boost_llama": ("boost_titan",),
    "boost_titan.hf_family": ("boost_titan",),
    "boost_titan.runtime": ("boost_titan",),
    "boost_titan.job": ("boost_titan",),
    "boost_titan.perf": ("boost_titan",),
    "boost_titan.examples": ("boost_titan", "torchtitan"),
    "boost_titan.optim": ("boost_titan", "torchtitan"),
    "boost_titan.boost_llama.model": ("boost_titan", "torchtitan", "torch.distributed"),
    "boost_titan.boost_llama.layers": ("boost_titan", "torchtitan", "torch.distributed"),
}
ALLOWED = {
    # room: the exceptions to its RULES entry
    "boost_titan.kernels": ("boost_titan.kernels",),
    "boost_titan.parallelize": (
        "boost_titan.parallelize",
        "boost_titan.kernels",
        "boost_titan.checkpoint.safe_load",
        "boost_titan.checkpoint.dcp_layout",
        "boost_titan.checkpoint.reads",
    ),
    "boost_titan.processes": ("boost_titan.processes",),
    "boost_titan.checkpoint": ("boost_titan.checkpoint", "boost_titan.config"),
    "boost_titan.checkpoint.safe_load": ("boost_titan.checkpoint.safe_load",),
    "boost_titan.checkpoint.dcp_layout": ("boost_titan.checkpoint.safe_load",),
    "boost_titan.checkpoint.reads": ("boost_titan.checkpoint.safe_load",),
    "boost_titan.config": ("boost_titan.config",),
    "boost_titan.data": (
        "boost_titan.data",
        "boost_titan.config",
        "boost_titan.checkpoint",
        "boost_titan.parallelize",
    ),
    "boost_titan.boost_llama": (
        "boost_titan.boost_llama",
        "boost_titan.checkpoint",
        "boost_titan.processes",
        "boost_titan.config",
        "boost_titan.data",
        "boost_titan.runtime",
        "boost_titan.parallelize",
        "boost_titan.kernels",
    ),
    "boost_titan.runtime": (
        "boost_titan.runtime",
        "boost_titan.optim",
        "boost_titan.checkpoint",
        "boost_titan.processes",
        "boost_titan.config",
        "boost_titan.data",
        "boost_titan.parallelize",
        "boost_titan.kernels",
    ),
    "boost_titan.hf_family": (
        "boost_titan.hf_family",
        "boost_titan.config",
        "boost_titan.data",
        "boost_titan.runtime",
        "boost_titan.parallelize",
    ),
    "boost_titan.job": (
        "boost_titan.job",
        "boost_titan.checkpoint",
        "boost_titan.processes",
        "boost_titan.config",
        "boost_titan.data",
        "boost_titan.runtime",
        "boost_titan.parallelize",
    ),
    "boost_titan.perf": (
        "boost_titan.perf",
        "boost_titan.config",
        "boost_titan.boost_llama.shapes",
        "boost_titan.boost_llama.strategies",
        "boost_titan.boost_llama.archs",
        "boost_titan.parallelize.float8",
        "boost_titan.parallelize.norm_modes",
        "boost_titan.kernels.float8",
    ),
    "boost_titan.examples": (
        "boost_titan.examples",
        "boost_titan.parallelize",
        "boost_titan.processes",
        "boost_titan.config.cli",
    ),
    "boost_titan.optim": ("boost_titan.optim",),
    "boost_titan.boost_llama.model": (
        "boost_titan.boost_llama.args",
        "boost_titan.boost_llama.layers",
    ),
}


HOOKS = {
    # module: the one named hook it may import besides its room's ALLOWED
    # (job/families.py: the list of model families, the job room's only way to a family)
    "boost_titan.job.families": ("boost_titan.boost_llama.family", "boost_titan.hf_family.family"),
}


def rule_breaks(graph: Graph) -> list[str]:
    """Every import that breaks a room's rule (RULES minus its ALLOWED and HOOKS)."""
    breaks = []
    for room, banned in RULES.items():
        allowed = ALLOWED.get(room, ())
        for line in forbidden_imports(graph, room, banned):
            importer, target = line.split(" -> ")
            hooks = HOOKS.get(importer, ())
            if not any(target.startswith(ok) for ok in (*allowed, *hooks)):
                breaks.append(line)
    return breaks


@pytest.fixture(scope="module")
def product() -> tuple[Graph, dict[str, Path]]:
    return import_graph(SOURCE_ROOTS)


def test_no_import_cycles(product):
    graph, _ = product
    assert cycles(graph) == []


def test_no_module_imports_a_command(product):
    graph, files = product
    assert entry_point_imports(graph, files) == []


def test_each_room_imports_what_it_may(product):
    graph, files = product
    assert {room for room in RULES if room in files} == set(RULES), "a room of RULES moved"
    assert rule_breaks(graph) == []


MAX_LINES = 700
"""The longest a product module may grow (issue 42: split a room before it gets there)."""


def long_files(roots: dict[str, Path], limit: int = MAX_LINES) -> list[str]:
    """`module: lines` for every module longer than `limit` lines."""
    return [
        f"{name}: {lines}"
        for name, path in module_files(roots).items()
        if (lines := len(path.read_text().splitlines())) > limit
    ]


def test_no_product_module_is_over_the_limit():
    assert long_files(SOURCE_ROOTS) == []


def unlisted_modules(package: str, files: dict[str, Path]) -> list[str]:
    """The modules of `package` its `__init__` docstring does not name (as `name`)."""
    doc = ast.get_docstring(ast.parse(files[package].read_text())) or ""
    members = [name for name in files if name.rpartition(".")[0] == package]
    return sorted(m for m in members if f"`{m.rpartition('.')[2]}`" not in doc)


@pytest.mark.parametrize(
    "package",
    [
        "boost_titan.runtime",
        "boost_titan.job",
        "boost_titan.checkpoint",
        "boost_titan.processes",
        "boost_titan.optim",
    ],
)
def test_a_room_names_every_module_it_holds(product, package):
    _, files = product
    assert unlisted_modules(package, files) == []


def test_every_package_ships():
    """pyproject.toml lists every package folder (an editable install finds an unlisted one,
    a built wheel leaves it out), and nothing else."""
    import tomli

    listed = set(
        tomli.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    files = module_files(SOURCE_ROOTS)
    folders = {name for name, path in files.items() if path.name == "__init__.py"}
    assert folders == listed


# ---- each rule, broken on purpose in a planted tree -------------------------------------------
def _plant(tmp_path: Path, sources: dict[str, str]) -> tuple[Graph, dict[str, Path]]:
    for relative, text in sources.items():
        path = tmp_path / "boost_titan" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return import_graph({"boost_titan": tmp_path / "boost_titan"})


def test_a_cycle_through_a_function_local_import_is_found(tmp_path):
    graph, _ = _plant(
        tmp_path,
        {
            "__init__.py": "",
            "perf/__init__.py": "",
            "perf/memory.py": "from boost_titan.perf.step import Layout\n",
            "perf/step.py": "def f():\n    from . import memory\n    return memory\n",
        },
    )
    assert cycles(graph) == [["boost_titan.perf.memory", "boost_titan.perf.step"]]


def test_an_import_of_a_command_is_found(tmp_path):
    graph, files = _plant(
        tmp_path,
        {
            "__init__.py": "",
            "check.py": 'def main():\n    pass\nif __name__ == "__main__":\n    main()\n',
            "bench/__init__.py": "",
            "bench/__main__.py": "",
            "bench/step.py": "def f():\n    from boost_titan.check import main\n",
            "perf/__init__.py": "from boost_titan.bench import step\n",
        },
    )
    assert entry_point_imports(graph, files) == ["boost_titan.bench.step -> boost_titan.check"]
    assert rule_breaks(graph) == ["boost_titan.perf -> boost_titan.bench.step"]


def test_the_runtime_importing_the_model_is_found(tmp_path):
    """The runtime sits below `boost_llama` (the model's glue imports it); only `job` brings
    the two together."""
    graph, _ = _plant(
        tmp_path,
        {
            "__init__.py": "",
            "boost_llama/__init__.py": "",
            "boost_llama/spec.py": "from boost_titan.runtime import trainer\n",
            "boost_llama/family.py": "",
            "runtime/__init__.py": "",
            "runtime/trainer.py": "def f():\n    from boost_titan.boost_llama.spec import x\n",
            "job/__init__.py": "",
            "job/families.py": "from boost_titan.boost_llama import family\n",
        },
    )
    assert rule_breaks(graph) == ["boost_titan.runtime.trainer -> boost_titan.boost_llama.spec"]


def test_the_job_room_reaching_a_family_past_its_hook_is_found(tmp_path):
    """`job` reaches a model family only through `job/families.py` (its FAMILY hooks), so a
    second family gets every check: a special case for `boost_llama` anywhere else in
    `job` (here preflight importing its spec) is a break, the hook itself is not."""
    graph, _ = _plant(
        tmp_path,
        {
            "__init__.py": "",
            "boost_llama/__init__.py": "",
            "boost_llama/family.py": "",
            "boost_llama/spec.py": "",
            "job/__init__.py": "",
            "job/families.py": "from boost_titan.boost_llama.family import FAMILY\n",
            "job/preflight.py": "def f():\n    from boost_titan.boost_llama.spec import SPEC\n",
        },
    )
    assert rule_breaks(graph) == ["boost_titan.job.preflight -> boost_titan.boost_llama.spec"]


# ---- a plain checkout ------------------------------------------------------------------------
PLAIN_CHECKOUT = """
import sys, importlib.util
import boost_titan.kernels, boost_titan.parallelize
from boost_titan.parallelize import styles
assert importlib.util.find_spec("boost_titan.scripts") is None  # no other top-level folder
print(boost_titan.parallelize.__file__, boost_titan.kernels.__file__, styles.__file__)
"""


def test_a_plain_checkout_imports_the_top_level_packages():
    """With the checkout on PYTHONPATH and nothing of ours installed (`-S`: no site, so no
    editable install's finder; torch's site-packages given by hand), `boost_titan.parallelize`
    and `boost_titan.kernels` are the checkout's top-level folders."""
    import torch

    site_packages = Path(torch.__file__).parents[1]
    result = subprocess.run(
        [sys.executable, "-S", "-c", PLAIN_CHECKOUT],
        cwd=site_packages.anchor,
        env={
            "PATH": os.environ.get("PATH", ""),
            "PYTHONPATH": f"{ROOT}{os.pathsep}{site_packages}",
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    paths = result.stdout.split()
    expected = [ROOT / "parallelize" / "__init__.py", ROOT / "kernels" / "__init__.py"]
    assert paths == [str(p) for p in [*expected, ROOT / "parallelize" / "styles.py"]]


def test_the_checkout_finder_maps_what_pyproject_maps():
    import tomli

    from boost_titan import TOP_LEVEL_PACKAGES

    mapped = tomli.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert TOP_LEVEL_PACKAGES == mapped["package-dir"]


# ---- TorchTitan's private API: one adapter module ---------------------------------------------
TITAN_ADAPTER = "boost_titan.runtime.titan_internals"
"""The one module that uses TorchTitan's private API (`tests/unit/test_titan_internals.py`
checks the signatures it relies on)."""
TITAN_SUBCLASSES = {
    "boost_titan.data.text_stream": "extends HuggingFaceTextDataset's own state",
    "boost_titan.data.loader": "extends ParallelAwareDataloader's state dict",
}
"""Subclasses of TorchTitan's classes in the data room, which cannot import runtime: they
use their base class's private state (their names are checked with the adapter's)."""


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def titan_private_names(titan_root: Path) -> set[str]:
    """The underscore names TorchTitan's source defines: functions, classes, methods,
    module-level names and attributes it assigns (`self._x = ...`)."""
    names = set()
    for path in titan_root.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return {name for name in names if _is_private(name)}


def _titan_module_names(tree: ast.AST, titan_root: Path) -> set[str]:
    """The names a module binds to TorchTitan modules (`import torchtitan.x as y`, `from
    torchtitan.x import y` where y is a module)."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torchtitan":
                    bound.add(alias.asname or "torchtitan")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torchtitan":
            folder = titan_root.joinpath(*node.module.split(".")[1:])
            for alias in node.names:
                if (folder / f"{alias.name}.py").exists() or (folder / alias.name).is_dir():
                    bound.add(alias.asname or alias.name)
    return bound


def titan_private_uses(roots: dict[str, Path], titan_root: Path, allowed: set[str]) -> list[str]:
    """`module:line name` for every use of a TorchTitan private name (an attribute, an
    import) and every assignment to a TorchTitan module's attribute, outside `allowed`."""
    private = titan_private_names(titan_root)
    found = []
    for module, path in module_files(roots).items():
        if module in allowed:
            continue
        tree = ast.parse(path.read_text(), str(path))
        titan_modules = _titan_module_names(tree, titan_root)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in private:
                found.append(f"{module}:{node.lineno} {node.attr}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torchtitan"):
                found += [
                    f"{module}:{node.lineno} {alias.name}"
                    for alias in node.names
                    if _is_private(alias.name)
                ]
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in titan_modules
            ):
                found.append(f"{module}:{node.lineno} {node.value.id}.{node.attr} =")
    return sorted(set(found))


def _titan_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("torchtitan")  # finds the package without importing it
    assert spec is not None and spec.submodule_search_locations
    return Path(spec.submodule_search_locations[0])


def test_torchtitan_private_api_is_used_in_the_adapter_only():
    roots = {"boost_titan": SOURCE_ROOTS["boost_titan"]}
    allowed = {TITAN_ADAPTER, *TITAN_SUBCLASSES}
    uses = titan_private_uses(roots, _titan_root(), allowed)
    assert uses == [], f"TorchTitan's private API outside {TITAN_ADAPTER}: {uses}"


def test_a_torchtitan_private_use_outside_the_adapter_is_found(tmp_path):
    titan = tmp_path / "site" / "torchtitan"
    (titan / "distributed").mkdir(parents=True)
    (titan / "__init__.py").write_text("")
    (titan / "distributed" / "__init__.py").write_text("")
    (titan / "distributed" / "utils.py").write_text(
        "_HELPERS = {}\n"
        "class ParallelDims:\n"
        "    def __init__(self):\n"
        "        self._meshes = {}\n"
        "    def _build(self):\n"
        "        pass\n"
    )
    graph_and_files = _plant(
        tmp_path,
        {
            "__init__.py": "",
            "runtime/__init__.py": "",
            "runtime/titan_internals.py": "def meshes(dims):\n    return dims._meshes\n",
            "runtime/trainer.py": (
                "import torchtitan.distributed.utils as tdu\n"
                "from torchtitan.distributed import utils\n"
                "from torchtitan.distributed.utils import _HELPERS\n"
                "def f(dims):\n"
                "    dims._build()\n"
                "    tdu.clip = None\n"
                "    utils.clip = None\n"
                "    return dims._local_tensor, dims.meshes\n"
            ),
        },
    )
    assert graph_and_files  # the planted tree exists
    uses = titan_private_uses({"boost_titan": tmp_path / "boost_titan"}, titan, {TITAN_ADAPTER})
    assert uses == [
        "boost_titan.runtime.trainer:3 _HELPERS",
        "boost_titan.runtime.trainer:5 _build",
        "boost_titan.runtime.trainer:6 tdu.clip =",
        "boost_titan.runtime.trainer:7 utils.clip =",
    ]


def test_a_long_module_and_an_unlisted_one_are_found(tmp_path):
    _, files = _plant(
        tmp_path,
        {
            "__init__.py": "",
            "runtime/__init__.py": '"""`trainer`: the trainer."""\n',
            "runtime/trainer.py": "x = 1\n" * 3,
            "runtime/extra.py": "x = 1\n",
        },
    )
    assert long_files({"boost_titan": tmp_path / "boost_titan"}, limit=2) == [
        "boost_titan.runtime.trainer: 3"
    ]
    assert unlisted_modules("boost_titan.runtime", files) == ["boost_titan.runtime.extra"]
