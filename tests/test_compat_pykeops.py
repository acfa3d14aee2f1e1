"""The pykeops alias (``lazytensor.compat.pykeops``): the names it serves, its refusal
after the real pykeops, its warnings about clients imported too early, its command line;
and the errors that are ValueErrors as in pykeops (see ``test_keops_api.py`` for the API).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import sys
import types
import warnings

import numpy as np
import pytest
import torch
from packaging.version import Version

from lazytensor import Genred, LazyTensor, Vi, Vj
from lazytensor.compat import pykeops as alias
from lazytensor.errors import ArgumentTypeError


@pytest.fixture
def installed():
    """The alias for one test; sys.modules as it was afterwards."""
    before = set(sys.modules)
    module = alias.install()
    yield module
    alias.uninstall()
    for name in set(sys.modules) - before:
        if name.partition(".")[0] in ("pykeops", "keopscore"):
            del sys.modules[name]


# ------------------------------------------------------------------ the alias


def test_pykeops_names_are_lazytensor_objects(installed):
    import pykeops
    import pykeops.config
    import pykeops.numpy
    import pykeops.torch
    from pykeops.numpy.cluster import grid_cluster as np_grid_cluster
    from pykeops.torch import Genred as TorchGenred
    from pykeops.torch import KernelSolve, generic_logsumexp
    from pykeops.torch.cluster import from_matrix, sort_clusters, swap_axes  # noqa: F401
    from pykeops.torch.operations import KernelSolve as KernelSolve2

    import lazytensor
    import lazytensor.scale.cluster

    assert pykeops.torch.LazyTensor is lazytensor.LazyTensor
    assert pykeops.numpy.Vi is lazytensor.Vi and TorchGenred is lazytensor.Genred
    assert KernelSolve is KernelSolve2 is lazytensor.KernelSolve
    assert generic_logsumexp is lazytensor.generic_logsumexp
    # each side's grid_cluster as its pykeops module's: anchored at 0 (NumPy), at the minimum (torch)
    assert np_grid_cluster is lazytensor.scale.cluster.grid_cluster_at_origin
    assert pykeops.torch.cluster.grid_cluster is lazytensor.scale.cluster.grid_cluster
    assert pykeops.__version__ == "2.3" and pykeops.torch is sys.modules["pykeops.torch"]
    assert isinstance(pykeops.config.gpu_available, bool)
    assert pykeops.config.gpu_available == torch.cuda.is_available()


def test_the_alias_packages_have_a_file_a_path_and_a_version(installed):
    """Clients check these as on any installed package: ``os.path.dirname(__file__)``,
    ``__path__`` a list of folders, ``__version__`` a version that packaging parses."""
    import keopscore
    import pykeops
    import pykeops.config
    import pykeops.numpy
    import pykeops.torch
    import pykeops.torch.cluster

    for package in (pykeops, pykeops.torch, pykeops.numpy, keopscore):
        assert os.path.isfile(package.__file__), package
        assert isinstance(package.__path__, list) and package.__path__, package
        assert all(os.path.isdir(p) for p in package.__path__), package.__path__
        assert os.path.dirname(package.__file__) in package.__path__
        assert package.__spec__.origin == package.__file__
    for module in (pykeops.config, pykeops.torch.cluster):
        assert os.path.isfile(module.__file__) and not hasattr(module, "__path__")
    assert Version(pykeops.__version__) == Version("2.3") == Version(keopscore.__version__)
    assert importlib.util.find_spec("pykeops").origin == pykeops.__file__
    # a real folder on __path__, and the submodules still come from the alias
    import pykeops.numpy.generic

    assert pykeops.numpy.generic.Genred is Genred
    with pytest.raises(ModuleNotFoundError, match="lazytensor's pykeops alias"):
        import pykeops.pykeops_modules  # noqa: F401  (a file of that folder, not a submodule)


def _real_config_names() -> set:
    """The public names of pykeops 2.3's ``config`` (its assignments, functions and what
    it star-imports from keopscore.config), read from the installed files, not imported."""
    def tree(dist, path):
        return ast.parse(open(importlib.metadata.distribution(dist).locate_file(path)).read())

    try:
        config = tree("pykeops", "pykeops/config.py")
        keopscore_config = tree("keopscore", "keopscore/config/__init__.py")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pykeops 2.3 is not installed (the test extra installs it)")
    names = {t.id for node in config.body if isinstance(node, ast.Assign) for t in node.targets
             if isinstance(t, ast.Name)}
    names |= {node.name for node in config.body if isinstance(node, ast.FunctionDef)}
    for node in keopscore_config.body:  # __all__ = [...]
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__"
                                                for t in node.targets):
            names |= set(ast.literal_eval(node.value))
    return names


def test_pykeops_config_has_the_names_of_pykeops_2_3(installed):
    import keopscore.config
    import pykeops.config
    from lazytensor.cache import default_cache

    # the paths of pykeops's own nvrtc and C++ binaries, and its pybind11 command line:
    # lazytensor builds neither
    not_ours = {"pykeops_nvrtc_name", "pykeops_cpp_name", "python_includes"}
    names = _real_config_names()
    assert {"gpu_available", "cuda_config", "get_build_folder"} <= names  # the file was read
    missing = sorted(n for n in names - not_ours if not hasattr(pykeops.config, n))
    assert not missing, f"pykeops.config lacks {missing}"
    cfg = pykeops.config
    gpu = torch.cuda.is_available()
    assert cfg.gpu_available is cfg.use_cuda is cfg.cuda_config.get_use_cuda() is gpu
    assert cfg.numpy_found and cfg.torch_found and cfg.use_OpenMP is True
    assert (cfg.cuda_version is None) is not gpu
    assert cfg.cuda_config.get_cuda_version() == cfg.cuda_version
    assert cfg.get_build_folder() == cfg.config.get_build_folder()
    assert os.path.isdir(cfg.get_build_folder())
    assert cfg.get_build_folder() == str(default_cache().root)
    for getter in ("get_config", "get_cuda_config", "get_openmp_config", "get_platform_config"):
        assert getattr(cfg, getter)() is getattr(keopscore.config, getter)()
    # one set of objects, as pykeops.config re-exports keopscore.config's
    assert cfg.config is cfg.pykeops_base is keopscore.config.config
    keopscore.config.cuda_config.n_gpus = 7
    assert cfg.pykeops_cuda.n_gpus == 7


def test_cuda_version_forms_as_keopscore_gives_them():
    from lazytensor.compat.pykeops_modules import _Flags

    flags = _Flags(cuda_version=12040)
    assert flags.get_cuda_version() == 12040
    assert flags.get_cuda_version("major,minor") == (12, 4)
    assert flags.get_cuda_version("string") == "12.4"
    assert Version(flags.get_cuda_version("string")) == Version("12.4")
    assert _Flags(cuda_version=None).get_cuda_version("string") is None


def test_complex_lazytensor_is_lazytensors(installed, rng):
    from pykeops.numpy import ComplexLazyTensor
    from pykeops.torch import ComplexLazyTensor as TorchComplexLazyTensor

    import lazytensor

    assert ComplexLazyTensor is TorchComplexLazyTensor is lazytensor.ComplexLazyTensor
    z = rng.standard_normal((3, 1, 2)) + 1j * rng.standard_normal((3, 1, 2))
    w = rng.standard_normal((1, 4, 2)) + 1j * rng.standard_normal((1, 4, 2))
    got = (ComplexLazyTensor(z) * ComplexLazyTensor(w)).sum(-1).sum(dim=1)
    np.testing.assert_allclose(got, (z * w).sum(-1).sum(1)[:, None], rtol=1e-12)


def test_keopscore_flags_that_clients_set(installed):
    import keopscore
    import keopscore.config

    keopscore.auto_factorize = False  # pykeops's tests
    keopscore.config.config.use_cuda = False  # Falkon
    assert hasattr(keopscore.config, "config") and keopscore.config.config.get_use_cuda() is False


def test_bindings_checks_run_on_lazytensor(installed, capsys):
    installed.test_numpy_bindings()
    installed.test_torch_bindings()
    assert capsys.readouterr().out.count("bindings is working! (lazytensor)") == 2


def test_an_unknown_submodule_says_what_the_alias_covers(installed):
    with pytest.raises(ModuleNotFoundError, match="pykeops.common.keops_io.*provides.*torch.cluster"):
        import pykeops.common.keops_io  # noqa: F401


def test_install_refuses_after_the_real_pykeops(monkeypatch):
    real = types.ModuleType("pykeops")
    real.__file__ = "/site-packages/pykeops/__init__.py"
    monkeypatch.setitem(sys.modules, "pykeops", real)
    with pytest.raises(alias.PykeopsAlreadyImported, match="before importing pykeops"):
        alias.install()
    assert not alias.installed()
    with pytest.raises(ImportError):  # the refusal is an ImportError too
        alias.install()


def test_install_warns_about_a_client_that_found_no_pykeops(monkeypatch):
    early = types.ModuleType("geomloss._backends.keops")
    early.keops_available = False
    monkeypatch.setitem(sys.modules, "geomloss._backends.keops", early)
    try:
        with pytest.warns(RuntimeWarning, match="geomloss._backends.keops was imported before"):
            alias.install()
    finally:
        alias.uninstall()


def test_install_is_idempotent_and_uninstall_removes_every_alias():
    first = alias.install()
    try:
        assert alias.install() is first
        import pykeops.torch.cluster  # noqa: F401
    finally:
        alias.uninstall()
    assert not any(n.partition(".")[0] == "pykeops" for n in sys.modules)
    assert not alias.installed()


def test_python_m_lazytensor_compat_prints_the_usage(capsys):
    from lazytensor.compat.__main__ import main

    assert main([]) == 0
    out = capsys.readouterr().out
    assert "lazytensor.compat.pykeops.install()" in out and "pykeops.torch.cluster" in out


# ------------------------------------------------------------------ errors


def test_argument_errors_are_value_errors_too(rng):
    fn = Genred("x * y", ["x = Vi(1)", "y = Vj(1)"], axis=1)
    with pytest.raises(ValueError, match="expected 2 arrays"):  # pykeops raises ValueError
        fn(np.ones((3, 1)))
    with pytest.raises(TypeError, match="expected 2 arrays"):
        fn(np.ones((3, 1)))
    with pytest.raises(ArgumentTypeError, match="cannot mix NumPy arrays and torch"):
        fn(np.ones((3, 1)), torch.ones(4, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="mixed dtypes"):
        (Vi(np.ones((3, 1))) * Vj(np.ones((3, 1), dtype=np.float32))).sum(1)
    with pytest.raises(ValueError, match="cannot wrap"):
        LazyTensor(object())


def test_no_warning_from_the_alias_on_a_clean_install():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        alias.install()
        alias.uninstall()
