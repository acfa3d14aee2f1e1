"""pykeops drop-in: after ``install()``, ``import pykeops`` gets lazytensor.

One line before the imports, and code written for pykeops (or a library that imports it
itself: geomloss, GPyTorch, Falkon) runs on lazytensor unchanged::

    import lazytensor.compat.pykeops
    lazytensor.compat.pykeops.install()

    from pykeops.torch import LazyTensor, Genred       # lazytensor's
    import geomloss                                    # its pykeops imports: lazytensor's

The aliased modules are ``pykeops``, ``pykeops.config``, ``pykeops.torch``,
``pykeops.numpy``, their ``cluster``, ``operations``, ``generic`` and ``lazytensor``
submodules, and ``keopscore`` / ``keopscore.config`` (which Falkon and pykeops's tests set
flags on). They are served by an import hook placed first on ``sys.meta_path``, so an
installed pykeops is never imported. Any other ``pykeops.*`` name fails with an
ImportError that says what the alias covers. As modules of an installed package, they
have a ``__file__`` (the file that builds them) and the packages a ``__path__`` (its
folder); ``pykeops.__version__`` is the pykeops release whose API they follow (``"2.3"``),
and ``pykeops.config`` holds pykeops 2.3's names (``gpu_available``, ``cuda_config``, ...).

The alias must come first: if the real pykeops was already imported, ``install()``
refuses (:class:`PykeopsAlreadyImported`), since modules that imported it hold it. A
client library imported before ``install()`` has already concluded that pykeops is
missing; ``install()`` warns about each one it knows (GPyTorch, geomloss).

>>> import sys
>>> _ = install()
>>> import pykeops.torch
>>> from lazytensor import LazyTensor
>>> pykeops.torch.LazyTensor is LazyTensor
True
>>> uninstall(); "pykeops" in sys.modules
False
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import warnings
from types import ModuleType

from . import pykeops_modules

__all__ = ["PykeopsAlreadyImported", "install", "installed", "uninstall"]

# Client modules that probe for pykeops when imported, and the attribute that is missing
# (or false) when they found none: imported before install(), they will not use the alias.
_CLIENT_PROBES = {
    "gpytorch.kernels.keops.keops_kernel": "LazyTensor",
    "geomloss._backends.keops": "keops_available",
    "geomloss._legacy.sinkhorn_samples": "keops_available",
    "geomloss._legacy.kernel_samples": "keops_available",
    "geomloss.sinkhorn_samples": "keops_available",
    "geomloss.kernel_samples": "keops_available",
}


class PykeopsAlreadyImported(ImportError):
    """The real pykeops was imported before :func:`install`: the alias cannot replace it."""


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the alias modules of :mod:`lazytensor.compat.pykeops_modules` by name."""

    def __init__(self, keopscore: bool):
        self.keopscore = keopscore  # also serve keopscore (False: the real one stays)

    def find_spec(self, fullname, path=None, target=None):
        root = fullname.partition(".")[0]
        if root not in pykeops_modules.ROOTS or (root == "keopscore" and not self.keopscore):
            return None
        if fullname not in pykeops_modules.BUILDERS:
            covered = ", ".join(sorted(pykeops_modules.BUILDERS))
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: lazytensor's pykeops alias (lazytensor.compat."
                f"pykeops.install()) provides {covered}", name=fullname)
        # a location, as a real package's: __file__ (where the module is built), and for
        # a package __path__ (its folder; its submodules come from this finder all the same)
        spec = importlib.machinery.ModuleSpec(fullname, self, origin=pykeops_modules.ORIGIN,
                                              is_package=fullname in pykeops_modules.PACKAGES)
        spec.has_location = True
        if spec.submodule_search_locations is not None:
            spec.submodule_search_locations.append(pykeops_modules.FOLDER)
        return spec

    def create_module(self, spec):
        module = pykeops_modules.BUILDERS[spec.name](spec.name)
        module.__lazytensor_alias__ = True
        return module

    def exec_module(self, module):
        pass  # the builder made the module whole


_finder: _AliasFinder | None = None
_lock = threading.Lock()


def installed() -> bool:
    """Whether the alias is active.

    >>> installed() in (True, False)
    True
    """
    return _finder is not None


def _is_alias(module) -> bool:
    return getattr(module, "__lazytensor_alias__", False)


def install(keopscore: bool = True) -> ModuleType:
    """Make ``pykeops`` (and ``keopscore``) imports resolve to lazytensor; returns the
    ``pykeops`` alias module. Idempotent.

    ``keopscore=False`` leaves ``keopscore`` alone. ``keopscore`` is also left alone when
    the real one was imported already (setting its flags is harmless); the real
    ``pykeops`` imported already is an error, :class:`PykeopsAlreadyImported`.

    >>> pk = install()
    >>> pk.torch.Genred.__module__
    'lazytensor.api.genred'
    """
    global _finder
    with _lock:
        real = [name for name, mod in list(sys.modules.items())
                if name.partition(".")[0] == "pykeops" and mod is not None and not _is_alias(mod)]
        if real:
            where = getattr(sys.modules[real[0]], "__file__", None) or "?"
            raise PykeopsAlreadyImported(
                f"the real pykeops is already imported ({', '.join(sorted(real)[:4])}"
                f"{' ...' if len(real) > 4 else ''}, from {where}): call lazytensor.compat."
                "pykeops.install() before importing pykeops or a library that imports it "
                "(geomloss, gpytorch, falkon), e.g. at the top of the program")
        if _finder is None:
            real_keopscore = sys.modules.get("keopscore")
            serve_keopscore = real_keopscore is None or _is_alias(real_keopscore)
            finder = _AliasFinder(keopscore and serve_keopscore)
            sys.meta_path.insert(0, finder)
            _finder = finder
        _warn_about_early_clients()
    import pykeops  # noqa: F401  (through the finder)

    return sys.modules["pykeops"]


def uninstall() -> None:
    """Remove the alias: the finder and every alias module in ``sys.modules``.

    Modules that imported the alias keep the objects they hold (lazytensor's).

    >>> _ = install(); uninstall(); installed()
    False
    """
    global _finder
    with _lock:
        if _finder is not None:
            if _finder in sys.meta_path:
                sys.meta_path.remove(_finder)
            _finder = None
        for name in [n for n, m in list(sys.modules.items()) if _is_alias(m)]:
            del sys.modules[name]


def _warn_about_early_clients() -> None:
    for name, flag in _CLIENT_PROBES.items():
        module = sys.modules.get(name)
        if module is not None and not getattr(module, flag, False):
            warnings.warn(
                f"{name} was imported before lazytensor.compat.pykeops.install() and found no "
                f"pykeops: it will not use lazytensor. Call install() before importing "
                f"{name.partition('.')[0]}.", RuntimeWarning, stacklevel=3)
