"""pytest plugin: run pykeops's shipped test files on lazytensor, through the alias.

Loaded with ``-p pykeops_alias_plugin`` (this folder on ``PYTHONPATH``) in a pytest run
over ``site-packages/pykeops/test``. It installs :mod:`lazytensor.compat.pykeops` before
anything is collected, and serves from the installed pykeops distribution only its test
files (``pykeops.test.*``) and the two helper modules they import
(``pykeops.numpy.utils``, ``pykeops.torch.utils``: NumPy/torch reference kernels that
themselves import ``pykeops.numpy`` / ``pykeops.torch``, which are lazytensor's). Any
other module of the real pykeops getting imported fails the run (exit status 3, the
modules named on stderr).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

from lazytensor.compat import pykeops as alias

SHIPPED = ("pykeops.test", "pykeops.numpy.utils", "pykeops.torch.utils")


def distribution_dir() -> str | None:
    """The installed pykeops package folder, found without importing it."""
    for entry in sys.path:
        candidate = os.path.join(entry or ".", "pykeops", "test", "__init__.py")
        if os.path.isfile(candidate):
            return os.path.dirname(os.path.dirname(os.path.abspath(candidate)))
    return None


class _ShippedFiles(importlib.abc.MetaPathFinder):
    """Finds pykeops's test files and test helpers in the installed distribution."""

    def __init__(self, root: str):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        if not any(fullname == s or fullname.startswith(s + ".") for s in SHIPPED):
            return None
        rel = fullname.split(".")[1:]
        package = os.path.join(self.root, *rel, "__init__.py")
        if os.path.isfile(package):
            return importlib.util.spec_from_file_location(
                fullname, package, submodule_search_locations=[os.path.dirname(package)])
        module = os.path.join(self.root, *rel) + ".py"
        if os.path.isfile(module):
            return importlib.util.spec_from_file_location(fullname, module)
        return None


def real_pykeops_modules() -> list[str]:
    """Modules of the real pykeops (or keopscore) in ``sys.modules``, the shipped test
    files and helpers aside."""
    found = []
    for name, module in list(sys.modules.items()):
        root = name.partition(".")[0]
        if root not in ("pykeops", "keopscore") or module is None:
            continue
        if getattr(module, "__lazytensor_alias__", False):
            continue
        if any(name == s or name.startswith(s + ".") for s in SHIPPED):
            continue
        found.append(name)
    return sorted(found)


def pytest_configure(config):
    alias.install()
    root = distribution_dir()
    if root is None:
        raise RuntimeError("pykeops is not installed (pip install pykeops==2.3)")
    sys.meta_path.insert(0, _ShippedFiles(root))


def pytest_sessionfinish(session, exitstatus):
    real = real_pykeops_modules()
    if real:
        sys.stderr.write(f"REAL PYKEOPS IMPORTED: {', '.join(real)}\n")
        session.exitstatus = 3
