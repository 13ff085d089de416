"""The public API of `boost_titan.parallelize` (and `boost_titan.checkpoint.sharded`'s
`save_sharded` / `load_sharded`, its checkpoint) documents itself, as torch's parallel
styles do.

Every name of `__all__` that is a class or function has an ``Args:`` section naming each
of its parameters and an ``Example::`` whose doctest runs here, in this one process: the
examples that need a process group create a 1-rank gloo group and destroy it.
"""

from __future__ import annotations

import doctest
import inspect
import re
import types

import pytest
import torch
import torch.distributed as dist

import boost_titan.parallelize as api
from boost_titan.checkpoint import sharded

ALIASES = {"Plan"}
"""Public names that are type aliases (no docstring of their own to check)."""

NAMES = sorted(set(api.__all__) - ALIASES)
PUBLIC = {
    **{name: getattr(api, name) for name in NAMES},
    "save_sharded": sharded.save_sharded,
    "load_sharded": sharded.load_sharded,
}
"""Each checked name -> its class or function."""


def parameters(obj) -> list[str]:
    """The parameter names a user passes to `obj` (none for an exception's message)."""
    try:
        signature = inspect.signature(obj)
    except ValueError:  # builtin signatures (PlanError is a ValueError)
        return []
    return [name for name in signature.parameters if name != "self"]


def documented_args(doc: str) -> set[str]:
    """The names listed in the docstring's ``Args:`` section (first indentation level)."""
    lines = doc.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "Args:"), None)
    if start is None:
        return set()
    indent = len(lines[start]) - len(lines[start].lstrip())
    entry = None
    names = set()
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if depth <= indent:
            break
        entry = depth if entry is None else entry
        if depth == entry:
            names.add(re.match(r"\**(\w+)", line.strip()).group(1))
    return names


def test_every_public_name_is_checked():
    """Aliases are generic types; everything else is a class or a function, checked below."""
    assert ALIASES <= set(api.__all__)
    assert all(isinstance(getattr(api, name), types.GenericAlias) for name in ALIASES)
    assert all(
        inspect.isclass(getattr(api, n)) or inspect.isfunction(getattr(api, n)) for n in NAMES
    )


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_documented(name):
    obj = PUBLIC[name]
    doc = inspect.getdoc(obj) or ""
    missing = [p for p in parameters(obj) if p not in documented_args(doc)]
    assert not missing, f"{name}: Args: does not list {', '.join(missing)}"
    assert "Example::" in doc, f"{name}: no Example:: section"


@pytest.fixture
def one_thread():
    """Examples run on one intra-op thread (tiny GEMMs; the machine's cores are shared);
    the compile-cache tag an example sets is restored."""
    if dist.is_initialized():
        pytest.fail("a process group is already initialized; the examples create their own")
    threads, tag = torch.get_num_threads(), torch.compiler.config.cache_key_tag
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    torch.compiler.config.cache_key_tag = tag
    if dist.is_initialized():
        dist.destroy_process_group()
        pytest.fail("an example left its process group initialized")


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_examples_run(name, one_thread):
    obj = PUBLIC[name]
    tests = doctest.DocTestFinder().find(obj, name, globs={"__name__": "__doctest__"})
    own = [t for t in tests if t.name == name]
    assert own and own[0].examples, f"{name}: its docstring has no doctest example"
    runner = doctest.DocTestRunner()
    report: list[str] = []
    for test in tests:
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
