"""The modules of the pykeops alias: what ``pykeops``, ``pykeops.torch``, ... hold.

Each entry of :data:`BUILDERS` makes one module object from lazytensor's own objects
(``pykeops.torch.LazyTensor is lazytensor.LazyTensor``); :mod:`lazytensor.compat.pykeops`
serves them on import. The names follow pykeops 2.3; functions that manage pykeops's
build folder act on lazytensor's kernel cache.

>>> m = BUILDERS["pykeops.config"]("pykeops.config")
>>> m.numpy_found, isinstance(m.gpu_available, bool)
(True, True)
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Callable

import numpy as np

API_VERSION = "2.3"  # the pykeops release whose API the alias follows
ROOTS = ("pykeops", "keopscore")
# The alias modules' __file__ is this file (their builders are here), and an alias
# package's __path__ is [its folder]: clients that check that a package's files exist
# find them. Submodules still come from the alias's finder, which precedes the path-based
# ones on sys.meta_path.
ORIGIN = os.path.abspath(__file__)
FOLDER = os.path.dirname(ORIGIN)

_TORCH_NAMES = ("ComplexLazyTensor", "Genred", "KernelSolve", "LazyTensor", "Pm", "Vi", "Vj", "generic_argkmin",
                "generic_argmin", "generic_logsumexp", "generic_sum")


def _module(name: str, doc: str, **attrs) -> ModuleType:
    module = ModuleType(name, doc)
    module.__dict__.update(attrs)
    return module


def _lazy_submodules(module: ModuleType, names: tuple) -> None:
    """``pykeops.torch`` after ``import pykeops`` (as pykeops, which imports it eagerly)."""

    def __getattr__(attr):
        if attr in names:
            return importlib.import_module(f"{module.__name__}.{attr}")
        raise AttributeError(f"lazytensor's pykeops alias: module {module.__name__!r} has no "
                             f"attribute {attr!r}")

    module.__getattr__ = __getattr__


# ---------------------------------------------------------------------------- pykeops


def _cache_root() -> str:
    from ..cache import default_cache

    return str(default_cache().root)


def set_build_folder(path: str | None = None) -> None:
    """pykeops's ``set_build_folder``: lazytensor's kernel cache moves to ``path``
    (``$LAZYTENSOR_CACHE_DIR``); ``None`` goes back to the default location."""
    from ..cache.location import ENV_VAR

    if path is None:
        os.environ.pop(ENV_VAR, None)
    else:
        os.environ[ENV_VAR] = os.fspath(path)


def clean_pykeops(recompile_jit_binaries: bool = True) -> None:
    """pykeops's ``clean_pykeops``: empties lazytensor's kernel cache (kernels are
    rebuilt on their next use)."""
    from ..cache import default_cache

    default_cache().clear()


def _bindings_check(library: str) -> None:
    from .. import Vi, Vj

    rng = np.random.default_rng(0)
    x, y, b = rng.random((10, 3)), rng.random((12, 3)), rng.random((12, 2))
    if library == "torch":
        import torch

        x, y, b = (torch.as_tensor(a) for a in (x, y, b))
    got = np.asarray((-Vi(x).sqdist(Vj(y))).exp() @ b)
    want = np.exp(-((np.asarray(x)[:, None] - np.asarray(y)[None]) ** 2).sum(-1)) @ np.asarray(b)
    if not np.allclose(got, want, rtol=1e-10, atol=1e-12):
        raise RuntimeError(f"lazytensor ({library}): a Gaussian kernel product disagrees with "
                           f"NumPy (max error {np.abs(got - want).max():.3g})")
    print(f"pyKeOps with {library} bindings is working! (lazytensor)")


def test_torch_bindings() -> None:
    """pykeops's install check, on lazytensor with torch tensors."""
    _bindings_check("torch")


def test_numpy_bindings() -> None:
    """pykeops's install check, on lazytensor with NumPy arrays."""
    _bindings_check("numpy")


def check_health() -> None:
    """What lazytensor can run on: the C++ compiler, CUDA, the cache directory."""
    from ..codegen.compilers import cpu_compiler

    compiler = cpu_compiler()
    print(f"lazytensor kernels (pykeops alias, API {API_VERSION})")
    print(f"  C++ compiler: {'available' if compiler.available else 'missing'}")
    print(f"  CUDA device: {'available' if _gpu_available() else 'none'}")
    print(f"  kernel cache: {_cache_root()}")


def _gpu_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def _top(name: str) -> ModuleType:
    import lazytensor

    module = _module(
        name, "lazytensor, under the name pykeops (see lazytensor.compat.pykeops).",
        __version__=API_VERSION, lazytensor_version=lazytensor.__version__, verbose=True,
        default_device_id=0, numpy_found=True,
        torch_found=importlib.util.find_spec("torch") is not None,
        clean_pykeops=clean_pykeops, check_health=check_health,
        get_build_folder=_cache_root, keops_get_build_folder=_cache_root,
        set_build_folder=set_build_folder, test_torch_bindings=test_torch_bindings,
        test_numpy_bindings=test_numpy_bindings, show_cuda_status=False)

    def set_verbose(val: bool) -> None:
        module.verbose = bool(val)

    module.set_verbose = set_verbose
    _lazy_submodules(module, ("config", "torch", "numpy", "common"))
    return module


def _config(name: str) -> ModuleType:
    """pykeops 2.3's ``config``: keopscore's configuration objects (the alias's, shared
    with ``keopscore.config`` when that is the alias too) and what it derives from them."""
    flags = _shared_flags()
    return _module(
        name, "pykeops.config on lazytensor: what the alias can run on.",
        **_config_objects(flags), pykeops_base=flags, pykeops_cuda=flags, pykeops_openmp=flags,
        gpu_available=flags.get_use_cuda(), use_cuda=flags.get_use_cuda(),
        use_OpenMP=flags.get_use_OpenMP(), cuda_version=flags.cuda_version,
        numpy_found=True, torch_found=importlib.util.find_spec("torch") is not None,
        get_build_folder=_cache_root, set_build_folder=set_build_folder)


# ---------------------------------------------------------------------------- torch / numpy


def _frontend(library: str) -> Callable[[str], ModuleType]:
    def build(name: str) -> ModuleType:
        front = importlib.import_module(f"lazytensor.{library}")
        module = _module(name, f"pykeops.{library} on lazytensor ({front.__name__}).",
                         __all__=list(_TORCH_NAMES),
                         **{n: getattr(front, n) for n in _TORCH_NAMES})
        _lazy_submodules(module, ("cluster", "operations", "generic", "lazytensor", "utils"))
        return module

    return build


def _cluster(name: str) -> ModuleType:
    """pykeops's cluster helpers; ``grid_cluster`` as the pykeops module's own: anchored at
    the points' minimum in pykeops.torch, at the origin in pykeops.numpy."""
    from ..scale import cluster

    helpers = {n: getattr(cluster, n) for n in cluster.__all__}
    if name.startswith("pykeops.numpy."):
        helpers["grid_cluster"] = cluster.grid_cluster_at_origin
    return _module(name, "pykeops's cluster helpers on lazytensor (lazytensor.scale.cluster).",
                   __all__=list(cluster.__all__), **helpers)


def _operations(name: str) -> ModuleType:
    from ..api.solve import KernelSolve

    return _module(name, "pykeops's KernelSolve on lazytensor.", KernelSolve=KernelSolve)


def _generic(name: str) -> ModuleType:
    from ..api import genred

    names = ("Genred", "generic_argkmin", "generic_argmin", "generic_logsumexp", "generic_sum")
    return _module(name, "pykeops's Genred and generic_* on lazytensor.",
                   generic_red=genred, generic_ops=genred, **{n: getattr(genred, n) for n in names})


def _lazytensor_module(name: str) -> ModuleType:
    from ..api import lazy

    return _module(name, "pykeops's LazyTensor module on lazytensor.", LazyTensor=lazy.LazyTensor,
                   GenericLazyTensor=lazy.LazyTensor, Vi=lazy.Vi, Vj=lazy.Vj, Pm=lazy.Pm)


def _common(name: str) -> ModuleType:
    module = _module(name, "pykeops.common on lazytensor: pykeops's shared helpers.")
    _lazy_submodules(module, ("utils", "gpu_utils"))
    return module


def _common_utils(name: str) -> ModuleType:
    from . import pykeops_common as c
    from . import pykeops_utils as u

    return _module(name, "pykeops.common.utils on lazytensor (lazytensor.compat.pykeops_common).",
                   c_type=dict(c.C_TYPE), axis2cat=c.axis2cat, cat2axis=c.cat2axis,
                   get_tools=c.get_tools, WarmUpGpu=c.warm_up, max_tuple=c.max_tuple,
                   check_broadcasting=c.check_broadcasting, pyKeOps_Print=u.pyKeOps_Print,
                   pyKeOps_Message=u.pyKeOps_Message, pyKeOps_Warning=u.pyKeOps_Warning)


def _gpu_utils(name: str) -> ModuleType:
    from . import pykeops_utils as u

    return _module(name, "pykeops.common.gpu_utils on lazytensor.", get_gpu_number=u.get_gpu_number)


def _numpy_utils(name: str) -> ModuleType:
    from . import pykeops_utils as u

    names = ("numpytools", "squared_distances", "differences", "np_kernel_sphere", "np_kernel",
             "log_np_kernel", "grad_np_kernel", "chain_rules", "log_sum_exp")
    return _module(name, "pykeops.numpy.utils on lazytensor (lazytensor.compat.pykeops_utils).",
                   WarmUpGpu=u.numpy_warm_up, Genred=u._Genred, KernelSolve=u._KernelSolve,
                   np_swap_axes=u._swap_axes, **{n: getattr(u, n) for n in names})


def _torch_utils(name: str) -> ModuleType:
    from . import pykeops_torch_utils as t

    return _module(name, "pykeops.torch.utils on lazytensor (lazytensor.compat.pykeops_torch_utils).",
                   Genred=t._Genred, KernelSolve=t._KernelSolve, torch_swap_axes=t._swap_axes,
                   **{n: getattr(t, n) for n in t.__all__})


# ---------------------------------------------------------------------------- keopscore


def _cuda_version() -> int | None:
    """The CUDA runtime's version as ``cudaRuntimeGetVersion`` gives it (12040 for 12.4),
    torch's, when a GPU is usable; None otherwise (as keopscore without CUDA)."""
    if not _gpu_available():
        return None
    import torch

    major, _, minor = (torch.version.cuda or "").partition(".")
    return int(major) * 1000 + int(minor or 0) * 10 if major.isdigit() else None


class _Flags:
    """keopscore's configuration objects (``config``, ``cuda_config``, ``openmp_config``,
    ``platform_detector``, one object here): flags that clients set (``use_cuda``) and
    read. lazytensor does not act on them."""

    def __init__(self, **flags):
        self.__dict__.update(flags)

    def get_use_cuda(self) -> bool:
        return bool(self.use_cuda)

    def get_use_OpenMP(self) -> bool:
        return bool(self.use_OpenMP)

    def get_cuda_version(self, out_type: str = "single_value"):
        """``12040``, ``(12, 4)`` (``"major,minor"``) or ``"12.4"`` (``"string"``); None
        without CUDA."""
        v = self.cuda_version
        if v is None or out_type == "single_value":
            return v
        major, minor = v // 1000, (v % 1000) // 10
        return (major, minor) if out_type == "major,minor" else f"{major}.{minor}"

    def get_build_folder(self) -> str:
        return _cache_root()

    def get_os(self) -> str:
        return self.os


def _new_flags() -> _Flags:
    import platform

    use_cuda = _gpu_available()
    n_gpus = 0
    if use_cuda:
        import torch

        n_gpus = torch.cuda.device_count()
    return _Flags(use_cuda=use_cuda, use_OpenMP=True, cuda_version=_cuda_version(),
                  n_gpus=n_gpus, os=f"{platform.system()} {platform.release()}")


def _shared_flags() -> _Flags:
    """The flags of the alias's ``keopscore.config`` or ``pykeops.config`` if one is
    imported (pykeops's config re-exports keopscore's objects: a flag set through one is
    seen through the other), else new ones."""
    for name in ("keopscore.config", "pykeops.config"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__lazytensor_alias__", False):
            return module.config
    return _new_flags()


def _config_objects(flags: _Flags) -> dict:
    """What ``keopscore.config`` exports (``from keopscore.config import *`` in pykeops)."""
    return dict(config=flags, cuda_config=flags, openmp_config=flags, platform_detector=flags,
                get_config=lambda: flags, get_cuda_config=lambda: flags,
                get_openmp_config=lambda: flags, get_platform_config=lambda: flags)


def _keopscore(name: str) -> ModuleType:
    return _module(name, "keopscore's flags for clients of the pykeops alias (no effect).",
                   __version__=API_VERSION, verbose=True, auto_factorize=False, debug_ops=False,
                   debug_ops_at_exec=False)


def _keopscore_config(name: str) -> ModuleType:
    flags = _shared_flags()
    return _module(name, "keopscore.config's flags for clients of the pykeops alias (no effect).",
                   **_config_objects(flags), use_cuda=flags.use_cuda,
                   get_build_folder=_cache_root)


BUILDERS: dict[str, Callable[[str], ModuleType]] = {
    "pykeops": _top,
    "pykeops.config": _config,
    "keopscore": _keopscore,
    "keopscore.config": _keopscore_config,
}
for _lib in ("torch", "numpy"):
    BUILDERS[f"pykeops.{_lib}"] = _frontend(_lib)
    BUILDERS[f"pykeops.{_lib}.cluster"] = _cluster
    BUILDERS[f"pykeops.{_lib}.operations"] = _operations
    BUILDERS[f"pykeops.{_lib}.generic"] = _generic
    BUILDERS[f"pykeops.{_lib}.lazytensor"] = _lazytensor_module
BUILDERS["pykeops.numpy.utils"] = _numpy_utils
BUILDERS["pykeops.torch.utils"] = _torch_utils
BUILDERS["pykeops.common"] = _common
BUILDERS["pykeops.common.utils"] = _common_utils
BUILDERS["pykeops.common.gpu_utils"] = _gpu_utils

PACKAGES = frozenset({"pykeops", "pykeops.torch", "pykeops.numpy", "pykeops.common", "keopscore"})
