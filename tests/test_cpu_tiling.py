"""The CPU kernel's tiled dot products (codegen/cpu/plan.py, codegen/cpu/gemm.py).

For D >= 16, ``⟨x_i, y_j⟩`` and ``|x_i - y_j|²`` come from a packed, register-tiled
matrix product (``|x|² + |y|² - 2⟨x, y⟩``, near-duplicates recomputed directly). These
tests compare it with the float64 NumPy reference over dimensions that are and are not
multiples of the vector width, row counts below, at and above the row block, column
counts across tiles, panels and staged chunks, both precisions, several reductions,
batch dimensions, and points that coincide (where the product form cancels). The
micro-kernel's shape depends on the vector width chosen at compile time, so the AVX2 and
SSE variants are compiled and checked here too when the machine has AVX-512.
"""

from __future__ import annotations

import numpy as np
import pytest
from lazytensor.codegen import compilers

from lazytensor import LazyTensor, Vi, Vj
from lazytensor.backends.cpu import runtime

pytestmark = pytest.mark.skipif(not compilers.cpu_compiler().available, reason="no C++ compiler")

DIMS = (16, 17, 33, 64, 100, 256, 300)
REDUCTIONS = ("gauss_sum", "logsumexp", "argkmin", "min", "dot_sum")


def _shapes(D):
    # (N, M): single pair, rows below a block with columns over a tile, rows over a block
    # with a partial panel, few rows against many columns (split-j), several row blocks
    # over several staged chunks
    return [(1, 1), (7, 129), (129, 7), (5, 4100 if D <= 64 else 700), (300, 517)]


def _points(N, M, D, dtype, seed):
    """x, y with y_j == x_j for a few j and y_j within 1e-3 of x_j for a few more."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, D))
    y = rng.standard_normal((M, D)) + 0.5
    k = min(N, M, 5)
    y[:k] = x[:k]
    if min(N, M) > 2 * k:
        y[k:2 * k] = x[k:2 * k] + 1e-3 * rng.standard_normal((k, D))
    return x.astype(dtype), y.astype(dtype)


def _run(name, x, y, b, backend):
    X, Y = Vi(x), Vj(y)
    s2 = 0.5 * x.shape[-1]
    if name == "gauss_sum":
        return (-X.sqdist(Y) / s2).exp() @ b
    if name == "logsumexp":
        return (-X.sqdist(Y) / s2).logsumexp(dim=1, backend=backend)
    if name == "argkmin":
        return X.sqdist(Y).argKmin(min(3, y.shape[0]), dim=1, backend=backend)
    if name == "min":
        return X.sqdist(Y).min(dim=1, backend=backend)
    if name == "dot_sum":
        return ((X | Y) * Vj(b)).sum(dim=1, backend=backend)
    raise AssertionError(name)


def _check(name, x, y, b, D):
    got = np.asarray(_run(name, x, y, b, "cpu"))
    x64, y64, b64 = (a.astype(np.float64) for a in (x, y, b))
    want = np.asarray(_run(name, x64, y64, b64, "numpy"))
    f32 = x.dtype == np.float32
    if name == "argkmin":
        # ties and near-ties may order differently: the distances must be the k smallest
        d2 = ((x64[:, None, :] - y64[None, :, :]) ** 2).sum(-1)
        picked = np.take_along_axis(d2, got.astype(np.int64), axis=1)
        best = np.sort(d2, axis=1)[:, :got.shape[1]]
        assert np.all(got >= 0) and np.all(got < y.shape[0])
        np.testing.assert_allclose(picked, best, rtol=1e-5 if f32 else 1e-12,
                                   atol=(1e-5 if f32 else 1e-12) * D)
        return
    if name == "min":
        # exact duplicates give exactly 0, near-duplicates keep their relative accuracy
        tol = 2e-5 if f32 else 1e-12
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 1e-4)
        return
    scale = np.abs(want).max() + 1e-30
    tol = (3e-5 if f32 else 1e-12) * (np.sqrt(D) if name == "dot_sum" else 1)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("D", DIMS)
def test_tiled_dot_matches_reference(D, dtype, name):
    for seed, (N, M) in enumerate(_shapes(D)):
        x, y = _points(N, M, D, dtype, seed)
        b = np.random.default_rng(seed).standard_normal((M, 1)).astype(dtype)
        _check(name, x, y, b, D)


@pytest.mark.parametrize("D", [33, 256])
def test_tiled_dot_with_batch_dims(D):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 41, 1, D)).astype(np.float32)
    y = rng.standard_normal((2, 1, 1, 75, D)).astype(np.float32)
    y[1, 0, 0, :5] = x[1, 2, :5, 0]
    b = rng.standard_normal((2, 1, 75, 1)).astype(np.float32)

    def run(xx, yy, bb, backend):
        K = (-LazyTensor(xx).sqdist(LazyTensor(yy)) / D).exp() * LazyTensor(bb[:, :, None])
        return np.asarray(K.sum(dim=3, backend=backend))

    got = run(x, y, b, "cpu")
    want = run(*(a.astype(np.float64) for a in (x, y, b)), "numpy")
    np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-5 * np.abs(want).max())


def test_row_value_operand_and_shared_operand():
    """Dot operands that are expressions (a row value of x, a column of y), and a
    j-variable read both by a dot product and by the pair loop (D = 16 is not wide:
    staged and packed)."""
    rng = np.random.default_rng(3)
    for D in (16, 40):
        x = rng.standard_normal((50, D)).astype(np.float32)
        y = rng.standard_normal((77, D)).astype(np.float32)

        def run(xx, yy, backend, D=D):
            X, Y = Vi(xx), Vj(yy)
            F = (-(X * 2.0 - 1.0).sqdist(Y) / D).exp() * Y + (X | Y) + (X | Y.exp())
            return np.asarray(F.sum(dim=1, backend=backend))

        got = run(x, y, "cpu")
        want = run(x.astype(np.float64), y.astype(np.float64), "numpy")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


class _NarrowCompiler(compilers.CpuCompiler):
    """The system compiler without some instruction sets (another vector width)."""

    def __init__(self, extra):
        super().__init__()
        self.FLAGS = compilers.CpuCompiler.FLAGS + list(extra)


@pytest.mark.parametrize("extra", [("-mno-avx512f",), ("-mno-avx",)], ids=["avx2", "sse"])
def test_narrower_vector_widths(monkeypatch, extra):
    """The micro-kernel's row block and panel follow the vector width: check the others."""
    monkeypatch.setattr(compilers, "cpu_compiler", lambda: _NarrowCompiler(extra))
    monkeypatch.setattr(runtime, "_table", {})
    for D, dtype in ((17, np.float32), (64, np.float64), (256, np.float32)):
        for name in ("gauss_sum", "argkmin"):
            for seed, (N, M) in enumerate([(7, 129), (300, 517)]):
                x, y = _points(N, M, D, dtype, seed)
                b = np.random.default_rng(seed).standard_normal((M, 1)).astype(dtype)
                _check(name, x, y, b, D)
