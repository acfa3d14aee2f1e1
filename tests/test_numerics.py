"""Numerical quality: long float32 sums, log-sum-exp at large magnitudes, ties, big indices.

Run with ``-s`` to see the figures (relative errors of each summation scheme).
"""

from __future__ import annotations

import numpy as np
import pytest

from lazytensor import Vi, Vj

SCHEMES = ("direct_sum", "block_sum", "kahan_scheme")


@pytest.fixture(scope="module")
def long_sum_data():
    """4 rows against 10^6 positive terms exp(-(x_i - y_j)²), float32, and the float64 sums."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (4, 1)).astype(np.float32)
    y = rng.uniform(-1, 1, (10**6, 1)).astype(np.float32)
    exact = np.exp(-((x.astype(np.float64) - y.astype(np.float64).T) ** 2)).sum(1, keepdims=True)
    return x, y, exact


def _relative_error(got, exact):
    return float(np.abs(got.astype(np.float64) - exact).max() / np.abs(exact).max())


@pytest.mark.parametrize("dtype_acc", ["auto", "float32"])
def test_float32_sums_of_a_million_terms(long_sum_data, dtype_acc):
    x, y, exact = long_sum_data
    K = (-((Vi(x) - Vj(y)) ** 2)).exp()
    errors = {
        s: _relative_error(K.sum(dim=1, sum_scheme=s, dtype_acc=dtype_acc), exact) for s in SCHEMES
    }
    default = _relative_error(K.sum(dim=1), exact)
    print(
        f"\nfloat32, 10^6 positive terms, dtype_acc={dtype_acc}: relative error vs float64: "
        + ", ".join(f"{s} {e:.2e}" for s, e in errors.items())
        + f", default {default:.2e}"
    )
    # the final rounding to float32 alone costs up to 6e-8
    assert default <= 1e-6
    assert errors["kahan_scheme"] <= 1e-6
    assert errors["block_sum"] <= (1e-6 if dtype_acc == "auto" else 1e-5)
    assert errors["direct_sum"] <= (1e-6 if dtype_acc == "auto" else 1e-3)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_logsumexp_is_stable_at_magnitude_1e4(dtype):
    rng = np.random.default_rng(2)
    x = rng.uniform(-100, 100, (50, 1))
    y = rng.uniform(-100, 100, (3000, 1))  # x_i * y_j within ±1e4: exp overflows at ~88 / ~709
    w = rng.uniform(0.5, 2, (3000, 1))
    F = Vi(x.astype(dtype)) * Vj(y.astype(dtype))
    f = x * y.T
    m = f.max(1, keepdims=True)
    exact = m + np.log(np.exp(f - m).sum(1, keepdims=True))
    exact_w = m + np.log((np.exp(f - m) * w.T).sum(1, keepdims=True))
    softmax_w = (np.exp(f - m) * w.T).sum(1, keepdims=True) / np.exp(f - m).sum(1, keepdims=True)
    lse = F.logsumexp(dim=1)
    lse_w = F.logsumexp(dim=1, weight=Vj(w.astype(dtype)))
    ssw = F.sumsoftmaxweight(Vj(w.astype(dtype)), dim=1)
    # float32 inputs are rounded: f itself moves by |f| * 6e-8 ~ 6e-4 at 1e4
    atol = 1e-2 if dtype == "float32" else 1e-9
    f32 = dtype == "float32"
    if f32:  # compare with the exact result of the rounded inputs
        f = x.astype(np.float32).astype(np.float64) * y.astype(np.float32).astype(np.float64).T
        m = f.max(1, keepdims=True)
        wr = w.astype(np.float32).astype(np.float64)
        exact = m + np.log(np.exp(f - m).sum(1, keepdims=True))
        exact_w = m + np.log((np.exp(f - m) * wr.T).sum(1, keepdims=True))
        softmax_w = (np.exp(f - m) * wr.T).sum(1, keepdims=True) / np.exp(f - m).sum(
            1, keepdims=True
        )
    for got in (lse, lse_w, ssw):
        assert np.isfinite(got).all()
    print(
        f"\nlogsumexp at |f| <= 1e4, {dtype}: max abs error {np.abs(lse - exact).max():.2e} "
        f"(weighted {np.abs(lse_w - exact_w).max():.2e}, softmax-weighted "
        f"{np.abs(ssw - softmax_w).max():.2e})"
    )
    np.testing.assert_allclose(lse, exact, rtol=1e-6 if f32 else 1e-13, atol=atol)
    np.testing.assert_allclose(lse_w, exact_w, rtol=1e-6 if f32 else 1e-13, atol=atol)
    np.testing.assert_allclose(ssw, softmax_w, rtol=1e-4 if f32 else 1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ties_go_to_the_lowest_index_across_tiles_threads_and_chunks(dtype, monkeypatch):
    """Equal minima far apart (other tiles, other threads, other split-j chunks)."""
    monkeypatch.setenv("LAZYTENSOR_NUM_THREADS", "4")  # 3 rows, M = 50000: j is split
    M = 50_000
    y = np.full((M, 1), 3.0, dtype=dtype)
    tied = [40_000, 7_000, 30_000, 49_999]
    y[tied, 0] = 1.0
    x = np.array([[0.0], [0.5], [1.0]], dtype=dtype)  # f = (x - y)²: the minima are the 1.0s
    F = (Vi(x) - Vj(y)) ** 2
    for _ in range(3):  # the same answer every time
        np.testing.assert_array_equal(F.argmin(dim=1), [[7_000]] * 3)
        np.testing.assert_array_equal(F.argKmin(3, dim=1), [[7_000, 30_000, 40_000]] * 3)
        np.testing.assert_array_equal(F.min_argmin(dim=1)[1], [[7_000]] * 3)
        np.testing.assert_array_equal((-F).argmax(dim=1), [[7_000]] * 3)
    # all equal: the first K indices; over i as well
    Z = Vi(np.zeros((3, 1), dtype)) * Vj(np.zeros((M, 1), dtype))
    np.testing.assert_array_equal(Z.argKmin(4, dim=1), [[0, 1, 2, 3]] * 3)
    np.testing.assert_array_equal(Z.argmin(dim=0)[[0, -1]], [[0], [0]])
    np.testing.assert_array_equal(((Vj(x) - Vi(y)) ** 2).argKmin(2, dim=0), [[7_000, 30_000]] * 3)


def test_indices_are_exact_beyond_2_to_the_24():
    """float32 data, M = 2^24 + 1000: indices past 2^24 (not representable in float32)."""
    M = 2**24 + 1000
    y = np.full((M, 1), 2.0, dtype=np.float32)
    best = 2**24 + 501  # odd: float32 would round it to an even neighbour
    y[best, 0] = 0.25
    y[best + 2, 0] = 0.25  # a tie, after it
    y[2**24 + 3, 0] = 0.5
    y[2**24 + 997, 0] = 9.0  # the maximum
    x = np.zeros((1, 1), dtype=np.float32)
    F = (Vi(x) - Vj(y)) ** 2
    np.testing.assert_array_equal(F.argmin(dim=1), [[best]])
    np.testing.assert_array_equal(F.argKmin(3, dim=1), [[best, best + 2, 2**24 + 3]])
    values, idx = F.min_argmin(dim=1)
    assert values[0, 0] == np.float32(0.0625) and idx[0, 0] == best
    np.testing.assert_array_equal(F.argmax(dim=1), [[2**24 + 997]])
    assert F.argmin(dim=1).dtype == np.int64


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_a_negative_zero_parameter_is_not_the_cached_positive_zero(lib, rng):
    import torch

    from lazytensor import LazyTensor

    x, y = -rng.uniform(0.5, 2.0, (3, 1)), rng.random((2, 1))
    if lib == "torch":
        x, y = torch.tensor(x), torch.tensor(y)
    (Vi(x) * LazyTensor(0.0) + Vj(y)).sum(dim=1)  # the parameter +0.0, cached as an array
    got = (LazyTensor(-0.0).atan2(Vi(x)) + 0 * Vj(y)).sum(dim=1)
    np.testing.assert_allclose(np.asarray(got), np.full((3, 1), 2 * -np.pi))  # atan2(-0, x<0) = -π
