"""Inputs and settings that once failed deep inside (or silently): each is refused with an
error naming the argument or the variable, or computed as NumPy defines it.

- sparse torch tensors (COO, CSR) and masked NumPy arrays given to ``Vi``/``Vj``/``Pm``,
  ``LazyTensor`` or a ``Genred`` call: a TypeError naming the argument;
- ``x ** inf`` (and ``** -inf``, ``** nan``): NumPy's values, torch's gradients;
- ``$OMP_STACKSIZE`` / ``$GOMP_STACKSIZE`` read as libgomp reads them (an invalid value,
  a negative one among them, is ignored; OMP_STACKSIZE first);
- ``$LAZYTENSOR_REF_CHUNK`` that is not a positive integer: an error naming it;
- one rule for integer options: ``Genred(axis=...)``, ``KernelSolve(axis=...)`` and a
  reduction's ``dim=`` take ints, NumPy integers and 0-d integer arrays or tensors, and
  refuse floats (``1.0`` too) and booleans.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lazytensor.codegen import compilers

from lazytensor import Genred, KernelSolve, LazyTensor, Pm, Vi, Vj

needs_cxx = pytest.mark.skipif(not compilers.cpu_compiler().available, reason="no C++ compiler")


def _sparse(kind: str, rng):
    x = torch.from_numpy(rng.standard_normal((6, 3)))
    return {"coo": x.to_sparse(), "csr": x.to_sparse_csr()}[kind]


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("kind", ["coo", "csr"])
@pytest.mark.parametrize("maker, name", [(Vi, "Vi's x"), (Vj, "Vj's x"),
                                         (lambda x: LazyTensor(x, axis=0), "Vi's x")])
def test_sparse_tensors_are_refused_naming_the_argument(maker, name, kind, rng):
    with pytest.raises(TypeError, match=rf"{name}: a sparse torch tensor \(layout torch.sparse_{kind}, "
                                        r"shape \(6, 3\)\).*to_dense"):
        maker(_sparse(kind, rng))


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("kind", ["coo", "csr"])
def test_genred_refuses_a_sparse_argument_by_its_position_and_alias(kind, rng):
    red = Genred("SqDist(x, y)", ["x = Vi(3)", "y = Vj(3)"], "Sum", axis=1)
    dense = torch.from_numpy(rng.standard_normal((4, 3)))
    with pytest.raises(TypeError, match=r"argument 1 \(y = Vj\(1, 3\)\): a sparse torch tensor"):
        red(dense, _sparse(kind, rng))


def test_masked_arrays_are_refused(rng):
    x = np.ma.masked_array(rng.standard_normal((5, 2)), mask=rng.random((5, 2)) < 0.5)
    for maker, name in ((Vi, "Vi's x"), (Vj, "Vj's x")):
        with pytest.raises(TypeError, match=rf"{name}: a masked NumPy array \(shape \(5, 2\)\) would "
                                            "lose its mask"):
            maker(x)
    with pytest.raises(TypeError, match="Pm's x: a masked NumPy array"):
        Pm(np.ma.masked_array([1.0, 2.0], mask=[0, 1]))
    red = Genred("SqDist(x, y)", ["x = Vi(2)", "y = Vj(2)"], "Sum", axis=1)
    with pytest.raises(TypeError, match=r"argument 0 \(x = Vi\(0, 2\)\): a masked NumPy array"):
        red(x, rng.standard_normal((3, 2)))


@needs_cxx
@pytest.mark.parametrize("p", [np.inf, -np.inf, np.nan])
def test_power_by_an_infinite_or_nan_exponent_is_numpys(p, rng):
    x = np.concatenate([[0.0, 0.5, 1.0, 2.0, -0.5, -1.0, -2.0, np.inf, -np.inf, np.nan],
                        rng.uniform(-3, 3, 6)])[:, None]
    with np.errstate(all="ignore"):
        want = x ** p
    got = (Vi(x) ** p * Vj(np.ones((1, 1)))).sum(dim=1)
    np.testing.assert_array_equal(got, want)
    tx = torch.tensor(x, requires_grad=True)
    g, = torch.autograd.grad((Vi(tx) ** p * Vj(torch.ones(1, 1, dtype=torch.float64))).sum(dim=1).sum(), [tx])
    td = torch.tensor(x, requires_grad=True)
    w, = torch.autograd.grad((td ** p).sum(), [td])
    torch.testing.assert_close(g, w, equal_nan=True)


@pytest.mark.parametrize("omp, gomp, expected", [
    ("-5M", None, None), (None, "-1", None), ("-5M", "2M", 2 << 20), ("abc", "1G", 1 << 30),
    ("0", None, None), (" 8 k ", None, 8 << 10), ("12", None, 12 << 10), ("3G", "1M", 3 << 30),
    ("5MB", None, None),
])
def test_openmp_stack_sizes_are_read_as_libgomp_reads_them(omp, gomp, expected, monkeypatch):
    from lazytensor.backends.cpu import runtime

    for name, value in (("OMP_STACKSIZE", omp), ("GOMP_STACKSIZE", gomp)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert runtime._omp_stacksize() == expected
    budget = runtime.stack_budget()
    assert 0 < budget <= 6 << 20
    if expected is not None:
        assert budget == min(6 << 20, expected * 3 // 4)


@needs_cxx
def test_a_negative_stack_size_leaves_kernels_running(monkeypatch, rng):
    monkeypatch.setenv("OMP_STACKSIZE", "-5M")
    monkeypatch.setenv("GOMP_STACKSIZE", "-1")
    x, y = rng.standard_normal((30, 3)), rng.standard_normal((40, 3))
    got = (-Vi(x).sqdist(Vj(y))).exp().sum(dim=1)
    np.testing.assert_allclose(got, np.exp(-((x[:, None] - y[None]) ** 2).sum(-1)).sum(1)[:, None],
                               rtol=1e-12)


@pytest.mark.parametrize("value", ["abc", "0", "-3", "1.5"])
def test_reference_chunk_setting_must_be_a_positive_integer(value, monkeypatch, rng):
    monkeypatch.setenv("LAZYTENSOR_REF_CHUNK", value)
    x = rng.standard_normal((5, 2))
    with pytest.raises(ValueError, match=rf"\$LAZYTENSOR_REF_CHUNK must be a positive integer.*'{value}'"):
        Vi(x).sqdist(Vj(x)).sum(dim=1, backend="numpy")


def test_reference_chunk_setting_is_read(monkeypatch, rng):
    monkeypatch.setenv("LAZYTENSOR_REF_CHUNK", "7")  # chunks of one row and a few columns
    x, y = rng.standard_normal((9, 2)), rng.standard_normal((11, 2))
    got = Vi(x).sqdist(Vj(y)).sum(dim=1, backend="numpy")
    np.testing.assert_allclose(got, ((x[:, None] - y[None]) ** 2).sum(-1).sum(1)[:, None], rtol=1e-12)


INTEGERS = [1, np.int64(1), np.int32(1), np.array(1), torch.tensor(1), torch.tensor(1, dtype=torch.int32)]
NOT_INTEGERS = [1.0, np.float64(1.0), torch.tensor(1.0), np.array(1.0), True, "1", None]


@pytest.mark.parametrize("axis", INTEGERS, ids=repr)
def test_integer_axis_and_dim_are_accepted_alike(axis, rng):
    x, y = rng.standard_normal((5, 2)), rng.standard_normal((7, 2))
    want = ((x[:, None] - y[None]) ** 2).sum(-1).sum(1)[:, None]
    red = Genred("SqDist(x, y)", ["x = Vi(2)", "y = Vj(2)"], "Sum", axis=axis)
    assert red.axis == 1 and type(red.axis) is int
    np.testing.assert_allclose(red(x, y, backend="numpy"), want, rtol=1e-12)
    np.testing.assert_allclose(Vi(x).sqdist(Vj(y)).sum(dim=axis, backend="numpy"), want, rtol=1e-12)


@pytest.mark.parametrize("axis", NOT_INTEGERS, ids=repr)
def test_non_integer_axis_and_dim_are_refused_alike(axis, rng):
    x = rng.standard_normal((5, 2))
    with pytest.raises(ValueError, match="axis must be the integer 0 .* or 1"):
        Genred("SqDist(x, y)", ["x = Vi(2)", "y = Vj(2)"], "Sum", axis=axis)
    with pytest.raises(ValueError, match="axis must be the integer 0 .* or 1"):
        KernelSolve("SqDist(x, y) * b", ["x = Vi(2)", "y = Vj(2)", "b = Vj(1)"], "b", axis=axis)
    if axis is not None:
        with pytest.raises(ValueError, match="dim must be an integer"):
            Vi(x).sqdist(Vj(x)).sum(dim=axis)
