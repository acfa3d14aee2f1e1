"""The pykeops API that code written for pykeops uses and that was missing or different.

Kron/TensorDot formula strings and the tensordot permutation, Powf as C pow, rsqrt(0) = 0,
Falkon's kernel formulas and call conventions, and the LazyTensor methods (``reduction``,
``unary``/``binary``/``ternary``, symbolic calculus, B-splines, soft-DTW), each against
NumPy, SciPy or dense torch in float64 (float32 where noted).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lazytensor import Genred, LazyTensor, Pm, Vi, Vj

# ------------------------------------------------------------------ Kron and TensorDot


def test_kron_and_tensordot_strings_match_numpy(rng):
    dims_x, dims_y = (2, 3), (3, 2)
    x, y = rng.standard_normal((5, 6)), rng.standard_normal((4, 6))
    kron = Genred("Kron(x, y, [2, 3], [3, 2])", ["x = Vi(6)", "y = Vj(6)"], axis=1)(x, y)
    want = np.array([sum(np.kron(a.reshape(dims_x), b.reshape(dims_y)).ravel() for b in y)
                     for a in x])
    np.testing.assert_allclose(kron, want, rtol=1e-12)
    # x as 2×3, y as 3×2, contract x's axis 1 with y's axis 0, then transpose the result
    td = Genred("TensorDot(x, y, [2, 3], [3, 2], [1], [0], [1, 0])", ["x = Vi(6)", "y = Vj(6)"],
                axis=1)(x, y)
    want = np.array([sum((a.reshape(2, 3) @ b.reshape(3, 2)).T.ravel() for b in y) for a in x])
    np.testing.assert_allclose(td, want, rtol=1e-12)


def test_keops_tensordot_permutation_and_gradients_match_torch(rng):
    x = torch.tensor(rng.standard_normal((3, 2 * 3 * 4)), requires_grad=True)
    y = torch.tensor(rng.standard_normal((5, 4 * 2 * 3)), requires_grad=True)
    perm = (2, 0, 3, 1)  # the result's axis k goes to position perm[k]
    lt = Vi(x).keops_tensordot(Vj(y), (2, 3, 4), (4, 2, 3), (0,), (1,), perm).sum(1)
    # x_i as 2×3×4, y_j as 4×2×3, x's axis 0 against y's axis 1: a (3, 4, 4, 3) result per pair
    t = torch.stack([torch.stack([torch.tensordot(a.reshape(2, 3, 4), b.reshape(4, 2, 3),
                                                  dims=([0], [1])) for b in y]) for a in x])
    want = t.sum(1).permute(0, *(1 + int(k) for k in np.argsort(perm))).reshape(3, -1)
    torch.testing.assert_close(lt, want, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(want)
    gx, gy = torch.autograd.grad((lt * g).sum(), (x, y))
    wx, wy = torch.autograd.grad((want * g).sum(), (x, y))
    torch.testing.assert_close(gx, wx, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(gy, wy, rtol=1e-10, atol=1e-10)


def test_tensordot_rejects_a_bad_permutation():
    x = np.ones((2, 6))
    with pytest.raises(ValueError, match="not a permutation"):
        Vi(x).keops_tensordot(Vj(x), (2, 3), (3, 2), (1,), (0,), (0, 0))


# ------------------------------------------------------------------ Powf, rsqrt, Falkon


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_falkon_polynomial_kernel_is_signed_for_negative_dot_products(dtype, rng):
    """Falkon's formula and call: Pm(1) parameters as (1, 1) tensors, out=, backend="CPU"."""
    X1, X2 = (torch.tensor(rng.standard_normal(s), dtype=dtype) for s in ((40, 3), (30, 3)))
    v = torch.tensor(rng.standard_normal((30, 2)), dtype=dtype)
    gamma, beta, degree = (torch.tensor([[c]], dtype=dtype) for c in (0.7, -0.2, 3.0))
    fn = Genred("Powf((gamma * (X | Y) + beta), degree) * v",
                ["X = Vi(3)", "Y = Vj(3)", "v = Vj(2)", "gamma = Pm(1)", "beta = Pm(1)",
                 "degree = Pm(1)"], reduction_op="Sum", axis=1, dtype_acc="auto",
                sum_scheme="auto", rec_multVar_highdim=None)
    out = torch.empty(40, 2, dtype=dtype)
    got = fn(X1, X2, v, gamma, beta, degree, out=out, backend="CPU")
    K = (0.7 * X1.double() @ X2.double().T - 0.2) ** 3
    assert (K < 0).any() and got is out
    tol = 1e-4 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got.double(), K @ v.double(), rtol=tol, atol=tol)


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
def test_falkon_matern_formulas_match_dense_torch(nu, rng):
    norm = "Norm2(x1 / s - x2 / s)"
    formula = {
        0.5: f"Exp(-{norm}) * v",
        1.5: f"(IntCst(1) + Sqrt(IntCst(3)) * {norm}) * (Exp(-Sqrt(IntCst(3)) * {norm}) * v)",
        2.5: f"((IntCst(1) + Sqrt(IntCst(5)) * {norm} + (IntInv(3) * IntCst(5)) * "
             f"SqNorm2(x1 / s - x2 / s)) * Exp(-Sqrt(IntCst(5)) * {norm})) * v",
    }[nu]
    x1, x2 = torch.tensor(rng.random((20, 2))), torch.tensor(rng.random((25, 2)))
    v, s = torch.tensor(rng.standard_normal((25, 1))), torch.tensor([0.3, 0.5], dtype=torch.float64)
    got = Genred(formula, ["x1 = Vi(2)", "x2 = Vj(2)", "v = Vj(1)", "s = Pm(2)"], axis=1)(
        x1, x2, v, s)
    d = torch.cdist(x1 / s, x2 / s)
    k = {0.5: torch.exp(-d), 1.5: (1 + 3**0.5 * d) * torch.exp(-(3**0.5) * d),
         2.5: (1 + 5**0.5 * d + 5 / 3 * d**2) * torch.exp(-(5**0.5) * d)}[nu]
    torch.testing.assert_close(got, k @ v, rtol=1e-10, atol=1e-12)


def test_rsqrt_of_zero_is_zero_and_distance_gradients_are_finite(rng):
    x = torch.tensor(rng.standard_normal((6, 3)), requires_grad=True)
    zero = Vi(torch.zeros(2, 1)).rsqrt().sum(0, backend="cpu")
    assert zero.tolist() == [[0.0]]
    d = Vi(x).sqdist(Vj(x)).sqrt()  # zero on the diagonal
    (g,) = torch.autograd.grad(d.sum(1).sum(), x)
    (want,) = torch.autograd.grad(torch.cdist(x, x).sum(), x)  # torch: 0 at coincident points
    assert torch.isfinite(g).all()
    torch.testing.assert_close(g, want, rtol=1e-10, atol=1e-12)
    assert (Vi(x) ** -0.5).formula.op == "rsqrt" and (Vi(x) ** 0.5).formula.op == "sqrt"


# ------------------------------------------------------------------ LazyTensor methods


def test_logsumexp_other_is_the_weight(rng):
    x, y, w = rng.random((5, 2)), rng.random((6, 2)), rng.random((6, 3))
    f = -Vi(x).sqdist(Vj(y))
    np.testing.assert_allclose(f.logsumexp(dim=1, other=Vj(w)), f.logsumexp(dim=1, weight=Vj(w)))
    with pytest.raises(ValueError, match="weight once"):
        f.logsumexp(dim=1, other=Vj(w), weight=Vj(w))


@pytest.mark.parametrize("op, extra, method", [
    ("Sum", {}, lambda f: f.sum(1)), ("Min", {}, lambda f: f.min(1)),
    ("ArgKMin", {"opt_arg": 3}, lambda f: f.argKmin(3, 1)),
    ("Max_ArgMax", {}, lambda f: f.max_argmax(1)),
    ("LogSumExp", {}, lambda f: f.logsumexp(1)),
])
def test_reduction_by_pykeops_name_equals_the_named_method(op, extra, method, rng):
    f = -Vi(rng.random((7, 2))).sqdist(Vj(rng.random((9, 2))))
    got, want = f.reduction(op, dim=1, **extra), method(f)
    for a, b in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        np.testing.assert_array_equal(a, b)


def test_reduction_with_weights_and_call_false(rng):
    x, y, w = rng.random((4, 2)), rng.random((5, 2)), rng.random((5, 2))
    f = Vi(x) | Vj(y)
    np.testing.assert_allclose(f.reduction("SumSoftMaxWeight", other=Vj(w), dim=1),
                               f.sumsoftmaxweight(Vj(w), dim=1))
    run = f.reduction("Sum", dim=0, call=False)
    np.testing.assert_allclose(run(), f.sum(0))


def test_shape_and_internal_shape(rng):
    f = LazyTensor(rng.random((3, 4, 1, 2))) * LazyTensor(rng.random((3, 1, 5, 2)))
    assert f._shape == (3, 4, 5, 2) and f.shape == (3, 4, 5, 2)
    g = f.sum(-1)
    assert g._shape == (3, 4, 5, 1) and g.shape == (3, 4, 5)


def test_unary_binary_ternary_by_keops_names(rng):
    x, y = rng.standard_normal((4, 3)), rng.standard_normal((5, 3))
    a, b = Vi(x), Vj(y)
    pairs = [
        (a.unary("Exp"), a.exp()), (a.unary("Pow", opt_arg=3), a ** 3),
        (a.unary("Extract", dimres=2, opt_arg=1, opt_arg2=2), a[1:3]),
        (a.binary(b, "+", is_operator=True), a + b), (a.binary(b, "-", is_operator=True,
                                                               rversion=True), b - a),
        (a.binary(b, "SqDist", dimres=1), a.sqdist(b)),
        (a.binary(b, "Kron", dimres=9, dimcheck=None, opt_arg="[3], [3]"),
         a.keops_kron(b, [3], [3])),
        (a.sqnorm2().binary(Vi(x[:, :1]), "Grad", dimcheck=None, opt_arg=a, opt_pos="middle"),
         a.sqnorm2().grad(a, x[:, :1])),
        (a.ternary(b, b.abs() + 1, "Clamp"), a.clamp(b, b.abs() + 1)),
    ]
    for got, want in pairs:
        np.testing.assert_allclose(got.sum(1), want.sum(1), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="dimres"):
        a.unary("Sum", dimres=3)
    with pytest.raises(ValueError, match="dimcheck"):
        a.binary(Vj(np.ones((5, 2))), "Add")


def test_fixvariables_and_factorizations_keep_the_values(rng):
    x, y = rng.random((4, 2)), rng.random((6, 2))
    d = Vi(x).sqdist(Vj(y))
    f = (-d).exp() * d
    assert f.fixvariables() is None
    np.testing.assert_array_equal(f.factorize(d).sum(1), f.sum(1))
    np.testing.assert_array_equal(f.auto_factorize().sum(1), f.sum(1))


def _dense(x, y):
    """The test formula exp(-|x - y|²) * (x · y) on dense (N, M, D) torch tensors."""
    return torch.exp(-((x - y) ** 2).sum(-1)) * (x * y).sum(-1)


def test_symbolic_calculus_matches_torch_autograd(rng):
    N, M, D = 4, 5, 3
    x = torch.tensor(rng.standard_normal((N, D)))
    y = torch.tensor(rng.standard_normal((M, D)))
    u = torch.tensor(rng.standard_normal((N, D)))
    xi, yj = Vi(x), Vj(y)
    f = (-xi.sqdist(yj)).exp() * (xi | yj)
    vec = (xi - yj) * f  # a D-vector formula for divergence and grad_matrix

    def per_pair(fn):
        out = torch.stack([torch.stack([fn(x[i], y[j], u[i]) for j in range(M)])
                           for i in range(N)])
        return out.reshape(N, M, -1).sum(1)

    def jac(fn, a, b):
        return torch.autograd.functional.jacobian(lambda t: fn(t, b), a)

    def scal(a, b):
        return _dense(a, b)

    def vecf(a, b):
        return (a - b) * _dense(a, b)

    checks = [
        (f.diff(xi, Vi(u)), lambda a, b, t: jac(scal, a, b) @ t),
        (vec.grad_matrix(xi), lambda a, b, t: jac(vecf, a, b).reshape(-1)),
        (vec.divergence(xi), lambda a, b, t: torch.trace(jac(vecf, a, b))),
        (f.laplacian(xi), lambda a, b, t: torch.trace(
            torch.autograd.functional.hessian(lambda s: scal(s, b), a))),
        ((xi * yj * 2.0).trace_operator(xi), lambda a, b, t: 2 * b.sum()),
    ]
    for lt, fn in checks:
        torch.testing.assert_close(lt.sum(1), per_pair(fn), rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="wraps one array"):
        f.laplacian(xi * 2)


def _scipy_bspline_basis(t, k, xs):
    from scipy.interpolate import BSpline

    n = len(t) - k - 1
    return np.stack([BSpline(t, np.eye(n)[i], k, extrapolate=False)(xs) for i in range(n)], -1)


@pytest.mark.parametrize("order, repeated", [(0, True), (1, True), (3, True), (1, False),
                                             (3, False)])
def test_bspline_basis_and_derivative_match_scipy(order, repeated, rng):
    t = np.sort(rng.uniform(0, 4, 9))
    if repeated:
        t[4] = t[3]  # the empty span's weight is 0, not 0/0 (scipy has no derivative there)
    lo, hi = t[order], t[len(t) - order - 1]
    xs = rng.uniform(lo, hi, (12, 1))
    knots = Pm(torch.tensor(t))
    x = torch.tensor(xs, requires_grad=True)
    one = Vj(torch.ones(1, 1, dtype=torch.float64))
    basis = (knots.bspline(Vi(x), order) * one).sum(1)
    want = _scipy_bspline_basis(t, order, xs[:, 0])
    torch.testing.assert_close(basis, torch.tensor(want), rtol=1e-10, atol=1e-12)
    if order > 0 and not repeated:
        from scipy.interpolate import BSpline

        n = len(t) - order - 1
        dwant = np.stack([BSpline(t, np.eye(n)[i], order).derivative()(xs[:, 0])
                          for i in range(n)], -1).sum(-1)
        (dx,) = torch.autograd.grad(basis.sum(), x)
        np.testing.assert_allclose(dx[:, 0].numpy(), dwant, rtol=1e-9, atol=1e-9)


def _softdtw_torch(a, b, gamma):
    n, m = len(a), len(b)
    r = [[None] * m for _ in range(n)]
    for j in range(m):
        for i in range(n):
            c = (a[i] - b[j]) ** 2
            if i == 0 and j == 0:
                r[i][j] = c
            elif j == 0:
                r[i][j] = c + r[i - 1][0]
            elif i == 0:
                r[i][j] = c + r[0][j - 1]
            else:
                prev = torch.stack([r[i - 1][j - 1], r[i - 1][j], r[i][j - 1]])
                r[i][j] = c - gamma * torch.logsumexp(-prev / gamma, 0)
    return r[n - 1][m - 1]


def test_softdtw_value_and_gradients_match_a_dense_dynamic_program(rng):
    x = torch.tensor(rng.standard_normal((3, 5)), requires_grad=True)
    y = torch.tensor(rng.standard_normal((4, 4)), requires_grad=True)
    gamma = torch.tensor([0.3], dtype=torch.float64, requires_grad=True)
    got = Vi(x).softdtw_sqdist(Vj(y), Pm(gamma)).sum(1)
    want = torch.stack([sum(_softdtw_torch(a, b, gamma[0]) for b in y) for a in x])[:, None]
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    g = torch.autograd.grad(got.sum(), (x, y, gamma))
    w = torch.autograd.grad(want.sum(), (x, y, gamma))
    for a, b in zip(g, w):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
