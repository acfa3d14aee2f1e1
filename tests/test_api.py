"""The LazyTensor API as pykeops users write it, against dense NumPy/torch computations.

The many small formulas of ``EXPRESSIONS`` (operators with Python numbers, powers,
indexing, norms, math methods) are concatenated into one vector formula, so that one
kernel per dtype checks them all; each expression is then checked on its own components.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
from lazytensor.codegen.compilers import cpu_compiler

from lazytensor import LazyTensor, Pm, Vi, Vj

pytestmark = pytest.mark.skipif(not cpu_compiler().available, reason="no C++ compiler")

N, M = 29, 43


def _spd(rng):
    a = rng.standard_normal((3, 3))
    return (a @ a.T + np.eye(3)).reshape(-1)


# name: (LazyTensor expression of (X, Y, P, S), dense NumPy twin of (x, y, p, s) over (N, M, .))
# fmt: off
EXPRESSIONS = {
    "add_float": (lambda X, Y, P, S: X + 2.5 + Y, lambda x, y, p, s: x + 2.5 + y),
    "radd_float": (lambda X, Y, P, S: 2.5 + Y * X, lambda x, y, p, s: 2.5 + y * x),
    "sub_int": (lambda X, Y, P, S: X - 2 - Y, lambda x, y, p, s: x - 2 - y),
    "rsub_int": (lambda X, Y, P, S: 2 - Y * X, lambda x, y, p, s: 2 - y * x),
    "rsub_float": (lambda X, Y, P, S: 0.25 - Y / X, lambda x, y, p, s: 0.25 - y / x),
    "mul_float": (lambda X, Y, P, S: X * 1.5 * Y, lambda x, y, p, s: x * 1.5 * y),
    "rmul_int": (lambda X, Y, P, S: 3 * Y - X, lambda x, y, p, s: 3 * y - x),
    "div_float": (lambda X, Y, P, S: (X + Y) / 4.0, lambda x, y, p, s: (x + y) / 4.0),
    "div_int": (lambda X, Y, P, S: (X - Y) / 3, lambda x, y, p, s: (x - y) / 3),
    "rdiv_int": (lambda X, Y, P, S: 1 / (Y + X), lambda x, y, p, s: 1 / (y + x)),
    "rdiv_float": (lambda X, Y, P, S: 2.5 / X - Y, lambda x, y, p, s: 2.5 / x - y),
    "neg": (lambda X, Y, P, S: -X + Y, lambda x, y, p, s: -x + y),
    "neg_neg": (lambda X, Y, P, S: -(-(X * Y)), lambda x, y, p, s: x * y),  # noqa: B002
    "pow2": (lambda X, Y, P, S: (X - Y) ** 2, lambda x, y, p, s: (x - y) ** 2),
    "pow3": (lambda X, Y, P, S: (X - Y) ** 3, lambda x, y, p, s: (x - y) ** 3),
    "pow0": (lambda X, Y, P, S: (X - Y) ** 0 + Y, lambda x, y, p, s: 1 + y + 0 * x),
    "pow1": (lambda X, Y, P, S: (X - Y) ** 1, lambda x, y, p, s: x - y),
    "pow_half": (lambda X, Y, P, S: (X + Y) ** 0.5, lambda x, y, p, s: np.sqrt(x + y)),
    "pow_mhalf": (lambda X, Y, P, S: (X * Y) ** -0.5, lambda x, y, p, s: 1 / np.sqrt(x * y)),
    "pow_float": (lambda X, Y, P, S: (X + Y) ** 1.7, lambda x, y, p, s: (x + y) ** 1.7),
    "pow_neg_int": (lambda X, Y, P, S: (X + Y) ** -2, lambda x, y, p, s: (x + y) ** -2.0),
    "pow_lazy": (lambda X, Y, P, S: X ** Y, lambda x, y, p, s: x ** y),
    "rpow": (lambda X, Y, P, S: 2 ** (X - Y), lambda x, y, p, s: 2.0 ** (x - y)),
    "dot": (lambda X, Y, P, S: X | Y, lambda x, y, p, s: (x * y).sum(-1, keepdims=True)),
    "rdot": (lambda X, Y, P, S: (X * 2) | (Y - 1), lambda x, y, p, s: (2 * x * (y - 1)).sum(-1, keepdims=True)),
    "getitem": (lambda X, Y, P, S: X[1] * Y[-1], lambda x, y, p, s: x[..., 1:2] * y[..., 2:3]),
    "getslice": (lambda X, Y, P, S: X[0:2] * Y[1:3], lambda x, y, p, s: x[..., 0:2] * y[..., 1:3]),
    "getslice_open": (lambda X, Y, P, S: X[1:] - Y[:2], lambda x, y, p, s: x[..., 1:] - y[..., :2]),
    "concat": (lambda X, Y, P, S: X.concat(Y[0] * X[2]), lambda x, y, p, s: _cat(x, y[..., :1] * x[..., 2:3])),
    "sqnorm2": (lambda X, Y, P, S: (X - Y).sqnorm2(), lambda x, y, p, s: ((x - y) ** 2).sum(-1, keepdims=True)),
    "norm2": (lambda X, Y, P, S: (X - Y).norm2(), lambda x, y, p, s: np.sqrt(((x - y) ** 2).sum(-1, keepdims=True))),
    "norm": (lambda X, Y, P, S: (X + Y).norm(-1), lambda x, y, p, s: np.sqrt(((x + y) ** 2).sum(-1, keepdims=True))),
    "normalize": (lambda X, Y, P, S: (X + Y).normalize(),
                  lambda x, y, p, s: (x + y) / np.sqrt(((x + y) ** 2).sum(-1, keepdims=True))),
    "sqdist": (lambda X, Y, P, S: X.sqdist(Y), lambda x, y, p, s: ((x - y) ** 2).sum(-1, keepdims=True)),
    "wsqnorm_scalar": (lambda X, Y, P, S: (X - Y).weightedsqnorm(P[0]),
                       lambda x, y, p, s: p[0] * ((x - y) ** 2).sum(-1, keepdims=True)),
    "wsqnorm_diag": (lambda X, Y, P, S: (X - Y).weightedsqnorm(P),
                     lambda x, y, p, s: (p * (x - y) ** 2).sum(-1, keepdims=True)),
    "wsqnorm_full": (lambda X, Y, P, S: (X - Y).weightedsqnorm(S),
                     lambda x, y, p, s: np.einsum("...k,kl,...l->...", x - y, s.reshape(3, 3), x - y)[..., None]),
    "weightedsqdist": (lambda X, Y, P, S: X.weightedsqdist(Y, P),
                       lambda x, y, p, s: (p * (x - y) ** 2).sum(-1, keepdims=True)),
    "sum_minus1": (lambda X, Y, P, S: (X * Y).sum(-1), lambda x, y, p, s: (x * y).sum(-1, keepdims=True)),
    "sum_dim2": (lambda X, Y, P, S: (X * Y).sum(2), lambda x, y, p, s: (x * y).sum(-1, keepdims=True)),
    "sum_axis": (lambda X, Y, P, S: (X - Y).sum(axis=-1), lambda x, y, p, s: (x - y).sum(-1, keepdims=True)),
    "vmin_vmax": (lambda X, Y, P, S: (X - Y).min(-1).concat((X * Y).max(dim=2)),
                  lambda x, y, p, s: np.concatenate([(x - y).min(-1, keepdims=True),
                                                     (x * y).max(-1, keepdims=True)], -1)),
    "vargmin_vargmax": (lambda X, Y, P, S: (X - Y).argmin(-1).concat((X * Y).argmax(axis=-1)),
                        lambda x, y, p, s: np.concatenate([(x - y).argmin(-1)[..., None],
                                                           (x * y).argmax(-1)[..., None]], -1) * 1.0),
    "param": (lambda X, Y, P, S: X * P + Y, lambda x, y, p, s: x * p + y),
    "param_float": (lambda X, Y, P, S: X * Pm(0.75) - Y * P[1:2],
                    lambda x, y, p, s: 0.75 * x - p[1] * y),
    "abs_builtin": (lambda X, Y, P, S: abs(X - Y), lambda x, y, p, s: np.abs(x - y)),
    "math_methods": (
        lambda X, Y, P, S: (X - Y).exp() + (X * Y).log() + (X - Y).sin() * (X + Y).cos()
        + (X - Y).abs().sqrt() + (X - Y).relu() + (X - Y).sign() + (X - Y).step()
        + (X - Y).sigmoid() + (X - Y).softplus() + (X - Y).tanh() + (X + Y).inv()
        + (X * Y).rsqrt() + (X - Y).atan() + (X - Y).square() + (X - Y).erf(),
        lambda x, y, p, s: np.exp(x - y) + np.log(x * y) + np.sin(x - y) * np.cos(x + y)
        + np.sqrt(np.abs(x - y)) + np.maximum(x - y, 0) + np.sign(x - y) + (x - y >= 0)
        + 1 / (1 + np.exp(y - x)) + np.logaddexp(0, x - y) + np.tanh(x - y) + 1 / (x + y)
        + 1 / np.sqrt(x * y) + np.arctan(x - y) + (x - y) ** 2 + _erf(x - y)),
    "rounding": (lambda X, Y, P, S: (4 * (X - Y)).round() + (3 * X * Y).floor() + (2 * Y - X).ceil()
                 + (X - Y).round(1) + (X - Y).mod(0.25, 0.125),
                 lambda x, y, p, s: _round(4 * (x - y)) + np.floor(3 * x * y) + np.ceil(2 * y - x)
                 + _round(10 * (x - y)) / 10 + (x - y) - 0.25 * np.floor((x - y - 0.125) / 0.25)),
    "clamp_ifelse": (lambda X, Y, P, S: (X - Y).clamp(-0.2, 0.3) + (X - Y).ifelse(X, Y * 2)
                     + (X - Y).clampint(0, 1),
                     lambda x, y, p, s: np.clip(x - y, -0.2, 0.3) + np.where(x - y >= 0, x, 2 * y)
                     + np.clip(x - y, 0, 1)),
    "comparisons": (lambda X, Y, P, S: (X < Y) + 2 * (X >= 1.0) + 4 * (Y <= X) + 8 * (X > 0.9)
                    + 16 * (X == X) + 32 * (X != Y),  # noqa: PLR0124
                    lambda x, y, p, s: 1.0 * (x < y) + 2 * (x >= 1.0) + 4 * (y <= x) + 8 * (x > 0.9)
                    + 16 + 32 * (x != y)),
    "matvec_tensorprod": (lambda X, Y, P, S: S.matvecmult(X - Y).concat(Y.vecmatmult(S))
                          .concat(X[:2].tensorprod(Y[1:])),
                          lambda x, y, p, s: _cat((x - y) @ s.reshape(3, 3).T, y @ s.reshape(3, 3),
                                                  _outer(x[..., :2], y[..., 1:]))),
    "atan2_xlogx": (lambda X, Y, P, S: X.atan2(Y - 1) + (X * Y).xlogx() + (X - Y).sinxdivx(),
                    lambda x, y, p, s: np.arctan2(x, y - 1) + x * y * np.log(x * y) + np.sinc((x - y) / np.pi)),
    "Vi_Vj_axis": (None, lambda x, y, p, s: x * y - p),
}
# fmt: on


def _cat(*arrays):
    """Concatenate on the last axis, broadcasting the others."""
    lead = np.broadcast_shapes(*[a.shape[:-1] for a in arrays])
    return np.concatenate([np.broadcast_to(a, (*lead, a.shape[-1])) for a in arrays], -1)


def _outer(a, b):
    o = a[..., :, None] * b[..., None, :]
    return o.reshape(*o.shape[:-2], -1)


def _round(a):
    """Round half away from zero (C round), not NumPy's half-to-even."""
    return np.sign(a) * np.floor(np.abs(a) + 0.5)


def _erf(a):
    from scipy.special import erf

    return erf(a)


@functools.cache
def _seed():
    return int.from_bytes(os.urandom(4), "little")


@functools.cache
def _data():
    rng = np.random.default_rng(_seed())
    # dyadic grid values: sums, differences and products are exact in float32 too, so
    # rounding, comparisons and branches agree exactly with the float64 twin (and hit
    # their thresholds: x == y, 4 (x - y) = k + 1/2 ...)
    x = 0.5 + rng.integers(0, 65, (N, 3)) / 64
    y = 0.5 + rng.integers(0, 65, (M, 3)) / 64
    p = rng.uniform(0.5, 2.0, 3)
    s = _spd(rng)
    return x, y, p, s


def _build(name, leaves, x, y, p):
    if name == "Vi_Vj_axis":
        return LazyTensor(x, axis=0) * Vj(y) - LazyTensor(p, axis=2)
    return EXPRESSIONS[name][0](*leaves)


def _balanced_concat(items):
    if len(items) == 1:
        return items[0]
    h = len(items) // 2
    return _balanced_concat(items[:h]).concat(_balanced_concat(items[h:]))


@functools.cache
def _results(dtype, dim):
    x, y, p, s = (a.astype(dtype) for a in _data())
    names = sorted(EXPRESSIONS)
    # shared leaves: the expressions' variables merge into four (plus Python numbers)
    leaves = (LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :]), Pm(p), Pm(s))
    items = [_build(n, leaves, x, y, p) for n in names]
    big = _balanced_concat(items)
    out = big.sum(dim=dim, backend="cpu")
    X, Y, P, S = (a.astype(np.float64) for a in (x, y, p, s))
    res, start = {}, 0
    for n, item in zip(names, items):
        d = item.formula.dim
        with np.errstate(all="ignore"):
            V = EXPRESSIONS[n][1](X[:, None, :], Y[None, :, :], P, S)
        V = np.broadcast_to(V, (N, M, V.shape[-1]))
        res[n] = (out[:, start : start + d], V.sum(dim), np.abs(V).sum(dim))
        start += d
    return res


@pytest.mark.parametrize(
    "dtype,dim",
    [("float32", 1), ("float64", 1), ("float64", 0)],
    ids=["float32-sum_j", "float64-sum_j", "float64-sum_i"],
)
@pytest.mark.parametrize("name", sorted(EXPRESSIONS))
def test_expression(name, dtype, dim):
    got, want, scale = _results(dtype, dim)[name]
    assert got.shape == want.shape, f"{name}: shape {got.shape} vs {want.shape}"
    assert got.dtype == np.dtype(dtype)
    rtol = 2e-5 if dtype == "float32" else 1e-10
    err = np.abs(got - want)
    assert np.all(err <= rtol * scale + 1e-300), (
        f"{name} ({dtype}, seed {_seed()}): max error {err.max():.3g}, e.g. {got.ravel()[:3]} vs "
        f"{want.ravel()[:3]}"
    )


# ------------------------------------------------------------------ leaves


def test_leaf_constructors(rng):
    x, y = rng.standard_normal((5, 3)), rng.standard_normal((7, 3))
    assert LazyTensor(x[:, None, :]).shape == (5, 1, 3)
    assert LazyTensor(y[None, :, :]).shape == (1, 7, 3)
    assert (LazyTensor(x[:, None, :]) - LazyTensor(y[None, :, :])).shape == (5, 7, 3)
    assert (Vi(x) - Vj(y)).shape == (5, 7, 3)
    assert (LazyTensor(x, axis=0) - LazyTensor(y, axis=1)).shape == (5, 7, 3)
    assert (Vi(x) | Vj(y)).shape == (5, 7)  # a scalar formula, as pykeops
    # as pykeops: ndim is the vector dimension D, dim() the number of axes
    assert (Vi(x) | Vj(y)).ndim == 1 and (Vi(x) - Vj(y)).ndim == 3 and (Vi(x) | Vj(y)).dim() == 3
    assert Vi(x[:, 0]).shape == (5, 1)  # 1D arrays are (N, 1): a scalar formula
    assert (Vi(x) * Pm(2.0)).shape == (5, 1, 3)
    with pytest.raises(ValueError, match="axis"):
        LazyTensor(x)
    with pytest.raises(ValueError):
        LazyTensor(x, axis=3)
    with pytest.raises(ValueError):
        LazyTensor(np.zeros((4, 5, 3)))
    with pytest.raises(ValueError, match="dimension"):
        Vi(x) + Vj(rng.standard_normal((7, 2)))
    with pytest.raises(ValueError):
        (Vi(x) + Vi(rng.standard_normal((6, 3)))).sum(dim=1)
    with pytest.raises(IndexError):
        Vi(x)[3]
    with pytest.raises(TypeError, match="dtype"):
        (Vi(x) + Vj(rng.standard_normal((7, 3)).astype(np.float32))).sum(dim=1)
    with pytest.raises(TypeError, match="dtype"):
        (Vi(np.arange(6).reshape(3, 2)) * 2).sum(dim=1)


def test_repeated_variables_and_numbers(rng):
    x, y = rng.standard_normal((6, 2)), rng.standard_normal((8, 2))
    xi, yj = Vi(x), Vj(y)
    F = (xi * xi - yj) * 2 + xi / 4 - 1.5
    assert len(F.variables) == 3  # x, y, one scalar parameter for 1.5 (ints are constants)
    got = F.sum(dim=1, backend="numpy")
    want = ((x[:, None] ** 2 - y[None]) * 2 + x[:, None] / 4 - 1.5).sum(1)
    np.testing.assert_allclose(got, want, rtol=1e-12)


# ------------------------------------------------------------------ K @ v, transposes, aliases


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_matmul_gaussian_kernel(lib, rng):
    """The canonical pykeops example, numpy and torch, float32."""
    x = rng.standard_normal((300, 3)).astype(np.float32)
    y = rng.standard_normal((200, 3)).astype(np.float32)
    b = rng.standard_normal((200, 2)).astype(np.float32)
    s = 0.7
    X, Y, B = (x, y, b)
    if lib == "torch":
        import torch

        X, Y, B = (torch.from_numpy(a) for a in (x, y, b))
    x_i, y_j = LazyTensor(X[:, None, :]), LazyTensor(Y[None, :, :])
    K = (-((x_i - y_j) ** 2).sum(-1) / s**2).exp()
    assert K.shape == (300, 200)
    out = K @ B
    assert type(out) is type(B) and tuple(out.shape) == (300, 2)
    Kd = np.exp(-((x[:, None].astype(np.float64) - y[None]) ** 2).sum(-1) / s**2)
    want = Kd @ b.astype(np.float64)
    err = np.abs(np.asarray(out, dtype=np.float64) - want)
    assert np.all(err <= 1e-5 * (Kd @ np.abs(b)))
    # a 1D vector gives a 1D result, as pykeops
    v = B[:, 0].contiguous() if lib == "torch" else b[:, 0].copy()
    out1 = K @ v
    assert tuple(out1.shape) == (300,)
    np.testing.assert_allclose(np.asarray(out1), want[:, 0], rtol=1e-4, atol=1e-4)
    # transposed kernel: K.t() @ u = K^T u
    u = rng.standard_normal((300, 2)).astype(np.float32)
    U_ = u if lib == "numpy" else __import__("torch").from_numpy(u)
    assert K.t().shape == (200, 300) and K.T.shape == (200, 300)
    outT = K.t() @ U_
    assert tuple(outT.shape) == (200, 2)
    np.testing.assert_allclose(np.asarray(outT), Kd.T @ u, rtol=1e-4, atol=1e-4)


def test_matmul_batched_and_errors(rng):
    x = rng.standard_normal((2, 9, 1, 3))
    y = rng.standard_normal((2, 1, 11, 3))
    v = rng.standard_normal((2, 11, 4))
    K = (-LazyTensor(x).sqdist(LazyTensor(y))).exp()
    out = K @ v
    Kd = np.exp(-((x - y) ** 2).sum(-1))
    np.testing.assert_allclose(out, Kd @ v, rtol=1e-12)
    # v with more batch dims than K: the broadcast batch is reduced correctly
    K1 = (-Vi(x[0, :, 0]).sqdist(Vj(y[0, 0]))).exp()
    out = K1 @ v
    np.testing.assert_allclose(out, Kd[0][None] @ v, rtol=1e-12)
    with pytest.raises(ValueError, match="scalar"):
        (Vi(x[0, :, 0]) - Vj(y[0, 0])) @ v[0]
    # sum options pass through, as pykeops's K.__matmul__(v, sum_scheme=...)
    out = K1.__matmul__(v[0], sum_scheme="kahan_scheme", backend="numpy")
    np.testing.assert_allclose(out, Kd[0] @ v[0], rtol=1e-12)


def test_matmul_reused_kernel_and_shared_variable(rng):
    """K @ v caches K * v_j per (K, dim of v): fresh v of other widths, and a v that is one
    of K's own variables (merged, not duplicated), all give the dense result."""
    x, y = rng.standard_normal((40, 1)), rng.standard_normal((30, 1))
    b = rng.standard_normal((30, 1))
    K = (-Vi(x).sqdist(Vj(y)) - Vj(b)).exp()
    Kd = np.exp(-((x - y.T) ** 2) - b.T)
    for E in (1, 3, 1, 2):
        v = rng.standard_normal((30, E))
        np.testing.assert_allclose(K @ v, Kd @ v, rtol=1e-12)
    np.testing.assert_allclose(K @ b, Kd @ b, rtol=1e-12)  # b is K's own j-variable
    np.testing.assert_allclose(K @ y, Kd @ y, rtol=1e-12)
    np.testing.assert_allclose((K * 2.0) @ b, 2 * Kd @ b, rtol=1e-12)


def test_reduction_aliases(rng):
    x, y = rng.standard_normal((8, 2)), rng.standard_normal((9, 2))
    w = rng.uniform(0.1, 1, (9, 2))
    F = Vi(x).sqdist(Vj(y))
    G = Vi(x) - Vj(y)
    be = {"backend": "numpy"}
    pairs = [
        (F.sum_reduction(dim=1, **be), F.sum(dim=1, **be)),
        (G.min_reduction(dim=1, **be), G.min(dim=1, **be)),
        (G.max_reduction(axis=0, **be), G.max(axis=0, **be)),
        (G.argmin_reduction(dim=1, **be), G.argmin(dim=1, **be)),
        (G.argmax_reduction(dim=1, **be), G.argmax(dim=1, **be)),
        (G.Kmin_reduction(K=3, dim=1, **be), G.Kmin(3, dim=1, **be)),
        (F.argKmin_reduction(K=3, dim=1, **be), F.argKmin(3, dim=1, **be)),
        (F.logsumexp_reduction(dim=1, **be), F.logsumexp(dim=1, **be)),
        (F.sumsoftmaxweight_reduction(Vj(w), dim=1, **be), F.sumsoftmaxweight(Vj(w), dim=1, **be)),
        (F.max_sumshiftexp_reduction(dim=1, **be), F.max_sumshiftexp(dim=1, **be)),
    ]
    for a, b in pairs:
        np.testing.assert_array_equal(a, b)
    for a, b in [
        (G.min_argmin_reduction(dim=1, **be), G.min_argmin(dim=1, **be)),
        (G.max_argmax_reduction(dim=1, **be), G.max_argmax(dim=1, **be)),
        (F.Kmin_argKmin_reduction(K=2, dim=0, **be), F.Kmin_argKmin(2, dim=0, **be)),
    ]:
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    D = ((x[:, None] - y[None]) ** 2).sum(-1)
    np.testing.assert_allclose(pairs[0][0][:, 0], D.sum(1))
    np.testing.assert_array_equal(pairs[6][0], np.argsort(D, 1, kind="stable")[:, :3])


def test_dim_and_axis_with_batch_offsets(rng):
    B, Nn, Mm = 3, 6, 7
    x = rng.standard_normal((B, Nn, 1, 2))
    y = rng.standard_normal((B, 1, Mm, 2))
    F = (LazyTensor(x) - LazyTensor(y)) ** 2
    V = (x - y) ** 2
    assert F.shape == (B, Nn, Mm, 2) and F.dim() == 4 and F.ndim == 2 and F.nbatchdims == 1
    be = {"backend": "numpy"}
    np.testing.assert_allclose(F.sum(dim=2, **be), V.sum(2))  # over j
    np.testing.assert_allclose(F.sum(axis=2, **be), V.sum(2))
    np.testing.assert_allclose(F.sum(dim=1, **be), V.sum(1))  # over i
    np.testing.assert_allclose(F.sum(dim=-2, **be), V.sum(2))
    np.testing.assert_allclose(F.sum(dim=-3, **be), V.sum(1))
    np.testing.assert_allclose(F.min(dim=2, **be), V.min(2))
    S = F.sum(dim=3)  # the vector dimension: symbolic
    assert isinstance(S, LazyTensor) and S.shape == (B, Nn, Mm)
    np.testing.assert_allclose(S.sum(dim=2, backend="cpu"), V.sum(-1).sum(2)[..., None])
    assert isinstance(F.sum(-1), LazyTensor)
    with pytest.raises(ValueError, match="dim"):
        F.sum(dim=0)  # the batch dimension
    with pytest.raises(ValueError):
        F.sum(dim=1, axis=2)
    # two batch dims
    x2 = rng.standard_normal((2, 1, Nn, 1, 2))
    y2 = rng.standard_normal((1, 3, 1, Mm, 2))
    F2 = (LazyTensor(x2) * LazyTensor(y2)).sum(-1)
    assert F2.shape == (2, 3, Nn, Mm) and F2.nbatchdims == 2
    np.testing.assert_allclose(F2.sum(dim=3, **be)[..., 0], (x2 * y2).sum(-1).sum(3))
    np.testing.assert_allclose(
        F2.logsumexp(dim=2, **be)[..., 0], np.log(np.exp((x2 * y2).sum(-1)).sum(2))
    )


# ------------------------------------------------------------------ call=False, out=, backends


def test_call_false_returns_reusable_callable(rng):
    x, y = rng.standard_normal((10, 3)), rng.standard_normal((12, 3))
    b = rng.standard_normal((12, 1))
    F = (-Vi(x).sqdist(Vj(y))).exp() * Vj(b)
    fn = F.sum(dim=1, call=False)
    assert callable(fn)
    K = np.exp(-((x[:, None] - y[None]) ** 2).sum(-1))
    want = K @ b
    # float64 sums in another order than NumPy's: a row whose terms cancel differs by
    # a few ulps of the sum of their magnitudes, not of the result
    atol = 1e-14 * (K @ np.abs(b)).max()
    np.testing.assert_allclose(fn(), want, rtol=1e-12, atol=atol)
    np.testing.assert_allclose(fn(), want, rtol=1e-12, atol=atol)
    # new data of other sizes, in variable order (x, y, b)
    x2, y2, b2 = (
        rng.standard_normal((4, 3)),
        rng.standard_normal((20, 3)),
        rng.standard_normal((20, 1)),
    )
    K2 = np.exp(-((x2[:, None] - y2[None]) ** 2).sum(-1))
    want2 = K2 @ b2
    atol2 = 1e-14 * (K2 @ np.abs(b2)).max()
    np.testing.assert_allclose(fn(x2, y2, b2), want2, rtol=1e-12, atol=atol2)
    np.testing.assert_allclose(fn(x2, y2, b2, backend="numpy"), want2, rtol=1e-12, atol=atol2)
    k = (Vi(x).sqdist(Vj(y))).argKmin(2, dim=1, call=False)
    np.testing.assert_array_equal(
        k(x2, y2), np.argsort(((x2[:, None] - y2[None]) ** 2).sum(-1), 1, kind="stable")[:, :2]
    )


def test_out_argument(rng):
    import torch

    x, y = rng.standard_normal((10, 3)), rng.standard_normal((12, 3))
    F = Vi(x) * Vj(y)
    out = np.empty((10, 3))
    res = F.sum(dim=1, out=out)
    assert res is out
    np.testing.assert_allclose(out, (x[:, None] * y[None]).sum(1), rtol=1e-12)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    tout = torch.empty(12, 3, dtype=torch.float64)
    res = (Vi(xt) * Vj(yt)).sum(dim=0, out=tout)
    assert res is tout
    np.testing.assert_allclose(tout.numpy(), (x[:, None] * y[None]).sum(0), rtol=1e-12)


def test_backends_agree_and_unknown_backend(rng):
    x, y = rng.standard_normal((10, 3)), rng.standard_normal((12, 3))
    F = Vi(x).sqdist(Vj(y))
    a = F.sum(dim=1, backend="numpy")
    b = F.sum(dim=1, backend="cpu")
    c = F.sum(dim=1, backend="auto")
    d = F.sum(dim=1)
    np.testing.assert_allclose(a, b, rtol=1e-12)
    np.testing.assert_allclose(c, b, rtol=1e-12)
    np.testing.assert_allclose(d, b, rtol=1e-12)
    np.testing.assert_allclose(F.sum(dim=1, backend="CPU"), b, rtol=1e-12)  # pykeops's name
    for bad in ("Gpu", "Cpu", "keops", "GPU_3D"):
        with pytest.raises(ValueError, match="backend"):
            F.sum(dim=1, backend=bad)
    with pytest.raises(ValueError, match="backend"):
        F.argKmin(2, dim=1, backend="Cuda")


# ------------------------------------------------------------------ user workflows


def test_knn_with_argkmin(rng):
    """K-nearest-neighbour classification, as in the pykeops tutorial."""
    import torch

    x_train = torch.from_numpy(rng.uniform(0, 1, (1000, 2)).astype(np.float32))
    labels = (x_train[:, 0] > x_train[:, 1]).long()
    x_test = torch.from_numpy(rng.uniform(0, 1, (150, 2)).astype(np.float32))
    X_i = LazyTensor(x_test[:, None, :])
    X_j = LazyTensor(x_train[None, :, :])
    D_ij = ((X_i - X_j) ** 2).sum(-1)
    ind = D_ij.argKmin(5, dim=1)
    assert ind.shape == (150, 5) and ind.dtype == torch.int64
    D = ((x_test[:, None, :].double() - x_train[None].double()) ** 2).sum(-1)
    want_d = torch.sort(D, dim=1, stable=True).values[:, :5]
    np.testing.assert_allclose(torch.gather(D, 1, ind).numpy(), want_d.numpy(), atol=1e-6)
    pred = labels[ind].float().mean(1) > 0.5
    assert ind.min() >= 0 and ind.max() < 1000
    truth = x_test[:, 0] > x_test[:, 1]
    assert (pred == truth).float().mean() > 0.9
    # over i: for each training point, its nearest test point
    ind_i = D_ij.argmin(dim=0)
    assert ind_i.shape == (1000, 1)
    np.testing.assert_allclose(
        torch.gather(D, 0, ind_i.T).numpy()[0], D.min(0).values.numpy(), atol=1e-6
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softmax_attention(dtype, rng):
    import torch

    tdt = getattr(torch, dtype)
    q = torch.from_numpy(rng.standard_normal((70, 8))).to(tdt)
    k = torch.from_numpy(rng.standard_normal((90, 8))).to(tdt)
    v = torch.from_numpy(rng.standard_normal((90, 5))).to(tdt)
    q_i, k_j, v_j = LazyTensor(q[:, None, :]), LazyTensor(k[None, :, :]), LazyTensor(v[None, :, :])
    out = ((q_i | k_j) / np.sqrt(8)).sumsoftmaxweight(v_j, dim=1)
    assert out.shape == (70, 5) and out.dtype == tdt
    want = torch.softmax(q.double() @ k.double().T / np.sqrt(8), dim=1) @ v.double()
    tol = 1e-5 if dtype == "float32" else 1e-11
    np.testing.assert_allclose(out.double().numpy(), want.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_logsumexp_large_magnitudes(dtype, rng):
    """Inputs of magnitude 1e4: exp overflows, the stable log-sum-exp does not.

    The softmax-weighted average in float32 is held to dense float32 (NumPy, the same
    float32 products), not to a fixed 1e-4: rounding S = <x, y> (|S| up to 2e4, where a
    float32 ulp is 2e-3) moves each softmax weight by up to ~1e-3 relative, so the average
    of weights w in [0.5, 2] can move by ~1e-4 relative wherever two nearly tied terms
    share the weight (seed 1124833477: 1.3e-4, the same error in dense float32)."""
    from scipy.special import logsumexp

    x = (rng.uniform(-1, 1, (40, 2)) * 100).astype(dtype)
    y = (rng.uniform(-1, 1, (60, 2)) * 100).astype(dtype)
    w = rng.uniform(0.5, 2, (60, 1)).astype(dtype)
    S = Vi(x) | Vj(y)  # |S| up to 2e4
    V = x.astype(np.float64) @ y.astype(np.float64).T
    assert np.abs(V).max() > 5e3
    lse = S.logsumexp(dim=1)
    assert lse.shape == (40, 1) and np.all(np.isfinite(lse))
    tol = 1e-5 * (np.abs(V).max(1) + 1) if dtype == "float32" else 1e-10 * (np.abs(V).max(1) + 1)
    assert np.all(np.abs(lse[:, 0] - logsumexp(V, axis=1)) <= tol)
    if dtype == "float64":
        return  # the other reductions in float32 only (one kernel each)
    lse_i = S.logsumexp(dim=0)
    assert np.all(np.isfinite(lse_i))
    np.testing.assert_allclose(
        lse_i[:, 0], logsumexp(V, axis=0), rtol=1e-5 if dtype == "float32" else 1e-10
    )
    lw = S.logsumexp(dim=1, weight=Vj(w))
    assert np.all(np.isfinite(lw))
    np.testing.assert_allclose(
        lw[:, 0],
        logsumexp(V, axis=1, b=w[:, 0].astype(np.float64)[None]),
        rtol=1e-5 if dtype == "float32" else 1e-10,
    )
    sm = (-S).sumsoftmaxweight(Vj(w), dim=1)
    assert np.all(np.isfinite(sm))
    P = np.exp(-V - logsumexp(-V, axis=1, keepdims=True))
    want = P @ w.astype(np.float64)
    V32 = -(x @ y.T)  # float32 products, then the softmax average in float64
    dense32 = np.exp(V32 - V32.max(1, keepdims=True)) @ w.astype(np.float64)
    dense32 /= np.exp(V32 - V32.max(1, keepdims=True)).sum(1, keepdims=True)
    assert np.all(np.abs(sm - want) <= 1e-4 * np.abs(want) + 10 * np.abs(dense32 - want))
    ms = S.max_sumshiftexp(dim=1)
    assert np.all(np.isfinite(ms))
    np.testing.assert_allclose(ms[:, 0], V.max(1), rtol=1e-6 if dtype == "float32" else 1e-12)


def test_keops_kron_and_tensordot_match_numpy(rng):
    a, b = rng.random((5, 6)), rng.random((7, 6))
    A, B = Vi(a), Vj(b)
    kron = A.keops_kron(B, (2, 3), (3, 2)).sum(1)
    ref = np.stack([sum(np.kron(a[i].reshape(2, 3), b[j].reshape(3, 2)).reshape(-1) for j in range(7))
                    for i in range(5)])
    np.testing.assert_allclose(kron, ref, rtol=1e-12)
    for dims_b, ca, cb in (((3, 2), (1,), (0,)), ((2, 3), (0, 1), (0, 1)), ((2, 3), (0,), (0,))):
        td = A.keops_tensordot(B, (2, 3), dims_b, ca, cb).sum(1)
        ref = np.stack([sum(np.tensordot(a[i].reshape(2, 3), b[j].reshape(dims_b), axes=(ca, cb)).reshape(-1)
                            for j in range(7)) for i in range(5)])
        np.testing.assert_allclose(td, ref, rtol=1e-12)
