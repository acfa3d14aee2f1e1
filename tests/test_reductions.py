"""Every reduction against dense NumPy computed here, independently of the engine.

The kernels are compiled once per (formula, reduction, dtype, axis); the tests reuse the
same formulas (``F_VEC``, ``F_SCAL``) so that sizes, batches, memory layouts and thread
schemes are exercised without recompiling.

Float32 indices are checked by value (the chosen index must attain the best value within
float32 error), since a float32 kernel may legitimately swap two candidates whose float64
values differ by less than float32 rounding; float64 indices and tie-breaking (on exact
grid data) are checked exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from lazytensor.codegen import reductions
from lazytensor.codegen.compilers import cpu_compiler

from lazytensor import LazyTensor, Vi, Vj

pytestmark = pytest.mark.skipif(not cpu_compiler().available, reason="no C++ compiler")

RTOL = {"float32": 1e-5, "float64": 1e-10}
K = 4

VECTOR_OK = {
    "sum",
    "min",
    "max",
    "argmin",
    "argmax",
    "min_argmin",
    "max_argmax",
    "kmin",
    "argkmin",
    "kmin_argkmin",
}
WEIGHTED = {"logsumexp_weight", "sumsoftmaxweight", "max_sumshiftexp_weight"}
ALL = sorted(VECTOR_OK | WEIGHTED | {"logsumexp", "max_sumshiftexp"})


def test_all_registered_reductions_are_tested():
    names = {r.name for r in reductions.REDUCTIONS.values()}
    assert names == set(ALL), f"untested reductions: {sorted(names - set(ALL))}"


# ------------------------------------------------------------------ formulas, dense twins


def f_vec(x, y):
    """F = (x - y)² + 0.3 x y, componentwise (dimension D)."""
    return (x - y) ** 2 + 0.3 * x * y


def f_scal(x, y):
    """F = -2 |x - y|² + (x | y), scalar."""
    return -2 * ((x - y) ** 2).sum(-1) + (x | y)


def dense_vec(x, y):
    """x (..., N, D), y (..., M, D) -> (..., N, M, D)."""
    X, Y = x[..., :, None, :], y[..., None, :, :]
    return (X - Y) ** 2 + 0.3 * X * Y


def dense_scal(x, y):
    X, Y = x[..., :, None, :], y[..., None, :, :]
    return (-2 * ((X - Y) ** 2).sum(-1) + (X * Y).sum(-1))[..., None]


def run(name, F, dim, w=None, backend="cpu", **kw):
    """Call reduction ``name`` on LazyTensor ``F`` as a pykeops user would."""
    if name == "sum":
        return F.sum(dim=dim, backend=backend, **kw)
    if name in ("kmin", "argkmin", "kmin_argkmin"):
        method = {"kmin": F.Kmin, "argkmin": F.argKmin, "kmin_argkmin": F.Kmin_argKmin}[name]
        return method(K, dim=dim, backend=backend, **kw)
    if name == "logsumexp_weight":
        return F.logsumexp(dim=dim, weight=w, backend=backend, **kw)
    if name == "sumsoftmaxweight":
        return F.sumsoftmaxweight(w, dim=dim, backend=backend, **kw)
    if name == "max_sumshiftexp_weight":
        return F.max_sumshiftexpweight(w, dim=dim, backend=backend, **kw)
    return getattr(F, name)(dim=dim, backend=backend, **kw)


def dense(name, V, W=None):
    """Reference over axis -2 of V (..., R, F) (and weights W (..., R, E)): list of outputs."""
    V = np.asarray(V, dtype=np.float64)
    Fd = V.shape[-1]
    if name == "sum":
        return [V.sum(-2)]
    if name in ("min", "max"):
        return [V.min(-2) if name == "min" else V.max(-2)]
    if name in ("argmin", "argmax"):
        return [(V.argmin(-2) if name == "argmin" else V.argmax(-2))]
    if name in ("min_argmin", "max_argmax"):
        return dense(name[:3], V) + dense("arg" + name[:3], V)
    if name in ("kmin", "argkmin", "kmin_argkmin"):
        order = np.argsort(V, axis=-2, kind="stable")[..., :K, :]
        vals = np.take_along_axis(V, order, axis=-2)
        if Fd == 1:
            order, vals = order[..., 0], vals[..., 0]
        return {"kmin": [vals], "argkmin": [order], "kmin_argkmin": [vals, order]}[name]
    m = V.max(-2, keepdims=True)
    e = np.exp(V - m)
    if name == "logsumexp":
        return [(m + np.log(e.sum(-2, keepdims=True)))[..., 0, :]]
    if name == "max_sumshiftexp":
        return [np.concatenate([m[..., 0, :], e.sum(-2)], -1)]
    if name == "logsumexp_weight":
        return [m[..., 0, :] + np.log((e * W).sum(-2))]
    if name == "sumsoftmaxweight":
        return [(e * W).sum(-2) / e.sum(-2)]
    if name == "max_sumshiftexp_weight":
        return [np.concatenate([m[..., 0, :], (e * W).sum(-2)], -1)]
    raise AssertionError(name)


def scale(name, V, W=None):
    """Magnitude that the error of each output is relative to."""
    V0, V = V, np.abs(np.asarray(V, dtype=np.float64))
    if name == "sum":
        return V.sum(-2)
    big = V.max(-2) + 1.0
    if name == "max_sumshiftexp":  # (max, sum of exp(f - max)): the sum on its own scale
        return np.concatenate([big, np.exp(V - V.max(-2, keepdims=True)).sum(-2)], -1)
    if name == "max_sumshiftexp_weight":  # (max, Σ exp(f - max) |w|), f signed
        f = np.asarray(V0, dtype=np.float64)
        e = np.exp(f - f.max(-2, keepdims=True))
        return np.concatenate([big, (e * np.abs(W)).sum(-2)], -1)
    if name in WEIGHTED:
        return big + np.abs(W).max(-2)
    return big


def check_values(out, ref, tol_scale, rtol, what=""):
    out = np.asarray(out, dtype=np.float64)
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != {ref.shape}"
    err = np.abs(out - ref)
    bound = rtol * np.broadcast_to(tol_scale, ref.shape) if np.ndim(tol_scale) else rtol * tol_scale
    bad = ~(err <= bound)
    assert not bad.any(), f"{what}: {bad.sum()} mismatches, e.g. {out[bad][:3]} vs {ref[bad][:3]}"


def check_indices(idx, V, name, dtype, what=""):
    """Indices from the kernel: exact in float64, by attained value in float32."""
    idx = np.asarray(idx)
    assert idx.dtype == np.int64, f"{what}: indices dtype {idx.dtype}"
    index_reduction = {
        "min_argmin": "argmin",
        "max_argmax": "argmax",
        "kmin_argkmin": "argkmin",
    }.get(name, name)
    ref_idx = dense(index_reduction, V)[0]
    k_select = index_reduction == "argkmin"
    assert idx.shape == ref_idx.shape, f"{what}: shape {idx.shape} != {ref_idx.shape}"
    if dtype == "float64":
        np.testing.assert_array_equal(idx, ref_idx, err_msg=what)
        return
    R = V.shape[-2]
    assert idx.min() >= 0 and idx.max() < R, what
    if k_select:  # (..., K[, F]) -> gather along the reduced axis
        g = idx if V.shape[-1] > 1 else idx[..., None]
        got = np.take_along_axis(V, g, axis=-2)
        want = np.take_along_axis(V, ref_idx if V.shape[-1] > 1 else ref_idx[..., None], axis=-2)
        srt = np.sort(g, axis=-2)
        assert (np.diff(srt, axis=-2) > 0).all(), f"{what}: repeated indices"
    else:
        got = np.take_along_axis(V, idx[..., None, :], axis=-2)[..., 0, :]
        want = np.take_along_axis(V, ref_idx[..., None, :], axis=-2)[..., 0, :]
    tol = 1e-5 * (np.abs(V).max() + 1)
    np.testing.assert_allclose(got, want, rtol=0, atol=tol, err_msg=what)


def check(name, res, V, W, dtype, what=""):
    """All outputs of reduction ``name`` (``res``) against the dense reference on V."""
    outs = list(res) if isinstance(res, tuple) else [res]
    refs = dense(name, V, W)
    assert len(outs) == len(refs), f"{what}: {len(outs)} outputs"
    tol_scale = scale(name, V, W)
    for out, ref in zip(outs, refs):
        if ref.dtype.kind == "i":
            check_indices(out, V, name, dtype, what)
        else:
            assert out.dtype == np.dtype(dtype), f"{what}: dtype {out.dtype}"
            ts = tol_scale
            if name in ("kmin", "kmin_argkmin"):
                ts = np.abs(V).max() + 1.0
            check_values(out, ref, ts, RTOL[dtype], what)


# ------------------------------------------------------------------ data


def make_data(rng, N, M, D=3, E=2, dtype="float64", batch_x=(), batch_y=()):
    x = rng.uniform(-1, 1, (*batch_x, N, D)).astype(dtype)
    y = rng.uniform(-1, 1, (*batch_y, M, D)).astype(dtype)
    wj = rng.uniform(0.1, 2, (*batch_y, M, E)).astype(dtype)  # positive: log of weighted sums
    wi = rng.uniform(0.1, 2, (*batch_x, N, E)).astype(dtype)
    return x, y, wi, wj


def lazy_and_dense(name, x, y, wi, wj, axis):
    """(LazyTensor formula, weight LazyTensor, dense V over the reduced axis, dense W)."""
    vec = name in VECTOR_OK
    F = (f_vec if vec else f_scal)(Vi(x), Vj(y))
    V = (dense_vec if vec else dense_scal)(x.astype(np.float64), y.astype(np.float64))
    if axis == 0:
        V = np.swapaxes(V, -3, -2)
    w_lazy = (Vj(wj) if axis == 1 else Vi(wi)) if name in WEIGHTED else None
    W = (wj if axis == 1 else wi).astype(np.float64)[..., None, :, :] if name in WEIGHTED else None
    return F, w_lazy, V, W


# ------------------------------------------------------------------ every reduction


@pytest.mark.parametrize("axis", [1, 0], ids=["over_j", "over_i"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", ALL)
def test_reduction_matches_dense(name, dtype, axis, rng):
    # sizes with tile remainders both ways (tiles are at most 256 long)
    x, y, wi, wj = make_data(rng, 300, 257, dtype=dtype)
    F, w, V, W = lazy_and_dense(name, x, y, wi, wj, axis)
    res = run(name, F, axis, w)
    check(name, res, V, W, dtype, f"{name} {dtype} axis={axis}")


@pytest.mark.parametrize("dtype,axis", [("float32", 1), ("float64", 0)])
@pytest.mark.parametrize(
    "name", ["argmin", "argmax", "min_argmin", "max_argmax", "argkmin", "kmin_argkmin", "kmin"]
)
def test_ties_go_to_the_lowest_index(name, dtype, axis, rng):
    # f = x_i * y_j on a small integer grid: many exact ties, in float32 too; 300 > one tile
    x = rng.integers(-2, 3, (40, 1)).astype(dtype)
    y = rng.integers(-2, 3, (300, 1)).astype(dtype)
    F = Vi(x) * Vj(y) if axis == 1 else Vj(x) * Vi(y)
    res = run(name, F, axis)
    V = x.astype(np.float64)[:, None, :] * y.astype(np.float64)[None, :, :]
    outs = list(res) if isinstance(res, tuple) else [res]
    refs = dense(name, V)
    assert len(outs) == len(refs)
    for out, ref in zip(outs, refs):
        np.testing.assert_array_equal(np.asarray(out), ref.astype(out.dtype))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("K", [1, 7, 64, 100])
def test_kmin_blocks_with_ties_nans_and_descending_runs(K, dtype, rng):
    """The K-selections test blocks of 64 terms at once against the worst kept value: runs
    that improve at every step (descending), exact ties, NaN, tile and block tails."""
    M = 2000
    y = rng.integers(0, 50, (M, 1)).astype(dtype)
    y[:300, 0] = np.arange(300, 0, -1)  # every term better than the last: constant insertions
    y[rng.random(M) < 0.02] = np.nan
    x = rng.integers(-3, 4, (37, 1)).astype(dtype)
    x[0] = 0  # a row of ties only (and NaN)
    F = (Vi(x) - Vj(y)) ** 2
    V = (x.astype(np.float64)[:, None, :] - y.astype(np.float64)[None, :, :]) ** 2
    vals, idx = F.Kmin_argKmin(K, dim=1, backend="cpu")
    want_i = np.argsort(V[..., 0], axis=1, kind="stable")[:, :K]  # NaN last, ties by index
    want_v = np.take_along_axis(V[..., 0], want_i, axis=1)
    np.testing.assert_array_equal(idx, want_i)
    np.testing.assert_array_equal(vals, want_v.astype(dtype))


def test_argkmin_all_equal_values_gives_first_indices():
    x = np.zeros((5, 1))
    y = np.zeros((9, 1))
    idx = (Vi(x) * Vj(y)).argKmin(3, dim=1, backend="cpu")
    np.testing.assert_array_equal(idx, np.tile([0, 1, 2], (5, 1)))
    idx = (Vi(x) * Vj(y)).argmax(dim=1, backend="cpu")
    np.testing.assert_array_equal(idx, np.zeros((5, 1)))


def _lse_family_expected(f, w):
    """The documented semantics, by cases: +inf terms dominate (each counts exp(0) = 1),
    a row of -inf only (or an empty row) has sum 0, NaN propagates."""
    out = {}
    m = np.max(f)
    if np.isnan(f).any():
        nan = np.full(w.shape[-1], np.nan)
        return {
            "logsumexp": [np.nan],
            "logsumexp_weight": nan,
            "sumsoftmaxweight": nan,
            "max_sumshiftexp": [np.nan, np.nan],
        }
    if m == np.inf:
        e = (f == np.inf) * 1.0
    elif m == -np.inf:
        e = np.zeros_like(f)
    else:
        e = np.exp(f - m)
    with np.errstate(all="ignore"):
        out["logsumexp"] = [m + np.log(e.sum())]
        out["logsumexp_weight"] = m + np.log(e @ w)
        out["sumsoftmaxweight"] = (e @ w) / e.sum()
        out["max_sumshiftexp"] = [m, e.sum()]
    return out


@pytest.mark.parametrize("backend", ["cpu", "numpy"])
def test_logsumexp_family_infinite_and_nan_values(backend, rng, monkeypatch):
    """+inf, all -inf and NaN rows: the same results from the kernel and the reference.

    ``f = x_i * y_j`` with y holding infinities in different tiles (and, with M = 20000 and
    few rows, different split-j chunks merged at the end).
    """
    monkeypatch.setenv("LAZYTENSOR_NUM_THREADS", "4")
    M = 20000
    y = rng.uniform(-1, 1, (M, 1))
    x = np.array([[1.0], [-1.0], [0.5], [2.0]])
    y[[7, 15000], 0] = np.inf  # row 0, 2, 3: two +inf terms; row 1: two -inf terms
    w = rng.uniform(0.5, 2, (M, 2))
    cases = {"inf": (x, y)}
    y2 = np.full((M, 1), -np.inf)
    cases["all -inf"] = (x[:1], y2)
    y3 = y.copy()
    y3[9000, 0] = np.nan
    cases["nan"] = (x[:2], y3)
    for what, (xx, yy) in cases.items():
        F = Vi(xx) * Vj(yy)
        got = {
            "logsumexp": F.logsumexp(dim=1, backend=backend),
            "logsumexp_weight": F.logsumexp(dim=1, weight=Vj(w), backend=backend),
            "sumsoftmaxweight": F.sumsoftmaxweight(Vj(w), dim=1, backend=backend),
            "max_sumshiftexp": F.max_sumshiftexp(dim=1, backend=backend),
        }
        for i in range(xx.shape[0]):
            with np.errstate(all="ignore"):
                want = _lse_family_expected(xx[i, 0] * yy[:, 0], w)
            for name, value in got.items():
                np.testing.assert_allclose(
                    value[i], want[name], rtol=1e-12, err_msg=f"{name}, {what}, row {i}, {backend}"
                )


# ------------------------------------------------------------------ batches


@pytest.mark.parametrize("name", ["sum", "argkmin", "min_argmin", "logsumexp", "sumsoftmaxweight"])
def test_batch_broadcast_one_batch_dim(name, rng):
    """x (B, N, 1, D) against y (1, M, D): y is shared by every batch."""
    B, N, M, D = 3, 17, 29, 3
    x = rng.uniform(-1, 1, (B, N, D))
    y = rng.uniform(-1, 1, (M, D))
    wj = rng.uniform(-1, 1, (M, 2))
    vec = name in VECTOR_OK
    xi, yj = LazyTensor(x[:, :, None, :]), LazyTensor(y[None, :, :])
    F = (f_vec if vec else f_scal)(xi, yj)
    assert F.shape == ((B, N, M, D) if vec else (B, N, M))  # pykeops drops D = 1
    assert F.nbatchdims == 1
    w = LazyTensor(wj[None, :, :]) if name in WEIGHTED else None
    res = run(name, F, 2, w)  # dim=2: j, after one batch dim
    V = (dense_vec if vec else dense_scal)(x, np.broadcast_to(y, (B, M, D)))
    check(name, res, V, wj[None, None] if w is not None else None, "float64", name)
    # over i (dim=1)
    w_i = LazyTensor(rng.uniform(-1, 1, (B, N, 1, 2))) if name in WEIGHTED else None
    res = run(name, F, 1, w_i)
    Wi = None if w_i is None else w_i.variables[0].data[:, None, :, :]
    check(name, res, np.swapaxes(V, -3, -2), Wi, "float64", name + " over i")


@pytest.mark.parametrize("name", ["sum", "argmin", "kmin", "logsumexp_weight", "max_sumshiftexp"])
def test_batch_broadcast_two_batch_dims(name, rng):
    """x (B1, 1, N, 1, D) against y (1, B2, 1, M, D): output (B1, B2, N, .)."""
    B1, B2, N, M, D = 2, 3, 11, 23, 3
    x = rng.uniform(-1, 1, (B1, 1, N, 1, D))
    y = rng.uniform(-1, 1, (1, B2, 1, M, D))
    w = rng.uniform(0.1, 1, (1, B2, 1, M, 2))
    vec = name in VECTOR_OK
    F = (f_vec if vec else f_scal)(LazyTensor(x), LazyTensor(y))
    assert F.shape == ((B1, B2, N, M, D) if vec else (B1, B2, N, M))
    res = run(name, F, 3, LazyTensor(w) if name in WEIGHTED else None)
    V = (dense_vec if vec else dense_scal)(x[:, :, :, 0, :], y[:, :, 0, :, :])
    assert V.shape[:2] == (B1, B2)
    check(name, res, V, w[:, :, 0][:, :, None] if name in WEIGHTED else None, "float64", name)
    wi = rng.uniform(0.1, 1, (1, B2, N, 1, 2))
    res_i = run(name, F, -3, LazyTensor(wi) if name in WEIGHTED else None)  # dim=-3 is i
    Wi = wi[:, :, None, :, 0, :] if name in WEIGHTED else None
    check(name, res_i, np.swapaxes(V, -3, -2), Wi, "float64", name + " over i")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_parameters_with_batch_dims_every_batch(dtype, rng):
    """KeOps #366: a parameter with batch dims used only its first batch. Check every batch."""
    B, N, M, D = 4, 13, 19, 3
    x = rng.uniform(-1, 1, (B, N, 1, D)).astype(dtype)
    y = rng.uniform(-1, 1, (1, M, D)).astype(dtype)
    p = rng.uniform(-2, 2, (B, 1, 1, D)).astype(dtype)
    s = rng.uniform(0.5, 2, (B, 1, 1, 1)).astype(dtype)
    F = (LazyTensor(x) * LazyTensor(p) - LazyTensor(y)) ** 2 * LazyTensor(s)
    assert F.shape == (B, N, M, D)
    out = F.sum(dim=2, backend="cpu")
    X, Y, P, S = (a.astype(np.float64) for a in (x, y, p, s))
    V = (X * P - Y) ** 2 * S  # (B, N, M, D)
    assert out.shape == (B, N, D)
    for b in range(B):
        check_values(out[b], V[b].sum(1), np.abs(V[b]).sum(1), RTOL[dtype], f"batch {b}")
    out_i = F.sum(dim=1, backend="cpu")
    for b in range(B):
        check_values(out_i[b], V[b].sum(0), np.abs(V[b]).sum(0), RTOL[dtype], f"batch {b} over i")
    # a parameter that is batched while the i/j variables are not
    x2 = rng.uniform(-1, 1, (N, 1, D)).astype(dtype)
    F2 = (LazyTensor(x2) * LazyTensor(p) - LazyTensor(y)) ** 2 * LazyTensor(s)
    out2 = F2.sum(dim=2, backend="cpu")
    V2 = (x2.astype(np.float64) * P - Y) ** 2 * S
    assert out2.shape == (B, N, D)
    for b in range(B):
        check_values(
            out2[b], V2[b].sum(1), np.abs(V2[b]).sum(1), RTOL[dtype], f"batch {b} (p only)"
        )


# ------------------------------------------------------------------ libraries, dtypes, layouts


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_torch_in_torch_out(dtype, rng):
    import torch

    tdt = getattr(torch, dtype)
    x, y, _wi, wj = make_data(rng, 31, 45, dtype=dtype)
    xt, yt, wt = torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(wj)
    Ft = f_vec(Vi(xt), Vj(yt))
    V = dense_vec(x.astype(np.float64), y.astype(np.float64))
    s = Ft.sum(dim=1)
    assert isinstance(s, torch.Tensor) and s.dtype == tdt and s.shape == (31, 3)
    check("sum", s.numpy(), V, None, dtype)
    v, i = Ft.min_argmin(dim=1)
    assert v.dtype == tdt and i.dtype == torch.int64 and v.shape == i.shape == (31, 3)
    check("min_argmin", (v.numpy(), i.numpy()), V, None, dtype)
    kv = Ft.Kmin(K, dim=1)
    assert isinstance(kv, torch.Tensor) and kv.shape == (31, K, 3) and kv.dtype == tdt
    a = f_scal(Vi(xt), Vj(yt)).argKmin(K, dim=1)
    assert a.shape == (31, K) and a.dtype == torch.int64
    Vs = dense_scal(x.astype(np.float64), y.astype(np.float64))
    check_indices(a.numpy(), Vs, "argkmin", dtype)
    sm = f_scal(Vi(xt), Vj(yt)).sumsoftmaxweight(Vj(wt), dim=1)
    assert sm.shape == (31, 2) and sm.dtype == tdt
    check("sumsoftmaxweight", sm.numpy(), Vs, wj.astype(np.float64)[None], dtype)
    lse = f_scal(Vi(xt), Vj(yt)).logsumexp(dim=1)
    assert lse.shape == (31, 1) and lse.dtype == tdt


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_numpy_in_numpy_out(dtype, rng):
    x, y, _wi, _wj = make_data(rng, 12, 20, dtype=dtype)
    F = f_vec(Vi(x), Vj(y))
    for res in (F.sum(dim=1), F.min(dim=0), F.argKmin(K, dim=1)):
        assert isinstance(res, np.ndarray)
    assert F.sum(dim=1).dtype == np.dtype(dtype) and F.sum(dim=1).shape == (12, 3)
    assert F.min(dim=0).shape == (20, 3)
    assert F.argKmin(K, dim=1).dtype == np.int64 and F.argKmin(K, dim=1).shape == (12, K, 3)
    assert f_scal(Vi(x), Vj(y)).Kmin(K, dim=1).shape == (12, K)
    assert f_scal(Vi(x), Vj(y)).max_sumshiftexp(dim=1).shape == (12, 2)


def _layouts(x):
    """Non-contiguous views with the values of x (N, D)."""
    t = np.ascontiguousarray(x.T).T  # transposed view (Fortran order)
    flipped = np.flip(np.ascontiguousarray(x[::-1]), axis=0)  # negative row stride
    big = np.zeros((x.shape[0] * 2, x.shape[1] * 3), dtype=x.dtype)
    big[::2, ::3] = x
    strided = big[::2, ::3]
    return {
        "transposed": t,
        "flipped": flipped,
        "strided": strided,
        "flipped_cols": np.flip(np.ascontiguousarray(x[:, ::-1]), axis=1),
    }


@pytest.mark.parametrize("name", ["sum", "argkmin", "max_argmax", "logsumexp_weight"])
def test_non_contiguous_numpy_inputs(name, rng):
    x, y, wi, wj = make_data(rng, 33, 41, dtype="float64")
    F0, w0, V, W = lazy_and_dense(name, x, y, wi, wj, 1)
    expected = run(name, F0, 1, w0)
    lx, ly, lw = _layouts(x), _layouts(y), _layouts(wj)
    for kind in lx:
        assert not lx[kind].flags.c_contiguous
        vec = name in VECTOR_OK
        F = (f_vec if vec else f_scal)(Vi(lx[kind]), Vj(ly[kind]))
        res = run(name, F, 1, Vj(lw[kind]) if name in WEIGHTED else None)
        check(name, res, V, W, "float64", f"{name} {kind}")
        for a, b in zip(
            res if isinstance(res, tuple) else [res],
            expected if isinstance(expected, tuple) else [expected],
        ):
            np.testing.assert_array_equal(a, b)
    # broadcast (stride 0) rows: every row of x is the same
    x0 = np.broadcast_to(x[:1], x.shape)
    F = f_vec(Vi(x0), Vj(y))
    out = F.sum(dim=1, backend="cpu")
    np.testing.assert_allclose(
        out, np.broadcast_to(dense_vec(x[:1], y).sum(1), out.shape), rtol=1e-12
    )


def test_non_contiguous_torch_inputs(rng):
    import torch

    x, y, _wi, _wj = make_data(rng, 33, 41, dtype="float32")
    V = dense_vec(x.astype(np.float64), y.astype(np.float64))
    xt = torch.from_numpy(np.ascontiguousarray(x.T)).t()  # transposed
    ybig = torch.zeros(82, 3)
    ybig[::2] = torch.from_numpy(y)
    yt = ybig[::2]  # row stride 2
    assert not xt.is_contiguous() and not yt.is_contiguous()
    F = f_vec(Vi(xt), Vj(yt))
    check("sum", F.sum(dim=1).numpy(), V, None, "float32")
    check("argkmin", F.argKmin(K, dim=1).numpy(), V, None, "float32")
    x1 = torch.from_numpy(x[:1]).expand(33, 3)  # stride 0
    F1 = f_vec(Vi(x1), Vj(yt))
    check(
        "sum",
        F1.sum(dim=1).numpy(),
        dense_vec(np.repeat(x[:1], 33, 0).astype(np.float64), y.astype(np.float64)),
        None,
        "float32",
    )


@pytest.mark.parametrize("N,M", [(1, 1), (1, 7), (7, 1), (257, 7), (7, 257), (3, 300)])
def test_small_and_odd_sizes(N, M, rng):
    x, y, wi, wj = make_data(rng, N, M, dtype="float32")
    for name in ("sum", "min_argmin", "logsumexp"):
        for axis in (1, 0):
            F, w, V, W = lazy_and_dense(name, x, y, wi, wj, axis)
            check(name, run(name, F, axis, w), V, W, "float32", f"{name} N={N} M={M} axis={axis}")
    Kk = min(M, K)
    F = f_vec(Vi(x), Vj(y))
    vals, idx = F.Kmin_argKmin(Kk, dim=1, backend="cpu")
    assert idx.shape == vals.shape == (N, Kk, 3)
    Vd = dense_vec(x.astype(np.float64), y.astype(np.float64))
    want = np.sort(Vd, axis=1, kind="stable")[:, :Kk]
    np.testing.assert_allclose(vals, want, atol=1e-5)
    np.testing.assert_allclose(np.take_along_axis(Vd, idx, 1), want, atol=1e-5)


# ------------------------------------------------------------------ threads and split-j


@pytest.mark.parametrize("name", ALL)
def test_many_columns_few_rows_split_j(name, rng, monkeypatch):
    """N=3, M=200000: the kernel splits j across threads and merges partial accumulators."""
    monkeypatch.setenv("LAZYTENSOR_NUM_THREADS", "4")
    dtype = "float32"
    x, y, wi, wj = make_data(rng, 3, 200_000, dtype=dtype)
    F, w, V, W = lazy_and_dense(name, x, y, wi, wj, 1)
    res = run(name, F, 1, w)
    if dtype == "float32" and name in (
        "logsumexp",
        "logsumexp_weight",
        "sumsoftmaxweight",
        "max_sumshiftexp",
        "max_sumshiftexp_weight",
    ):
        # float32 accumulators over 200000 terms: a looser bound than for 257 terms
        outs = list(res) if isinstance(res, tuple) else [res]
        for out, ref in zip(outs, dense(name, V, W)):
            check_values(out, ref, scale(name, V, W), 2e-4, name)
        return
    check(name, res, V, W, dtype, f"{name} split-j")


def test_many_rows_threads(rng, monkeypatch):
    """N=5000, M=3000: OpenMP over blocks of rows; Gaussian kernel product and K-NN."""
    monkeypatch.setenv("LAZYTENSOR_NUM_THREADS", "4")
    N, M = 5000, 3000
    x = rng.uniform(-1, 1, (N, 3)).astype(np.float32)
    y = rng.uniform(-1, 1, (M, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, (M, 2)).astype(np.float32)
    K_ = (-Vi(x).sqdist(Vj(y)) * 4).exp()
    out = K_ @ b
    idx = (Vi(x).sqdist(Vj(y))).argKmin(3, dim=1)
    x64, y64, b64 = x.astype(np.float64), y.astype(np.float64), b.astype(np.float64)
    for i0 in range(0, N, 1000):
        D2 = ((x64[i0 : i0 + 1000, None, :] - y64[None]) ** 2).sum(-1)
        Kd = np.exp(-4 * D2)
        check_values(out[i0 : i0 + 1000], Kd @ b64, Kd @ np.abs(b64), 1e-5, "gaussian")
        ref = np.argsort(D2, axis=1, kind="stable")[:, :3]
        got = np.take_along_axis(D2, idx[i0 : i0 + 1000], 1)
        np.testing.assert_allclose(got, np.take_along_axis(D2, ref, 1), atol=1e-5)


# ------------------------------------------------------------------ sum schemes and accumulators


@pytest.mark.parametrize("scheme", ["direct_sum", "block_sum", "kahan_scheme"])
def test_sum_schemes_and_accumulator_dtype(scheme, rng, monkeypatch):
    monkeypatch.setenv("LAZYTENSOR_NUM_THREADS", "2")
    # positive terms of very different sizes: float32 rounding of a naive sum shows
    x = rng.uniform(0.5, 1.0, (3, 1)).astype(np.float32)
    y = rng.uniform(0.0, 1.0, (100_000, 1)).astype(np.float32) ** 3
    F = Vi(x) * Vj(y) + 1e-3
    exact = (x.astype(np.float64) * y.astype(np.float64).T + np.float32(1e-3)).sum(1)[:, None]
    rel = {}
    for acc in ("float32", "float64", "auto"):
        out = F.sum(dim=1, sum_scheme=scheme, dtype_acc=acc)
        assert out.dtype == np.float32 and out.shape == (3, 1)
        rel[acc] = np.abs(out - exact).max() / exact.max()
    assert rel["float64"] < 1e-6 and rel["auto"] < 1e-6
    if scheme == "kahan_scheme":
        assert rel["float32"] < 1e-6  # compensated float32 is as good as float64
    elif scheme == "block_sum":
        assert rel["float32"] < 1e-5  # per-tile partial sums keep the error small
    else:
        assert rel["float32"] < 1e-2
    out = F.sum(dim=1, sum_scheme=scheme, use_double_acc=True)
    assert np.abs(out - exact).max() / exact.max() < 1e-6
    with pytest.raises(ValueError, match="sum_scheme"):
        F.sum(dim=1, sum_scheme="pairwise")
    with pytest.raises(ValueError, match="dtype_acc"):
        F.sum(dim=1, dtype_acc="float16")


def test_sum_scheme_float64_and_over_i(rng):
    x, y, _wi, _wj = make_data(rng, 70, 90, dtype="float64")
    F = f_vec(Vi(x), Vj(y))
    V = dense_vec(x, y)
    for scheme in ("direct_sum", "kahan_scheme"):
        check("sum", F.sum(dim=1, sum_scheme=scheme), V, None, "float64", scheme)
        check("sum", F.sum(dim=0, sum_scheme=scheme), np.swapaxes(V, 0, 1), None, "float64", scheme)


# ------------------------------------------------------------------ checks before running


def test_invalid_reduction_arguments(rng):
    x, y, _wi, wj = make_data(rng, 5, 6)
    F = f_vec(Vi(x), Vj(y))
    with pytest.raises(ValueError, match="scalar"):
        F.logsumexp(dim=1)
    # weighted reductions need a scalar formula: concat(F, w) must not split F silently
    with pytest.raises(ValueError, match="scalar"):
        F.logsumexp(dim=1, weight=Vj(wj))
    with pytest.raises(ValueError, match="scalar"):
        F.sumsoftmaxweight(Vj(wj), dim=1)
    with pytest.raises(ValueError, match="scalar"):
        F.max_sumshiftexp(dim=1)
    with pytest.raises(ValueError, match="K"):
        F.argKmin(7, dim=1)
    with pytest.raises(ValueError, match="K"):
        F.Kmin(0, dim=1)
    with pytest.raises(ValueError, match="dim"):
        F.sum(dim=3)
    with pytest.raises(ValueError, match="dim=0"):  # F.sum() is the vector sum, as pykeops
        F.sum_reduction()
    with pytest.raises(ValueError, match="unknown reduction"):
        reductions.get("median")
