"""The pykeops alias (``lazytensor.compat.pykeops``): the names it serves, its refusal
after the real pykeops, its warnings about clients imported too early, its command line;
and the errors that are ValueErrors as in pykeops (see ``test_keops_api.py`` for the API).
"""

from __future__ import annotations

import sys
import types
import warnings

import numpy as np
import pytest
import torch

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
    assert np_grid_cluster is lazytensor.scale.cluster.grid_cluster
    assert pykeops.__version__ == "2.3" and pykeops.torch is sys.modules["pykeops.torch"]
    assert isinstance(pykeops.config.gpu_available, bool)
    assert pykeops.config.gpu_available == torch.cuda.is_available()


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
    with pytest.raises(ModuleNotFoundError, match="pykeops.common.*provides.*torch.cluster"):
        import pykeops.common.utils  # noqa: F401


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
