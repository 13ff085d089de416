"""No monkeypatching outside the adapters: nothing assigns (or deletes, or `setattr`s) an
attribute of a torch or TorchTitan module, class or function (a name a module imports from
either, or a local name bound to an attribute of one: `options = ring._cp_options`), nor a
private attribute (`x._name`, or an item of one, `x._name[k]`) of any object but its own
(`self`, `cls`), except in the adapters (`ADAPTERS`), where each such write is a named
function. Read from the source with `ast`; a planted tree breaks each kind, so the test can
fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.test_architecture import SOURCE_ROOTS, module_files

FOREIGN = ("torch", "torchtitan")
ADAPTERS = {
    "boost_titan.runtime.titan_internals",
    "boost_titan.runtime.torch_internals",
    "boost_titan.parallelize.torch_internals",
}
"""The modules that may write torch's and TorchTitan's attributes (the library's own writes,
and those of the rooms above it)."""
OWN_MARKER = "_boost_titan_"
"""Our own markers on a user's model (`parallelize.hf_guards`): not someone else's state."""


def foreign_names(tree: ast.AST) -> set[str]:
    """The names a module binds to anything imported from torch or TorchTitan."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound.update(
                alias.asname or alias.name.split(".")[0]
                for alias in node.names
                if alias.name.split(".")[0] in FOREIGN
            )
        elif isinstance(node, ast.ImportFrom) and not node.level:
            if (node.module or "").split(".")[0] in FOREIGN:
                bound.update(alias.asname or alias.name for alias in node.names)
    return bound | aliases(tree, bound)


def aliases(tree: ast.AST, foreign: set[str]) -> set[str]:
    """Local names bound to an attribute (or item) of a foreign name, or of another such
    alias (`options = ring._cp_options`): writing through them writes torch's state."""
    found: set[str] = set()
    assigns = [n for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.AnnAssign)]
    while True:
        known = foreign | found
        new = {
            target.id
            for node in assigns
            if node.value is not None
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name)
            and _root(node.value)[1]
            and _root(node.value)[0] in known
        } - known
        if not new:
            return found
        found |= new


def _root(node: ast.expr) -> tuple[str | None, bool]:
    """The name an attribute / subscript chain starts from, and whether it holds an
    attribute."""
    attribute = False
    while isinstance(node, ast.Attribute | ast.Subscript):
        attribute |= isinstance(node, ast.Attribute)
        node = node.value
    return (node.id if isinstance(node, ast.Name) else None), attribute


def _targets(node: ast.AST) -> list[ast.expr]:
    """What an assignment or `del` writes, tuples unpacked."""
    if isinstance(node, ast.Assign | ast.Delete):
        found = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        found = [node.target]
    else:
        return []
    return [e for t in found for e in (t.elts if isinstance(t, ast.Tuple) else [t])]


def _is_private_write(target: ast.expr) -> bool:
    """`x._name = ...` or `x._name[k] = ...` where `x` is not `self` / `cls` (nor our own
    marker)."""
    while isinstance(target, ast.Subscript):
        target = target.value
    if not isinstance(target, ast.Attribute):
        return False
    name = target.attr
    if not name.startswith("_") or name.startswith("__") or name.startswith(OWN_MARKER):
        return False
    return not (isinstance(target.value, ast.Name) and target.value.id in ("self", "cls"))


def patches(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every write of a torch / TorchTitan attribute, and every private
    attribute written on another object, in one module."""
    foreign = foreign_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            if node.func.id in ("setattr", "delattr") and _root(node.args[0])[0] in foreign:
                found.append((node.lineno, f"{node.func.id}({ast.unparse(node.args[0])}, ...)"))
        for target in _targets(node):
            root, attribute = _root(target)
            if (root in foreign and attribute) or _is_private_write(target):
                found.append((node.lineno, ast.unparse(target)))
    return found


def patches_in(roots: dict[str, Path], allowed: set[str]) -> list[str]:
    """`module:line target` for every patch outside the `allowed` modules."""
    return sorted(
        f"{module}:{line} {what}"
        for module, path in module_files(roots).items()
        if module not in allowed
        for line, what in patches(ast.parse(path.read_text(), str(path)))
    )


def test_nothing_patches_torch_or_torchtitan_outside_the_adapters():
    assert patches_in(SOURCE_ROOTS, ADAPTERS) == []


def test_the_adapters_are_where_the_writes_are():
    """Each adapter holds writes (the allowance is not stale)."""
    files = module_files(SOURCE_ROOTS)
    for adapter in ADAPTERS:
        assert patches(ast.parse(files[adapter].read_text())), adapter


PLANTED = """\
import torch
import torch.nn.functional as F
import torchtitan.distributed.utils as tdu
from torch.distributed.checkpoint import FileSystemReader as Reader
from torchtitan.protocols import model_converter
from . import helpers


def patch(checkpointer, schedule, loss, model):
    F.rms_norm = loss
    Reader.read_metadata = loss
    torch._inductor.config.emulate_precision_casts = True
    tdu.maybe_enable_amp, x = loss, 1
    model_converter._registry_model_converter_cls["float8"] = loss
    setattr(torch.nn.Linear, "forward", loss)
    delattr(Reader, "read_metadata")
    del F.silu
    checkpointer._find_load_step = loss
    schedule._loss_fn = loss
    torch.compiler.config.cache_key_tag += "x"
    options = torch.distributed.tensor._cp_options
    options.convert_to_f32 = False
    model._parameters["weight"] = loss
    table = {}
    table["x"] = options


class Own:
    def __init__(self, model):
        self._state = 1
        self.model = model
        model.public = 2
        model._boost_titan_guarded = True
        helpers.value = 3
        table = {}
        table["x"] = torch
"""


def test_a_planted_patch_of_each_kind_is_found(tmp_path):
    package = tmp_path / "boost_titan"
    (package / "runtime").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "runtime" / "__init__.py").write_text("")
    (package / "runtime" / "trainer.py").write_text(PLANTED)
    (package / "runtime" / "titan_internals.py").write_text(PLANTED)
    found = patches_in({"boost_titan": package}, {"boost_titan.runtime.titan_internals"})
    assert found == sorted(
        f"boost_titan.runtime.trainer:{line} {what}"
        for line, what in [
            (10, "F.rms_norm"),
            (11, "Reader.read_metadata"),
            (12, "torch._inductor.config.emulate_precision_casts"),
            (13, "tdu.maybe_enable_amp"),
            (14, "model_converter._registry_model_converter_cls['float8']"),
            (15, "setattr(torch.nn.Linear, ...)"),
            (16, "delattr(Reader, ...)"),
            (17, "F.silu"),
            (18, "checkpointer._find_load_step"),
            (19, "schedule._loss_fn"),
            (20, "torch.compiler.config.cache_key_tag"),
            (22, "options.convert_to_f32"),
            (23, "model._parameters['weight']"),
        ]
    )
