"""One name per idea, read from the source with `ast`: each list of choices and each dtype
name map is defined in one module of the product, and no function calls a model's arguments
`model_args*` (TorchTitan's `Trainer.model_args` and `TrainSpec.model_args` keep the name).
Each check also runs on a small planted tree that breaks it.

The scan covers `boost_titan/` and the library (`parallelize/`, `kernels/`): the product's
`RMSNORM_MODES` is the library's (`parallelize/norm_modes.py`, importable without torch: the
package loads its modules on first use), and the grouped norm's refusal names exactly those
the product offers.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import ROOT

ONE_DEFINITION = (
    "AC_MODES",
    "DTYPES",
    "DTYPE_ALIASES",
    "DTYPE_BYTES",
    "DTYPE_SHORT_NAMES",
    "FLOAT8_CASTS",
    "RMSNORM_MODES",
    "STRATEGIES",
    "TOKEN_DTYPES",
    "TORCH_DTYPES",
)
"""Names that must have one module-level definition in the product."""


def definitions(root: Path) -> dict[str, list[str]]:
    """Module-level name -> the files (relative to `root`) that assign it."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, []).append(str(path.relative_to(root)))
    return found


def defined_twice(*roots: Path) -> dict[str, list[str]]:
    """The names of ONE_DEFINITION assigned in more than one module under `roots` (files
    named relative to each root's parent)."""
    found: dict[str, list[str]] = {}
    for root in roots:
        for name, files in definitions(root).items():
            found.setdefault(name, []).extend(f"{root.name}/{file}" for file in files)
    return {
        name: files for name, files in found.items() if name in ONE_DEFINITION and len(files) > 1
    }


def model_args_functions(root: Path) -> list[str]:
    """'file: name' of every function or method whose name starts with model_args."""
    return [
        f"{path.relative_to(root)}: {node.name}"
        for path in sorted(root.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("model_args")
    ]


def test_each_choice_list_and_dtype_map_is_defined_once():
    assert defined_twice(ROOT / "boost_titan", ROOT / "parallelize", ROOT / "kernels") == {}


def test_no_function_is_named_model_args():
    assert model_args_functions(ROOT / "boost_titan") == []


def test_the_library_takes_the_products_rmsnorm_modes():
    """`parallelize`'s grouped norm accepts every mode of `[boost] rmsnorm` and names
    exactly those when it refuses one."""
    from boost_titan.parallelize import BottleneckGroupNorm, NormGroup
    from boost_titan.parallelize.norm_modes import RMSNORM_MODES

    group = NormGroup("ln", ("a", "b"), low_rank=True)
    for mode in RMSNORM_MODES:
        assert BottleneckGroupNorm(group, rmsnorm=mode).rmsnorm == mode
    with pytest.raises(ValueError) as refused:
        BottleneckGroupNorm(group, rmsnorm="neither")
    assert str(refused.value) == (
        f"rmsnorm must be one of {', '.join(RMSNORM_MODES)}, not 'neither'"
    )


# ---- each check, broken on purpose in a planted tree -------------------------------------------
def test_a_second_definition_is_found(tmp_path):
    product, library = tmp_path / "boost_titan", tmp_path / "parallelize"
    for folder in (product / "perf", product / "boost_llama", library):
        folder.mkdir(parents=True)
    (product / "boost_llama/strategies.py").write_text("STRATEGIES: dict = {}\n")
    (product / "perf/layout.py").write_text("STRATEGIES = ()\nOTHER = 1\n")
    (product / "config.py").write_text("RMSNORM_MODES = ('online',)\n")
    (library / "norm_modes.py").write_text("RMSNORM_MODES = ('online', 'sync')\n")
    assert defined_twice(product, library) == {
        "RMSNORM_MODES": ["boost_titan/config.py", "parallelize/norm_modes.py"],
        "STRATEGIES": ["boost_titan/boost_llama/strategies.py", "boost_titan/perf/layout.py"],
    }


def test_a_model_args_function_is_found(tmp_path):
    (tmp_path / "spec.py").write_text(
        "def model_args_for(job):\n    return job\n\n"
        "class Cpu:\n    def model_args(self):\n        return self\n"
    )
    assert model_args_functions(tmp_path) == ["spec.py: model_args_for", "spec.py: model_args"]
