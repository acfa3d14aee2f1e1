"""Block-sparse reductions (``ranges``) and the clustering helpers, against dense masked
NumPy/torch computations in float64."""

from __future__ import annotations

import numpy as np
import pytest

from lazytensor import Genred, LazyTensor, Vi, Vj
from lazytensor.scale.cluster import (
    cluster_centroids,
    cluster_ranges,
    cluster_ranges_centroids,
    from_matrix,
    grid_cluster,
    sort_clusters,
    swap_axes,
)


def _clustered(rng, N, M, D=2, cell=0.25, radius=0.45, lib="numpy", dtype=np.float64):
    """Sorted points, the ranges of a grid clustering, and the (N, M) mask of kept pairs."""
    x = rng.random((N, D)).astype(dtype)
    y = rng.random((M, D)).astype(dtype)
    b = rng.standard_normal((M, 2)).astype(dtype)
    x, xl = sort_clusters(x, grid_cluster(x, cell))
    (y, b), yl = sort_clusters((y, b), grid_cluster(y, cell))
    rx, cx, _ = cluster_ranges_centroids(x, xl)
    ry, cy, _ = cluster_ranges_centroids(y, yl)
    keep = ((cx[:, None, :] - cy[None, :, :]) ** 2).sum(-1) < radius**2
    mask = keep[xl][:, yl]
    ranges = from_matrix(rx, ry, keep)
    if lib == "torch":
        import torch

        x, y, b = (torch.from_numpy(a) for a in (x, y, b))
        ranges = tuple(torch.from_numpy(np.asarray(r)).int() for r in ranges)
    return x, y, b, ranges, mask


def _dense_d2(x, y):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_kernel_product_both_axes(lib, rng):
    x, y, b, ranges, mask = _clustered(rng, 300, 250, lib=lib, dtype=np.float32)
    assert 0.05 < mask.mean() < 0.95  # a real block-sparse pattern
    K = (-Vi(x).sqdist(Vj(y)) / 0.05).exp()
    K.ranges = ranges
    Kd = np.exp(-_dense_d2(x, y) / 0.05) * mask
    bd = np.asarray(b, np.float64)
    out = K @ b
    assert type(out) is type(b) and tuple(out.shape) == (300, 2)
    np.testing.assert_allclose(np.asarray(out), Kd @ bd, rtol=2e-5, atol=2e-5)
    # over i: the transposed ranges; and through K.t()
    u = np.asarray(rng.standard_normal((300, 1)), np.float32)
    U = u if lib == "numpy" else __import__("torch").from_numpy(u)
    np.testing.assert_allclose(np.asarray((K * Vi(U)).sum(dim=0)), Kd.T @ u, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(K.t() @ U), Kd.T @ u, rtol=2e-5, atol=2e-5)
    # the keyword form, on a LazyTensor without the attribute
    K2 = (-Vi(x).sqdist(Vj(y)) / 0.05).exp()
    np.testing.assert_allclose(np.asarray((K2 * Vj(b)).sum(dim=1, ranges=ranges)), Kd @ bd,
                               rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(K2 @ b), np.exp(-_dense_d2(x, y) / 0.05) @ bd,
                               rtol=2e-5, atol=2e-5)  # no ranges: the full product


def test_selections_and_lse_with_empty_blocks(rng):
    x, y, b, ranges, mask = _clustered(rng, 200, 180, cell=0.2, radius=0.25)
    # rows of no block (drop the first i-cluster from the ranges) and blocks with no j
    r = list(ranges)
    s0 = int(r[1][0])
    r[0], r[1], r[2] = r[0][1:], r[1][1:] - s0, r[2][s0:]
    first_rows = ranges[0][0]
    mask = mask.copy()
    mask[first_rows[0]:first_rows[1]] = False
    assert (mask.sum(1) == 0).any() and (mask.sum(1) > 0).any()
    D = Vi(x).sqdist(Vj(y))
    Dd = np.where(mask, _dense_d2(x, y), np.inf)
    K = 5
    vals, idx = D.Kmin_argKmin(K, dim=1, ranges=tuple(r))
    order = np.argsort(Dd, axis=1, kind="stable")[:, :K]
    want_v = np.take_along_axis(Dd, order, 1)
    want_i = np.where(np.isfinite(want_v), order, -1)  # fewer than K points: -1, +inf
    np.testing.assert_array_equal(idx, want_i)
    np.testing.assert_allclose(vals, want_v, rtol=1e-12)
    m, am = D.min_argmin(dim=1, ranges=tuple(r))
    np.testing.assert_allclose(m[:, 0], Dd.min(1), rtol=1e-12)
    has = mask.any(1)
    np.testing.assert_array_equal(am[has, 0], Dd.argmin(1)[has])
    assert np.all(am[~has, 0] == -1)
    lse = (-D).logsumexp(dim=1, ranges=tuple(r))[:, 0]
    with np.errstate(divide="ignore"):
        want = np.log((np.exp(-_dense_d2(x, y)) * mask).sum(1))
    np.testing.assert_allclose(lse, want, rtol=1e-12, atol=1e-13)
    w = (-D).logsumexp(dim=1, weight=Vj(np.abs(b) + 0.1), ranges=tuple(r))
    with np.errstate(divide="ignore"):
        want_w = np.log((np.exp(-_dense_d2(x, y)) * mask) @ (np.abs(b) + 0.1))
    np.testing.assert_allclose(w, want_w, rtol=1e-12, atol=1e-13)
    s = (-D).sumsoftmaxweight(Vj(b), dim=1, ranges=tuple(r))
    P = np.exp(-_dense_d2(x, y)) * mask
    with np.errstate(invalid="ignore"):
        want_s = (P @ b) / P.sum(1, keepdims=True)
    np.testing.assert_allclose(s[has], want_s[has], rtol=1e-10, atol=1e-12 * np.abs(b).max())
    assert np.isnan(s[~has]).all()


def test_repeated_and_unordered_intervals(rng):
    x, y = rng.random((7, 1)), rng.random((9, 1))
    b = rng.standard_normal((9, 1))
    ranges_i = np.array([[4, 7], [0, 3]])  # blocks in any order; row 3 in none
    slices_i = np.array([2, 4])
    red_j = np.array([[5, 9], [5, 7], [0, 2], [2, 4]])  # [5, 7) twice; [0, 2) + [2, 4) merge
    ranges = (ranges_i, slices_i, red_j, np.zeros((0, 2), int), np.zeros(0, int),
              np.zeros((0, 2), int))
    out = (Vi(x) * Vj(y) * Vj(b)).sum(dim=1, ranges=ranges)
    P = x * y.T * b.T
    want = np.zeros((7, 1))
    want[4:7, 0] = P[4:7, 5:9].sum(1) + P[4:7, 5:7].sum(1)
    want[0:3, 0] = P[0:3, 0:4].sum(1)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-13 * np.abs(P).sum())
    idx = (Vi(x) * Vj(y)).argmax(dim=1, ranges=ranges)
    np.testing.assert_array_equal(idx[4:7, 0], 5 + np.argmax(P[4:7, 5:9] / b[5:9, 0], 1))
    assert idx[3, 0] == -1


def test_gradients_through_ranges(rng):
    torch = pytest.importorskip("torch")
    x, y, b, ranges, mask = _clustered(rng, 120, 100, lib="torch")
    x.requires_grad_(True)
    y.requires_grad_(True)
    b.requires_grad_(True)
    s = torch.tensor([0.3], dtype=torch.float64, requires_grad=True)
    K = (-Vi(x).sqdist(Vj(y)) / LazyTensor(s, axis=2)).exp()
    K.ranges = ranges
    out = K @ b
    g = torch.randn_like(out)
    grads = torch.autograd.grad((out * g).sum(), (x, y, b, s), create_graph=True)
    Kd = torch.exp(-((x[:, None] - y[None]) ** 2).sum(-1) / s) * torch.from_numpy(mask)
    want = torch.autograd.grad(((Kd @ b) * g).sum(), (x, y, b, s), create_graph=True)
    for a, w in zip(grads, want):
        torch.testing.assert_close(a, w, rtol=1e-9, atol=1e-10)
    # second order through the same path
    h1 = torch.autograd.grad(grads[0].square().sum(), x)[0]
    h2 = torch.autograd.grad(want[0].square().sum(), x)[0]
    torch.testing.assert_close(h1, h2, rtol=1e-8, atol=1e-9)
    # LSE over i with gradient
    lse = (-Vi(x).sqdist(Vj(y))).logsumexp(dim=0, ranges=ranges)
    (gx,) = torch.autograd.grad(lse.sum(), x)
    d2 = ((x[:, None] - y[None]) ** 2).sum(-1)
    ref = torch.logsumexp(torch.where(torch.from_numpy(mask), -d2, -torch.inf), dim=0)
    (gx_ref,) = torch.autograd.grad(ref[torch.isfinite(ref)].sum(), x)
    torch.testing.assert_close(lse[:, 0][torch.isfinite(ref)], ref[torch.isfinite(ref)])
    torch.testing.assert_close(gx, gx_ref)


def test_genred_ranges(rng):
    x, y, b, ranges, mask = _clustered(rng, 90, 80)
    g = np.array([2.0])
    f = Genred("Exp(-g * SqDist(x, y)) * b", ["x = Vi(2)", "y = Vj(2)", "b = Vj(2)", "g = Pm(1)"],
               reduction_op="Sum", axis=1)
    Kd = np.exp(-2.0 * _dense_d2(x, y)) * mask
    tol = 1e-12 * (Kd @ np.abs(b)).max()  # signed sums: relative to the terms' size
    np.testing.assert_allclose(f(x, y, b, g, ranges=ranges), Kd @ b, rtol=1e-12, atol=tol)
    f0 = Genred("Exp(-g * SqDist(x, y)) * a", ["x = Vi(2)", "y = Vj(2)", "a = Vi(1)", "g = Pm(1)"],
                reduction_op="Sum", axis=0)
    a = rng.standard_normal((90, 1))
    np.testing.assert_allclose(f0(x, y, a, g, ranges=ranges), Kd.T @ a, rtol=1e-12,
                               atol=1e-12 * (Kd.T @ np.abs(a)).max())


def test_ranges_errors(rng):
    x, y = rng.random((10, 2)), rng.random((12, 2))
    F = Vi(x).sqdist(Vj(y))
    ok = (np.array([[0, 10]]), np.array([1]), np.array([[0, 12]]),
          np.array([[0, 12]]), np.array([1]), np.array([[0, 10]]))
    np.testing.assert_allclose(F.sum(dim=1, ranges=ok), F.sum(dim=1))
    with pytest.raises(ValueError, match="6 integer arrays"):
        F.sum(dim=1, ranges=ok[:3])
    bad = list(ok)
    bad[2] = np.array([[0, 13]])
    with pytest.raises(ValueError, match=r"redranges_j\[0\] = \[0, 13\].*\[0, 12\]"):
        F.sum(dim=1, ranges=tuple(bad))
    bad = list(ok)
    bad[0], bad[1] = np.array([[0, 6], [5, 10]]), np.array([1, 1])
    with pytest.raises(ValueError, match="overlap"):
        F.sum(dim=1, ranges=tuple(bad))
    bad = list(ok)
    bad[1] = np.array([2])
    with pytest.raises(ValueError, match="slices_i"):
        F.sum(dim=1, ranges=tuple(bad))
    bad = list(ok)
    bad[5] = np.array([[0.0, 10.0]])
    with pytest.raises(TypeError, match="redranges_i must hold integers"):
        F.sum(dim=0, ranges=tuple(bad))
    Fb = LazyTensor(rng.random((3, 10, 1, 2))).sqdist(LazyTensor(rng.random((3, 1, 12, 2))))
    np.testing.assert_allclose(Fb.sum(dim=2, ranges=ok), Fb.sum(dim=2))  # batch: each element


def test_cluster_helpers(rng):
    x = rng.random((500, 4))  # grid_cluster works in any dimension
    lab = grid_cluster(x, 0.5)
    cells = np.floor((x - x.min(0)) / 0.5).astype(int)
    for i in range(0, 500, 37):  # same label <=> same cell
        np.testing.assert_array_equal(lab == lab[i], (cells == cells[i]).all(1))
    assert set(np.unique(lab)) == set(range(lab.max() + 1))
    xs, ls = sort_clusters(x, lab)
    assert np.all(np.diff(ls) >= 0)
    r = cluster_ranges(ls)
    for k, (s, e) in enumerate(r):
        assert np.all(ls[s:e] == k)
        np.testing.assert_allclose(cluster_centroids(xs, ls)[k], xs[s:e].mean(0))
    w = rng.random(500)
    r2, c2, wc = cluster_ranges_centroids(xs, ls, weights=w)
    np.testing.assert_array_equal(r2, r)
    k = 3
    s, e = r[k]
    np.testing.assert_allclose(c2[k], (xs[s:e] * w[s:e, None]).sum(0) / w[s:e].sum())
    np.testing.assert_allclose(wc[k], w[s:e].sum())
    keep = rng.random((len(r), len(r))) < 0.3
    ranges = from_matrix(r, r, keep)
    assert swap_axes(swap_axes(ranges)) == ranges
    with pytest.raises(ValueError, match="keep has shape"):
        from_matrix(r, r[:-1], keep)


def test_cluster_helpers_torch_match_numpy(rng):
    torch = pytest.importorskip("torch")
    x = rng.random((300, 3))
    lab = grid_cluster(x, 0.3)
    lab_t = grid_cluster(torch.from_numpy(x), 0.3)
    np.testing.assert_array_equal(lab_t.numpy(), lab)
    xs, ls = sort_clusters(x, lab)
    xs_t, ls_t = sort_clusters(torch.from_numpy(x), lab_t)
    np.testing.assert_array_equal(xs_t.numpy(), xs)
    out_np = cluster_ranges_centroids(xs, ls)
    out_t = cluster_ranges_centroids(xs_t, ls_t)
    for a, t in zip(out_np, out_t):
        np.testing.assert_allclose(t.numpy(), a)
    keep = rng.random((len(out_np[0]),) * 2) < 0.4
    for a, t in zip(from_matrix(out_np[0], out_np[0], keep),
                    from_matrix(out_t[0], out_t[0], torch.from_numpy(keep))):
        np.testing.assert_array_equal(t.numpy(), a)


def test_solve_with_ranges(rng):
    """CG on a block-sparse kernel (a symmetric pattern: clusters near each other)."""
    torch = pytest.importorskip("torch")
    x, _, _, _, _ = _clustered(rng, 150, 1)
    lab = grid_cluster(x, 0.25)
    r, c, _ = cluster_ranges_centroids(x, lab)
    keep = ((c[:, None] - c[None]) ** 2).sum(-1) < 0.3**2
    ranges = from_matrix(r, r, keep)
    mask = keep[lab][:, lab]
    b = rng.standard_normal((150, 1))
    K = (-Vi(x).sqdist(Vj(x)) / 0.02).exp()
    K.ranges = ranges
    a = K.solve(b, alpha=0.5, eps=1e-10)
    Kd = np.exp(-_dense_d2(x, x) / 0.02) * mask
    np.testing.assert_allclose(a, np.linalg.solve(Kd + 0.5 * np.eye(150), b), rtol=1e-6, atol=1e-8)
    # differentiable, through the ranges too
    xt = torch.from_numpy(x).requires_grad_(True)
    bt = torch.from_numpy(b).requires_grad_(True)
    Kt = (-Vi(xt).sqdist(Vj(xt)) / 0.02).exp()
    Kt.ranges = ranges
    gx, gb = torch.autograd.grad(Kt.solve(bt, alpha=0.5, eps=1e-12).square().sum(), (xt, bt))
    Kdt = torch.exp(-((xt[:, None] - xt[None]) ** 2).sum(-1) / 0.02) * torch.from_numpy(mask)
    ref = torch.linalg.solve(Kdt + 0.5 * torch.eye(150, dtype=torch.float64), bt)
    rx, rb = torch.autograd.grad(ref.square().sum(), (xt, bt))
    torch.testing.assert_close(gx, rx, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(gb, rb, rtol=1e-6, atol=1e-8)
    # KernelSolve with ranges
    from lazytensor import KernelSolve

    Kinv = KernelSolve("Exp(-SqDist(x, y) * g) * v", ["x = Vi(2)", "y = Vj(2)", "v = Vj(1)",
                                                      "g = Pm(1)"], "v", axis=1)
    a2 = Kinv(x, x, b, np.array([50.0]), alpha=0.5, eps=1e-10, ranges=ranges)
    np.testing.assert_allclose(a2, a, rtol=1e-6, atol=1e-8)
