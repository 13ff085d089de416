"""boost-titan: bottleneck-aware tensor parallelism for low-rank LLMs on TorchTitan.

This package stays importable without torch or torchtitan (the commands that must start
fast import neither: tests/unit/test_preflight.py).

`boost_titan.parallelize` and `boost_titan.kernels` live in the checkout's top-level
`parallelize/` and `kernels/` folders (pyproject.toml's package-dir); an install (editable or
not) maps them. In a plain checkout on `PYTHONPATH`, with nothing installed, importing this
package adds `CheckoutFolders`, a finder for exactly those two names, at the end of
`sys.meta_path`: it answers only what no installed mapping found.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

TOP_LEVEL_PACKAGES = {"boost_titan.parallelize": "parallelize", "boost_titan.kernels": "kernels"}
"""Our packages kept outside this folder -> their folder in the checkout (as pyproject.toml's
package-dir; tests/unit/test_architecture.py checks that the two agree)."""

_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CheckoutFolders(importlib.abc.MetaPathFinder):
    """Finds `TOP_LEVEL_PACKAGES` in the checkout's top-level folders."""

    def find_spec(self, name, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        folder = TOP_LEVEL_PACKAGES.get(name)
        if folder is None:
            return None
        init = os.path.join(_CHECKOUT, folder, "__init__.py")
        return importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[os.path.dirname(init)]
        )


def _in_a_checkout() -> bool:
    """Whether this package sits beside the top-level folders (a checkout, not an install)."""
    return all(
        os.path.isfile(os.path.join(_CHECKOUT, folder, "__init__.py"))
        for folder in TOP_LEVEL_PACKAGES.values()
    )


if _in_a_checkout() and not any(isinstance(f, CheckoutFolders) for f in sys.meta_path):
    sys.meta_path.append(CheckoutFolders())
