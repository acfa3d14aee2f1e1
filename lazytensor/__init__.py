"""lazytensor: kernel reductions on large point sets, without the N x M matrix.

>>> import numpy as np
>>> from lazytensor import Vi, Vj
>>> x, y, b = np.random.rand(500, 3), np.random.rand(400, 3), np.random.rand(400, 2)
>>> K = (-Vi(x).sqdist(Vj(y))).exp()
>>> (K @ b).shape
(500, 2)

The public names load on first use, so that ``import lazytensor.cache`` (or
``lazytensor.codegen``) does not import the rest of the package.
"""

from __future__ import annotations

import os
import sys

__version__ = "0.1.0"


class _SourceTreeFinder:
    """Finds ``lazytensor.codegen`` and ``lazytensor.cache`` in a source tree.

    The repository keeps ``codegen/`` and ``cache/`` next to ``lazytensor/``; an install
    (wheel, or the editable install's own finder) places them under ``lazytensor``. Run
    from a checkout that was not installed (``PYTHONPATH=.``), this finder, last on
    ``sys.meta_path``, maps them to the sibling folders.
    """

    def __init__(self, root: str):
        self.dirs = {f"{__name__}.{name}": os.path.join(root, name) for name in ("codegen", "cache")}

    def find_spec(self, fullname, path=None, target=None):
        folder = self.dirs.get(fullname)
        init = os.path.join(folder, "__init__.py") if folder else None
        if init is None or not os.path.isfile(init):
            return None
        import importlib.util

        return importlib.util.spec_from_file_location(fullname, init,
                                                      submodule_search_locations=[folder])


# Modules that moved when lazytensor/ became layered subpackages: their old paths still
# import (``import lazytensor.ranges``, ``from lazytensor.doctor import run_checks``) and
# give the module at its new place, the same object.
MOVED_MODULES = {
    "autograd": "autodiff.autograd", "binding": "core.binding", "blocks": "scale.blocks",
    "cluster": "scale.cluster", "complex_methods": "api.complex_methods", "custom": "api.custom",
    "dispatch": "core.call", "doctor": "cli.doctor", "dual": "autodiff.dual",
    "genred": "api.genred", "half": "core.half", "interop_rules": "interop.rules",
    "interop_table": "interop.table", "interrupt": "core.interrupt",
    "keops_methods": "api.keops_methods", "kernels": "core.kernels", "lazy": "api.lazy",
    "materialize": "api.materialize", "merge": "scale.merge", "method_docs": "api.method_docs",
    "progress": "core.progress", "ranges": "scale.ranges",
    "reference": "backends.reference.dense", "runtime": "backends.cpu.runtime",
    "softmax": "interop.softmax", "solve": "api.solve", "torch_library": "integrations.torch_library",
    "transforms": "autodiff.transforms", "twosided": "backends.cpu.backward",
    "typehints": "api.typehints", "distributed.gather": "distributed.allgather",
}


class _MovedModuleFinder:
    """Imports a module by its old path (:data:`MOVED_MODULES`): the module at its new path.

    The loader puts the new module into ``sys.modules`` under the old name; the import
    system returns what ``sys.modules`` holds once the loader is done.
    """

    def find_spec(self, fullname, path=None, target=None):
        package, _, rest = fullname.partition(".")
        new = MOVED_MODULES.get(rest) if package == __name__ else None
        if new is None:
            return None
        import importlib.util

        return importlib.util.spec_from_loader(fullname, _MovedModuleLoader(f"{__name__}.{new}"))


class _MovedModuleLoader:
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        import importlib

        sys.modules[module.__name__] = importlib.import_module(self.target)


if not any(type(f).__name__ == "_MovedModuleFinder" for f in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())

_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.isdir(os.path.join(_root, "lazytensor", "codegen")) and not any(
        type(f).__name__ == "_SourceTreeFinder" for f in sys.meta_path):
    sys.meta_path.append(_SourceTreeFinder(_root))

# public name -> module that defines it
_EXPORTS = {
    "LazyTensor": "api.lazy", "ComplexLazyTensor": "api.lazy", "Vi": "api.lazy",
    "Vj": "api.lazy", "Pm": "api.lazy",
    "Genred": "api.genred", "generic_sum": "api.genred", "generic_logsumexp": "api.genred",
    "generic_argmin": "api.genred", "generic_argkmin": "api.genred",
    "KernelSolve": "api.solve",
    "elementwise": "api.custom",
    "set_default_grad_mode": "core.options",
    "options": "fastsum", "explain": "fastsum",
}

__all__ = ["ComplexLazyTensor", "LazyTensor", "Pm", "Vi", "Vj", "__version__", "Genred", "KernelSolve",
           "elementwise", "explain", "generic_argkmin", "generic_argmin", "generic_logsumexp",
           "generic_sum", "options", "set_default_grad_mode"]


from . import forks  # noqa: E402,F401 - fork safety from the first import (see forks)
from .lazy_exports import lazy_exports  # noqa: E402

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
