"""K.dense(): materialising a LazyTensor on purpose, by chunks of rows, within max_bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lazytensor import LazyTensor, Pm, Vi, Vj
from lazytensor.api import materialize


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("chunk", [7, 1 << 22])
def test_dense_matches_numpy_with_batches_vectors_and_parameters(dtype, chunk, rng, monkeypatch):
    monkeypatch.setattr(materialize, "CHUNK_ELEMENTS", chunk)  # 7: one row per chunk
    x = rng.random((2, 9, 1, 3)).astype(dtype)
    y = rng.random((1, 1, 5, 3)).astype(dtype)
    p = rng.random(3).astype(dtype)
    K = (LazyTensor(x) - LazyTensor(y)) * Pm(p) + 0.5  # a vector formula, batch (2,)
    want = (x - y) * p + 0.5
    got = K.dense()
    assert got.dtype == np.dtype(dtype) and got.shape == K.shape == (2, 9, 5, 3)
    np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == "float32" else 1e-14)
    S = (-(LazyTensor(x) - LazyTensor(y)).sqnorm2()).exp()  # scalar: shape (2, 9, 5)
    np.testing.assert_allclose(S.dense(), np.exp(-((x - y) ** 2).sum(-1)),
                               rtol=1e-6 if dtype == "float32" else 1e-14)


def test_dense_of_torch_data_is_differentiable_and_keeps_dtype(rng, monkeypatch):
    monkeypatch.setattr(materialize, "CHUNK_ELEMENTS", 11)
    x = torch.tensor(rng.random((8, 2)), requires_grad=True)
    y = torch.tensor(rng.random((6, 2)), requires_grad=True)
    G = (-Vi(x).sqdist(Vj(y))).exp().dense()
    dense = torch.exp(-((x[:, None] - y[None]) ** 2).sum(-1))
    w = torch.tensor(rng.random((8, 6)))
    got = torch.autograd.grad((G * w).sum(), [x, y])
    want = torch.autograd.grad((dense * w).sum(), [x, y])
    for g, h in zip(got, want):
        torch.testing.assert_close(g, h, rtol=1e-12, atol=1e-14)
    assert Vi(x.float()).sqdist(Vj(y.float())).dense().dtype == torch.float32


def test_dense_refuses_above_max_bytes_and_with_ranges(rng):
    x = rng.random((50, 2))
    K = Vi(x).sqdist(Vj(x))  # 50 x 50 float64: 20,000 bytes
    assert K.dense(max_bytes=20_000).shape == (50, 50)
    with pytest.raises(ValueError, match=r"shape \(50, 50\), float64: 19.5 KiB.*max_bytes=19999"):
        K.dense(max_bytes=19_999)
    with pytest.raises(TypeError, match="max_bytes must be a number"):
        K.dense(max_bytes="1GB")
    K.ranges = (np.array([[0, 50]]), np.array([[0, 1]]), np.array([[0, 1]]),
                np.array([[0, 50]]), np.array([[0, 1]]), np.array([[0, 1]]))
    with pytest.raises(ValueError, match="block-sparse ranges"):
        K.dense()


def test_dense_of_a_formula_of_constants():
    K = LazyTensor(2.0).exp()
    assert K.shape == (1, 1)
    np.testing.assert_allclose(K.dense(), [[np.exp(2.0)]])
