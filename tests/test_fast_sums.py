"""Sums to a tolerance (lazytensor.fastsum): the contract against float64 brute force.

For every output row i and channel e, |s̃_ie − s_ie| ≤ tol · sup|K| · Σ_j |b_je| (relative
ℓ2 error tol for Coulomb), checked on random rows against the same formula summed exactly
in float64 (tol=None) on those rows; point sets uniform, clustered and on a surface in
the unit cube, D = 1, 2, 3, bandwidths from 0.01 to 2.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import lazytensor
from lazytensor import LazyTensor, Vi, Vj

pytest.importorskip("finufft")

N = 12000  # targets and sources: enough pairs that brute force is not the choice
ROWS = 40


def points(rng, kind: str, n: int, D: int) -> np.ndarray:
    if kind == "uniform":
        return rng.random((n, D))
    if kind == "clustered":
        centers = rng.random((6, D))
        x = centers[rng.integers(6, size=n)] + 0.03 * rng.standard_normal((n, D))
        return np.clip(x, 0.0, 1.0)
    # on a surface: a circle (D = 2) or a sphere (D = 3) of radius 0.45 about the center
    v = rng.standard_normal((n, D))
    return 0.5 + 0.45 * v / np.linalg.norm(v, axis=1, keepdims=True)


def kernels(h):
    """name -> (K(xi, yj), sup|K| on the unit cube (None: unbounded at 0))."""
    return {
        "gaussian": (lambda a, b: (-a.sqdist(b) / (h * h)).exp(), 1.0),
        "laplacian": (lambda a, b: (-(a - b).norm2() / h).exp(), 1.0),
        "cauchy": (lambda a, b: 1 / (1 + a.sqdist(b) / h ** 2), 1.0),
        "imq": (lambda a, b: (1 + a.sqdist(b) / h ** 2).rsqrt(), 1.0),
        "matern32": (lambda a, b: (1 + math.sqrt(3) * (a - b).norm2() / h)
                     * (-math.sqrt(3) * (a - b).norm2() / h).exp(), 1.0),
        "matern52": (lambda a, b: (1 + math.sqrt(5) * (a - b).norm2() / h
                                   + 5 * a.sqdist(b) / (3 * h ** 2))
                     * (-math.sqrt(5) * (a - b).norm2() / h).exp(), 1.0),
        "energy": (lambda a, b: -(a - b).norm2(), None),
        "coulomb": (lambda a, b: 1 / (a - b).norm2(), None),
    }


def exact_rows(kernel, x, y, b, rows):
    """Σ_j K(x_i, y_j) b_j for i in rows, exact in float64 (tol=None)."""
    K = kernel(Vi(x[rows].astype(np.float64)), Vj(y.astype(np.float64)))
    return K @ b.astype(np.float64)


def check_contract(approx, exact, b, sup, tol, rows):
    approx = np.asarray(approx, dtype=np.float64)[rows]
    if sup is None:  # relative ℓ2 error per channel
        err = np.linalg.norm(approx - exact, axis=0) / np.linalg.norm(exact, axis=0)
        assert np.all(err <= tol), (err, tol)
        return err.max() / tol
    bound = tol * sup * np.abs(b).sum(0)
    err = np.abs(approx - exact).max(0)
    assert np.all(err <= bound), (err / bound, tol)
    return (err / bound).max()


@pytest.mark.parametrize("D, kind, h, tol, dtype", [
    (3, "uniform", 0.2, 1e-6, np.float64),
    (3, "clustered", 0.05, 1e-3, np.float64),
    (3, "surface", 0.01, 1e-6, np.float64),
    (3, "uniform", 2.0, 1e-6, np.float32),
    (2, "surface", 0.1, 1e-6, np.float64),
    (2, "clustered", 0.02, 1e-3, np.float32),
    (2, "uniform", 1.0, 1e-3, np.float64),
    (1, "uniform", 0.01, 1e-6, np.float64),
    (1, "clustered", 0.5, 1e-6, np.float32),
])
def test_gaussian_contract(rng, D, kind, h, tol, dtype):
    x, y = points(rng, kind, N, D).astype(dtype), points(rng, kind, N + 7, D).astype(dtype)
    b = rng.standard_normal((N + 7, 2)).astype(dtype)
    kernel, sup = kernels(h)["gaussian"]
    K = kernel(Vi(x), Vj(y))
    choice = lazytensor.explain(K, b, tol=tol)
    assert choice.method != "exact", choice
    approx = K.__matmul__(b, tol=tol)
    assert approx.dtype == dtype and approx.shape == (N, 2)
    rows = rng.choice(N, ROWS, replace=False)
    check_contract(approx, exact_rows(kernel, x, y, b, rows), b, sup, tol, rows)


@pytest.mark.parametrize("name, D, kind, h, tol", [
    ("laplacian", 3, "uniform", 0.2, 1e-3),
    ("laplacian", 2, "clustered", 0.05, 1e-5),
    ("laplacian", 2, "uniform", 1.0, 1e-3),
    ("cauchy", 2, "uniform", 0.3, 1e-6),
    ("cauchy", 2, "surface", 0.05, 1e-3),
    ("imq", 2, "surface", 0.5, 1e-6),
    ("matern32", 2, "uniform", 0.2, 1e-3),
    ("matern52", 2, "clustered", 0.1, 1e-5),
    ("energy", 2, "uniform", None, 1e-4),
    ("coulomb", 3, "uniform", None, 1e-3),
    ("coulomb", 2, "clustered", None, 1e-5),
])
def test_other_kernels_contract(rng, name, D, kind, h, tol):
    x, y = points(rng, kind, N, D), points(rng, kind, N, D)
    b = rng.random((N, 1)) if name == "coulomb" else rng.standard_normal((N, 1))
    kernel, sup = kernels(h)[name]
    if name == "energy":
        sup = float(np.linalg.norm(np.maximum(x.max(0), y.max(0)) - np.minimum(x.min(0),
                                                                             y.min(0))))
    K = kernel(Vi(x), Vj(y))
    approx = K.__matmul__(b, tol=tol)
    rows = rng.choice(N, ROWS if sup is not None else 400, replace=False)
    check_contract(approx, exact_rows(kernel, x, y, b, rows), b, sup, tol, rows)


@pytest.mark.parametrize("method, name, h", [
    ("truncation", "gaussian", 0.03), ("spectral", "gaussian", 0.3),
    ("split", "gaussian", 0.1), ("spectral", "cauchy", 0.5),
    ("split", "laplacian", 0.1), ("truncation", "laplacian", 0.01),
])
def test_each_method_holds_the_contract(rng, method, name, h):
    D, tol = 2, 1e-5
    x, y, b = rng.random((N, D)), rng.random((N, D)), rng.standard_normal((N, 1))
    kernel, sup = kernels(h)[name]
    K = kernel(Vi(x), Vj(y))
    with lazytensor.options(tol=tol, method=method):
        assert lazytensor.explain(K, b).method == method
        approx = K @ b
    rows = rng.choice(N, ROWS, replace=False)
    check_contract(approx, exact_rows(kernel, x, y, b, rows), b, sup, tol, rows)


NG = 6000  # points of the gradient tests


def _torch_case(rng, name, h, D, dtype):
    import torch

    x = torch.tensor(rng.random((NG, D)), dtype=dtype, requires_grad=True)
    y = torch.tensor(rng.random((NG, D)), dtype=dtype, requires_grad=True)
    b = torch.tensor(rng.standard_normal((NG, 2)), dtype=dtype, requires_grad=True)
    g = torch.tensor(rng.standard_normal((NG, 2)), dtype=dtype)
    return x, y, b, g, kernels(h)[name][0]


def _exact_grads(kernel, x, y, b, g, rows, cols):
    """∂⟨g, s⟩ with respect to x (rows), y and b (cols), exact in float64."""
    import torch

    xd, yd, bd, gd = (t.detach().double() for t in (x, y, b, g))
    xr = xd[rows].clone().requires_grad_(True)
    (kernel(Vi(xr), Vj(yd)) @ bd * gd[rows]).sum().backward()
    yc, bc = yd[cols].clone().requires_grad_(True), bd[cols].clone().requires_grad_(True)
    (kernel(Vi(xd), Vj(yc)) @ bc * gd).sum().backward()
    return xr.grad, yc.grad, bc.grad, torch


@pytest.mark.parametrize("name, h, D, dtype, tol", [
    ("gaussian", 0.2, 2, "float64", 1e-6),   # spectral
    ("gaussian", 0.02, 2, "float32", 1e-4),  # truncation
    ("laplacian", 0.2, 2, "float64", 1e-5),  # split
])
def test_gradients_hold_the_contract(rng, name, h, D, dtype, tol):
    import torch

    x, y, b, g, kernel = _torch_case(rng, name, h, D, getattr(torch, dtype))
    s = kernel(Vi(x), Vj(y)).__matmul__(b, tol=tol)
    assert s.dtype == getattr(torch, dtype)
    (s * g).sum().backward()
    rows, cols = rng.choice(NG, ROWS, replace=False), rng.choice(NG, ROWS, replace=False)
    gx, gy, gb, _ = _exact_grads(kernel, x, y, b, g, rows, cols)
    bn = b.detach().double().abs().sum(0)
    # w.r.t. b: the transposed sum, bound tol · sup|K| · Σ_i |g_i|
    err_b = (b.grad.double()[cols] - gb).abs().max(0).values
    assert torch.all(err_b <= tol * g.double().abs().sum(0)), err_b
    # w.r.t. x_i: tol · sup|∂K| · Σ_e |g_ie| Σ_j |b_je| (sup|∂K| from the profile's samples)
    r = np.linspace(0, 2 * math.sqrt(D), 200001)
    t = torch.tensor(r[:, None] * np.eye(D)[:1], dtype=torch.float64, requires_grad=True)
    k = kernel(Vi(t), Vj(torch.zeros(1, D, dtype=torch.float64))).sum(1)
    grad_sup = torch.autograd.grad(k.sum(), t)[0].abs().max().item()
    bound_x = tol * grad_sup * (g.double().abs()[rows] * bn).sum(1)
    assert torch.all((x.grad.double()[rows] - gx).abs().max(1).values <= bound_x)
    bound_y = tol * grad_sup * (b.detach().double().abs()[cols] * g.double().abs().sum(0)).sum(1)
    assert torch.all((y.grad.double()[cols] - gy).abs().max(1).values <= bound_y)


@pytest.mark.parametrize("case", ["i_weight", "non_radial", "high_d", "branch", "batch",
                                  "small", "coulomb_grad"])
def test_non_qualifying_sums_are_exact(rng, case):
    import torch

    n = 3000
    x, y, b = rng.random((n, 3)), rng.random((n, 3)), rng.standard_normal((n, 1))
    r2 = lambda: Vi(x).sqdist(Vj(y))  # noqa: E731
    K, v = {
        "i_weight": lambda: ((-r2()).exp() * Vi(rng.random((n, 1))), b),
        "non_radial": lambda: ((-(Vi(x) - Vj(y)).abs().sum(-1)).exp(), b),
        "high_d": lambda: ((-Vi(rng.random((n, 5))).sqdist(Vj(rng.random((n, 5))))).exp(), b),
        "branch": lambda: ((1 - r2() * 10).relu(), b),
        "batch": lambda: ((-LazyTensor(rng.random((2, n, 1, 3))).sqdist(
            LazyTensor(rng.random((2, 1, n, 3))))).exp(), rng.standard_normal((2, n, 1))),
        "small": lambda: ((-Vi(x[:50]).sqdist(Vj(y[:60]))).exp(), b[:60]),
        "coulomb_grad": lambda: (1 / (Vi(torch.tensor(x, requires_grad=True))
                                      - Vj(torch.tensor(y))).norm2(), torch.tensor(b)),
    }[case]()
    choice = lazytensor.explain(K, v, dim=K.nbatchdims + 1, tol=1e-6)
    assert choice.method == "exact" and choice.reason, choice
    got, want = K.__matmul__(v, tol=1e-6), K @ v
    assert type(got) is type(want)
    if isinstance(got, torch.Tensor):
        got, want = got.detach().numpy(), want.detach().numpy()
    np.testing.assert_array_equal(got, want)


def test_the_choice_is_deterministic(rng):
    x, y, b = rng.random((N, 3)), rng.random((N, 3)), rng.standard_normal((N, 1))
    for h in (0.01, 0.1, 1.0):
        K = (-Vi(x).sqdist(Vj(y)) / h ** 2).exp()
        first = lazytensor.explain(K, b, tol=1e-6)
        again = lazytensor.explain((-Vi(x.copy()).sqdist(Vj(y.copy())) / h ** 2).exp(), b.copy(),
                                   tol=1e-6)
        assert (first.method, first.params, first.bound) == (again.method, again.params,
                                                             again.bound)
        assert str(first).startswith(first.method)


def test_options_genred_and_sums_over_i(rng):
    x, y, b = rng.random((N, 2)), rng.random((N + 3, 2)), rng.standard_normal((N, 1))
    gauss = lazytensor.Genred("Exp(-SqDist(x, y) * g) * b", ["x = Vi(2)", "y = Vj(2)",
                              "b = Vi(1)", "g = Pm(1)"], axis=0, tol=1e-6)
    got = gauss(x, y, b, np.array([40.0]))  # Σ_i over the i-variables, for each y_j
    cols = rng.choice(N + 3, ROWS, replace=False)
    want = np.exp(-40 * ((y[cols][:, None] - x[None]) ** 2).sum(-1)) @ b
    assert np.abs(got[cols] - want).max() <= 1e-6 * np.abs(b).sum()
    K = (-Vi(x).sqdist(Vj(y)) * 40).exp()
    with lazytensor.options(tol=1e-6):
        t = (K * Vi(b)).sum(dim=0)
    assert np.abs(t[cols] - want).max() <= 1e-6 * np.abs(b).sum()
    assert lazytensor.explain(K * Vi(b), dim=0, tol=1e-6).method != "exact"


def test_bad_tolerances_are_refused(rng):
    x = rng.random((100, 2)).astype(np.float32)
    K = (-Vi(x).sqdist(Vj(x))).exp()
    b = np.ones((100, 1), np.float32)
    for bad in (0, 1.5, -1e-3, "1e-3", float("nan"), True):
        with pytest.raises(ValueError, match="tol must be a number in"):
            K.__matmul__(b, tol=bad)
    with pytest.raises(ValueError, match="float32"):
        lazytensor.explain(K, b, tol=1e-8)
    with pytest.raises(ValueError, match="Sum reductions only"):
        K.min(dim=1, tol=1e-3)
    ranges = lazytensor.scale.cluster.from_matrix(np.array([[0, 100]]), np.array([[0, 100]]),
                                                  np.ones((1, 1), bool))
    with pytest.raises(ValueError, match="ranges="):
        K.sum(dim=1, ranges=ranges, tol=1e-3)
    with pytest.raises(ValueError, match="method must be one of"):
        with lazytensor.options(tol=1e-3, method="fmm"):
            pass
    with pytest.raises(ValueError, match="does not apply"):
        with lazytensor.options(tol=1e-3, method="spectral"):
            lazytensor.explain((-(Vi(x) - Vj(x)).norm2()).exp(), b)


def test_without_finufft_truncation_or_exact(rng, monkeypatch, caplog):
    from lazytensor.fastsum import run

    monkeypatch.setattr(run, "finufft_available", lambda: False)
    run._PLANS.clear()
    run._said.clear()
    x, b = rng.random((N, 2)), rng.standard_normal((N, 1))
    K = (-Vi(x).sqdist(Vj(x)) / 0.02 ** 2).exp()
    with caplog.at_level("INFO", logger="lazytensor"):
        choice = lazytensor.explain(K, b, tol=1e-6)
    assert choice.method in ("truncation", "exact")
    assert "finufft is not installed" in caplog.text
    rows = rng.choice(N, ROWS, replace=False)
    approx = K.__matmul__(b, tol=1e-6)
    run._PLANS.clear()
    kernel = kernels(0.02)["gaussian"][0]
    check_contract(approx, exact_rows(kernel, x, x, b, rows), b, 1.0, 1e-6, rows)


def test_torch_and_numpy_agree_and_the_log_says_the_choice(rng, caplog):
    import torch

    x, y, b = rng.random((N, 3)), rng.random((N, 3)), rng.standard_normal((N, 1))
    K = (-Vi(x).sqdist(Vj(y)) / 0.04).exp()
    with caplog.at_level("DEBUG", logger="lazytensor"):
        a = K.__matmul__(b, tol=1e-6)
    assert "sum to tol=1e-06: spectral" in caplog.text
    Kt = (-Vi(torch.tensor(x)).sqdist(Vj(torch.tensor(y))) / 0.04).exp()
    t = Kt.__matmul__(torch.tensor(b), tol=1e-6)
    assert isinstance(t, torch.Tensor)
    np.testing.assert_allclose(t.numpy(), a, atol=1e-6 * np.abs(b).sum())


@pytest.mark.parametrize("method, h, wrt", [(None, 0.2, "x"), ("truncation", 0.03, "x"),
                                            ("spectral", 0.1, "y")])
def test_numpy_gradients_hold_the_contract(rng, method, h, wrt):
    """pykeops's gradients in NumPy: ``K.grad(x, g).sum(dim=1, tol=...)`` (over i for y)."""
    D, E, tol, n = 2, 2, 1e-5, 8000
    x, y = rng.random((n, D)), rng.random((n, D))
    b, g = rng.standard_normal((n, E)), rng.standard_normal((n, E))
    K = (-Vi(x).sqdist(Vj(y)) / h ** 2).exp() * Vj(b)
    G = K.grad(Vi(x), g) if wrt == "x" else K.grad(Vj(y), g)
    dim = 1 if wrt == "x" else 0
    with lazytensor.options(tol=tol, method=method):
        assert lazytensor.explain(G, dim=dim).method != "exact"
        got = G.sum(dim=dim)
    rows = rng.choice(n, ROWS, replace=False)
    a, c, wa, wc = (x, y, g, b) if wrt == "x" else (y, x, b, g)
    z = a[rows][:, None] - c[None]
    k = np.exp(-(z ** 2).sum(-1) / h ** 2)
    want = np.einsum("nmd,nm->nd", z * (-2 / h ** 2) * k[..., None], wa[rows] @ wc.T)
    grad_sup = 2 / h ** 2 * h / math.sqrt(2) * math.exp(-0.5)  # sup_r 2r/h² e^{-r²/h²}
    bound = tol * grad_sup * (np.abs(wa[rows]) @ np.abs(wc).sum(0))
    assert np.all(np.abs(got[rows] - want).max(1) <= bound)
