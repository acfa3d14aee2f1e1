"""Block-sparse ranges inside one kernel launch: random patterns (gaps, blocks in any
order, intervals out of order, repeated or empty, blocks larger than a work item), every
family of reduction, both kernel paths (pair loop, dot products, weighted sums of wide
vectors), batch dimensions and gradients, against dense float64 NumPy/torch."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import clustered_pattern, expected, random_ranges

from lazytensor import LazyTensor, Vi, Vj
from lazytensor.scale.cluster import from_matrix
from lazytensor.scale.ranges import BlockRanges


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_random_patterns_every_reduction(rng, dtype):
    N, M, D = 700, 300, 3  # a block of > 256 rows is cut into several work items
    x = rng.standard_normal((N, D)).astype(dtype)
    y = rng.standard_normal((M, D)).astype(dtype)
    ranges = random_ranges(rng, N, M)
    d2 = ((x[:, None].astype(np.float64) - y[None]) ** 2).sum(-1)[..., None]
    tol = dict(rtol=3e-5, atol=3e-5) if dtype == "float32" else dict(rtol=1e-11, atol=1e-11)
    S = Vi(x).sqdist(Vj(y))
    want, _ = expected(np.exp(-d2), ranges, "sum")
    np.testing.assert_allclose((-S).exp().sum(dim=1, ranges=ranges), want, **tol)
    want, want_i = expected(d2, ranges, "min")
    got, got_i = S.min_argmin(dim=1, ranges=ranges)
    np.testing.assert_allclose(got, want, **tol)
    np.testing.assert_array_equal(got_i, want_i)
    want, want_i = expected(d2, ranges, "max")
    got, got_i = S.max_argmax(dim=1, ranges=ranges)
    np.testing.assert_allclose(got, want, **tol)
    np.testing.assert_array_equal(got_i, want_i)
    want, want_i = expected(d2, ranges, "kmin", K=6)  # blocks with fewer points pad
    got, got_i = S.Kmin_argKmin(6, dim=1, ranges=ranges)
    np.testing.assert_allclose(got, want, **tol)
    np.testing.assert_array_equal(got_i, want_i)
    want, _ = expected(-d2, ranges, "lse")
    np.testing.assert_allclose((-S).logsumexp(dim=1, ranges=ranges), want, **tol)
    # the NumPy reference backend follows the same pattern
    np.testing.assert_allclose((-S).logsumexp(dim=1, ranges=ranges, backend="numpy"), want,
                               **tol)


def test_vector_formulas_dot_products_and_wide_sums(rng):
    """F = 3 values, D = 32 (dot-product tiles, rows packed per item), K @ V with 40
    columns (weighted sums of j-vectors), F = 20 wide pair loop."""
    N, M = 400, 500
    ranges = random_ranges(rng, N, M, n_blocks=5)
    x, y = rng.standard_normal((N, 32)) / 4, rng.standard_normal((M, 32)) / 4
    v = rng.standard_normal((M, 40))
    d2 = ((x[:, None] - y[None]) ** 2).sum(-1)
    K = (-Vi(x).sqdist(Vj(y))).exp()
    for got, vals in (
            (K @ v, np.exp(-d2)[..., None] * v[None]),
            ((K * Vj(v[:, :3])).sum(dim=1, ranges=ranges), np.exp(-d2)[..., None] * v[None, :, :3]),
            ((Vi(x[:, :20]) * Vj(y[:, :20])).sum(dim=1, ranges=ranges),
             x[:, None, :20] * y[None, :, :20])):
        if got.shape[1] == 40:
            K.ranges = ranges
            got = K @ v
        want, _ = expected(vals, ranges, "sum")
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    got, got_i = Vi(x).sqdist(Vj(y)).min_argmin(dim=1, ranges=ranges)
    want, want_i = expected(d2[..., None], ranges, "min")
    np.testing.assert_allclose(got, want, rtol=1e-10)
    np.testing.assert_array_equal(got_i, want_i)


def test_batch_dimensions(rng):
    """The same ranges in every batch element, broadcast batch dimensions included."""
    B, N, M = 3, 120, 90
    x = rng.standard_normal((B, N, 1, 2))
    y = rng.standard_normal((1, M, 2))[:, None]  # broadcast along the batch
    b = rng.standard_normal((B, 1, M, 1))
    ranges = random_ranges(rng, N, M, n_blocks=4)
    K = (-LazyTensor(x).sqdist(LazyTensor(y))).exp() * LazyTensor(b)
    out = K.sum(dim=2, ranges=ranges)
    assert out.shape == (B, N, 1)
    for k in range(B):
        vals = np.exp(-((x[k, :, 0][:, None] - y[0, 0][None]) ** 2).sum(-1))[..., None] * b[k, 0][None]
        want, _ = expected(vals, ranges, "sum")
        np.testing.assert_allclose(out[k], want, rtol=1e-11, atol=1e-12)
    idx = LazyTensor(x).sqdist(LazyTensor(y)).argKmin(3, dim=2, ranges=ranges)
    for k in range(B):
        d2 = ((x[k, :, 0][:, None] - y[0, 0][None]) ** 2).sum(-1)[..., None]
        np.testing.assert_array_equal(idx[k], expected(d2, ranges, "kmin", K=3)[1])


@pytest.mark.parametrize("grad_mode", ["symbolic", "dual"])
def test_gradients_with_batch_and_both_modes(rng, grad_mode):
    torch = pytest.importorskip("torch")
    B, N, M = 2, 90, 70
    ranges, mask = clustered_pattern(rng, N, M)
    x = torch.from_numpy(rng.standard_normal((B, N, 1, 2))).requires_grad_(True)
    y = torch.from_numpy(rng.standard_normal((B, 1, M, 2))).requires_grad_(True)
    b = torch.from_numpy(rng.standard_normal((B, 1, M, 1))).requires_grad_(True)
    s = torch.tensor([0.7], dtype=torch.float64, requires_grad=True)
    K = (-LazyTensor(x).sqdist(LazyTensor(y)) * LazyTensor(s, axis=2)).exp() * LazyTensor(b)
    out = K.sum(dim=2, ranges=ranges, grad_mode=grad_mode)
    g = torch.randn_like(out)
    grads = torch.autograd.grad((out * g).sum(), (x, y, b, s))
    Kd = torch.exp(-((x - y) ** 2).sum(-1) * s) * torch.from_numpy(mask)
    dense = (Kd[..., None] * b).sum(2)
    torch.testing.assert_close(out, dense, rtol=1e-10, atol=1e-12)
    want = torch.autograd.grad((dense * g).sum(), (x, y, b, s))
    for a, w in zip(grads, want):
        torch.testing.assert_close(a, w, rtol=1e-9, atol=1e-11)
    # log-sum-exp over i, and its gradient (the transposed pattern forward, the pattern back)
    lse = (-LazyTensor(x).sqdist(LazyTensor(y))).logsumexp(dim=1, ranges=ranges,
                                                          grad_mode=grad_mode)
    d2 = ((x - y) ** 2).sum(-1)
    ref = torch.logsumexp(torch.where(torch.from_numpy(mask), -d2, -torch.inf), dim=1)
    ok = torch.isfinite(ref)
    torch.testing.assert_close(lse[..., 0][ok], ref[ok])
    gx, gy = torch.autograd.grad(lse[..., 0][ok].sum(), (x, y))
    rx, ry = torch.autograd.grad(ref[ok].sum(), (x, y))
    torch.testing.assert_close(gx, rx)
    torch.testing.assert_close(gy, ry)


def test_block_ranges_normalization():
    # gaps become empty blocks, touching intervals join, empty ones go, order is kept
    r = BlockRanges.build((np.array([[5, 8], [1, 3]]), np.array([3, 4]),
                           np.array([[4, 6], [6, 7], [0, 0], [2, 3]]),
                           np.zeros((0, 2), int), np.zeros(0, int), np.zeros((0, 2), int)),
                          9, 10)
    assert r.blocks.tolist() == [[0, 1, 0, 0], [1, 3, 1, 2], [3, 5, 0, 0], [5, 8, 0, 1],
                                 [8, 9, 0, 0]]
    assert r.intervals.tolist() == [[4, 7], [2, 3]]
    assert r.pairs == 3 * 3 + 2 * 1
    assert r.t().blocks.tolist() == [[0, 10, 0, 0]] and r.t().pairs == 0  # no transposed pairs
    bad = BlockRanges.build((np.array([[0, 9]]), np.array([1]), np.array([[0, 10]]),
                             np.array([0, 10]), np.array([1]), np.array([[0, 9]])), 9, 10)
    with pytest.raises(ValueError, match="ranges_j must have shape"):
        bad.t()  # the transposed half is checked when a gradient needs it


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_ranges_changed_in_place_are_read_again(rng, library):
    """The pattern of the same arrays is kept between calls, not once they change."""
    N, M = 60, 50
    x, y = rng.standard_normal((N, 2)), rng.standard_normal((M, 2))
    ranges = [np.array(a) for a in random_ranges(rng, N, M, n_blocks=3)]
    if library == "torch":
        torch = pytest.importorskip("torch")
        ranges = [torch.from_numpy(a) for a in ranges]
    S = Vi(x).sqdist(Vj(y))
    d2 = ((x[:, None] - y[None]) ** 2).sum(-1)[..., None]
    for _ in range(3):
        got = S.sum(dim=1, ranges=tuple(ranges))
        want, _ = expected(d2, [np.asarray(a) for a in ranges], "sum")
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        red = ranges[2]  # the same objects, new contents
        red[:, 0] = red[:, 0] // 2


@pytest.mark.parametrize("grad_mode", ["symbolic", "dual"])
def test_rows_without_pairs_have_finite_gradients(rng, grad_mode):
    """A cluster of rows that keeps no pair: log-sum-exp -inf there, its rows out of the
    loss, the gradients of the others finite and exact (dual mode: no 0/0 tangent)."""
    torch = pytest.importorskip("torch")
    N, M = 60, 50
    ri, rj = np.array([[0, 20], [20, 60]]), np.array([[0, 10], [10, 30], [30, 50]])
    keep = np.array([[True, False, True], [False, False, True]])  # j cluster 1: no i
    ranges = from_matrix(ri, rj, keep)
    mask = np.repeat(np.repeat(keep, [20, 40], 0), [10, 20, 20], 1)
    x = torch.from_numpy(rng.standard_normal((N, 2))).requires_grad_(True)
    y = torch.from_numpy(rng.standard_normal((M, 2))).requires_grad_(True)
    lse = (-Vi(x).sqdist(Vj(y))).logsumexp(dim=0, ranges=ranges, grad_mode=grad_mode)[:, 0]
    d2 = ((x[:, None] - y[None]) ** 2).sum(-1)
    ref = torch.logsumexp(torch.where(torch.from_numpy(mask), -d2, -torch.inf), dim=0)
    ok = torch.from_numpy(mask.any(0))
    assert not ok[10:30].any() and torch.isinf(lse[10:30]).all()
    torch.testing.assert_close(lse[ok], ref[ok])
    got = torch.autograd.grad(lse[ok].sum(), (x, y))
    want = torch.autograd.grad(ref[ok].sum(), (x, y))
    for a, w in zip(got, want):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, w)


def test_torch_func_vmap_and_jvp_follow_the_ranges(rng):
    """vmap: the same ranges in every vmapped element; jvp: the directional derivative
    sums over the kept pairs only (against dense masked torch)."""
    torch = pytest.importorskip("torch")
    N, M = 70, 60
    ranges, mask = clustered_pattern(rng, N, M)
    xs = torch.from_numpy(rng.standard_normal((4, N, 2)))
    y = torch.from_numpy(rng.standard_normal((M, 2)))
    m = torch.from_numpy(mask)

    def ranged(x):
        return (-Vi(x).sqdist(Vj(y))).exp().sum(dim=1, ranges=ranges)

    def dense(x):
        return (torch.exp(-((x[:, None] - y[None]) ** 2).sum(-1)) * m).sum(1, keepdim=True)

    got = torch.func.vmap(ranged)(xs)
    torch.testing.assert_close(got, torch.stack([dense(x) for x in xs]))
    t = torch.from_numpy(rng.standard_normal((N, 2)))
    _, jv = torch.func.jvp(ranged, (xs[0],), (t,))
    _, want = torch.func.jvp(dense, (xs[0],), (t,))
    torch.testing.assert_close(jv, want)
