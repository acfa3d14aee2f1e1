"""The CUDA backend on a GPU: results against the CPU backend (marked ``cuda``).

Skipped where torch sees no CUDA device or nvcc is absent. Run on a GPU machine with
``python -m pytest -m cuda tests/test_cuda_runtime.py``. Float32 kernels are compiled with
fast math, so float32 values are compared to 1e-4 (relative to the largest value) and
float32 indices by the value they attain.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lazytensor.codegen.compilers import nvcc_path

from lazytensor import LazyTensor, Vi, Vj

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda)"),
    pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found (CUDA toolkit)"),
]

RTOL = {torch.float32: 1e-4, torch.float64: 1e-10}
INDEXED = {"argmin", "argkmin", "min_argmin", "kmin_argkmin", "argmax", "max_argmax"}


def _run(name, x, y, b, backend, ranges=None):
    opts = {"dim": 1, "backend": backend} if ranges is None else {
        "dim": 1, "backend": backend, "ranges": ranges}
    d2 = Vi(x).sqdist(Vj(y))
    if name == "sum":
        return ((-d2).exp() * Vj(b)).sum(**opts)
    if name == "logsumexp":
        return (-d2).logsumexp(**opts)
    if name == "logsumexp_weight":
        return (-d2).logsumexp(weight=Vj(b.abs()), **opts)
    if name == "sumsoftmaxweight":
        return (-d2).sumsoftmaxweight(Vj(b), **opts)
    if name in ("min", "max", "argmin", "argmax", "min_argmin", "max_argmax"):
        return getattr(d2, name)(**opts)
    if name in ("kmin", "argkmin", "kmin_argkmin"):
        fn = {"kmin": "Kmin", "argkmin": "argKmin", "kmin_argkmin": "Kmin_argKmin"}[name]
        return getattr(d2, fn)(5, **opts)
    raise AssertionError(name)


def _compare(got, want, dtype, x=None, y=None):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        assert g.is_cuda and g.dtype == w.dtype and g.shape == w.shape
        g = g.cpu()
        if w.dtype == torch.int64:
            if dtype == torch.float64:
                assert torch.equal(g, w)
            else:  # float32 near-ties may pick another index: compare the values attained
                d_g = ((x[:, None, :] - y[g.reshape(g.shape[0], -1)]) ** 2).sum(-1)
                d_w = ((x[:, None, :] - y[w.reshape(w.shape[0], -1)]) ** 2).sum(-1)
                assert torch.allclose(d_g, d_w, rtol=1e-4, atol=1e-5)
        else:
            assert torch.equal(g.isnan(), w.isnan())
            g, w = g.nan_to_num(), w.nan_to_num()
            scale = w.abs().max().clamp(min=1e-30)
            assert ((g - w).abs().max() / scale).item() <= RTOL[dtype]


NAMES = ["sum", "logsumexp", "logsumexp_weight", "sumsoftmaxweight", "min", "max", "argmin",
         "argmax", "min_argmin", "max_argmax", "kmin", "argkmin", "kmin_argkmin"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("N, M", [(3000, 2000), (7, 100_000)], ids=["1d", "split"])
@pytest.mark.parametrize("name", NAMES)
def test_reduction_cuda_matches_cpu(name, N, M, dtype):
    g = torch.Generator().manual_seed(N + M)
    x = torch.rand(N, 3, generator=g, dtype=dtype)
    y = torch.rand(M, 3, generator=g, dtype=dtype)
    b = torch.randn(M, 2, generator=g, dtype=dtype)
    want = _run(name, x, y, b, "cpu")
    got = _run(name, x.cuda(), y.cuda(), b.cuda(), "auto")
    _compare(got, want, dtype, x, y)


def test_batched_broadcast():
    x = torch.randn(2, 1, 3, 500, 1, 3, dtype=torch.float64)
    y = torch.randn(1, 4, 1, 1, 700, 3, dtype=torch.float64)
    s = torch.rand(2, 4, 1, 1, 1, 1, dtype=torch.float64) + 0.5

    def run(x, y, s, backend):
        K = (-LazyTensor(x).sqdist(LazyTensor(y)) * LazyTensor(s)).exp()
        return K.sum(dim=4, backend=backend), K.argmax(dim=3, backend=backend)

    got = run(x.cuda(), y.cuda(), s.cuda(), "cuda")
    want = run(x, y, s, "cpu")
    _compare(got[0], want[0], torch.float64)
    _compare(got[1], want[1], torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_gradients(dtype):
    x0, y0 = torch.rand(2000, 3, dtype=dtype), torch.rand(3000, 3, dtype=dtype)
    b0 = torch.randn(3000, 2, dtype=dtype)

    def grads(device, backend):
        x, y, b = (t.to(device).requires_grad_() for t in (x0, y0, b0))
        K = (-Vi(x).sqdist(Vj(y)) * 4).exp()
        loss = ((K * Vj(b)).sum(dim=1, backend=backend) ** 2).sum()
        loss = loss + (-Vi(x).sqdist(Vj(y))).logsumexp(dim=1, backend=backend).sum()
        loss = loss + Vi(x).sqdist(Vj(y)).min(dim=1, backend=backend).sum()
        return torch.autograd.grad(loss, [x, y, b])

    for g, w in zip(grads("cuda", "auto"), grads("cpu", "cpu")):
        _compare(g, w, dtype)


def test_large_dimension_and_knn():
    x = torch.randn(1500, 784) / 28
    y = torch.randn(2500, 784) / 28
    want = Vi(x).sqdist(Vj(y)).argKmin(10, dim=1, backend="cpu")
    got = Vi(x.cuda()).sqdist(Vj(y.cuda())).argKmin(10, dim=1)
    _compare(got, want, torch.float32, x, y)
    want = (-Vi(x).sqdist(Vj(y))).exp().sum(dim=1, backend="cpu")
    _compare((-Vi(x.cuda()).sqdist(Vj(y.cuda()))).exp().sum(dim=1), want, torch.float32)


def test_runs_on_the_current_stream():
    x = torch.rand(20000, 3, device="cuda")
    y = torch.rand(20000, 3, device="cuda")
    want = (-Vi(x).sqdist(Vj(y))).exp().sum(dim=1)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        x2 = x * 1.0  # queued on s: the kernel must run after it
        got = (-Vi(x2).sqdist(Vj(y))).exp().sum(dim=1)
    s.synchronize()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)


def test_numpy_backend_with_cuda_tensors():
    x = torch.rand(100, 3, device="cuda", dtype=torch.float64)
    got = Vi(x).sqdist(Vj(x)).sum(dim=1, backend="numpy")
    want = Vi(x).sqdist(Vj(x)).sum(dim=1, backend="cuda")
    assert got.is_cuda
    torch.testing.assert_close(got, want)


def test_empty_and_tiny_sizes():
    x = torch.rand(1, 3, device="cuda", dtype=torch.float64)
    y = torch.rand(0, 3, device="cuda", dtype=torch.float64)
    assert Vi(x).sqdist(Vj(y)).sum(dim=1).cpu().tolist() == [[0.0]]
    assert Vi(x).sqdist(Vj(y)).min(dim=1).cpu().tolist() == [[np.inf]]
    got = Vi(x).sqdist(Vj(x)).sum(dim=1)
    assert got.cpu().tolist() == [[0.0]]


def _clusters(n: int, seed: int):
    """Points in the unit cube sorted by grid cell, and ranges keeping near cells."""
    from lazytensor.torch.cluster import cluster_ranges_centroids, grid_cluster, sort_clusters

    x = torch.rand(n, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    x, lab = sort_clusters(x, grid_cluster(x, 0.2))
    r, c, _ = cluster_ranges_centroids(x, lab)
    return x, r, c


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", NAMES)
def test_ranges_cuda_matches_cpu(name, dtype):
    x, rx, cx = _clusters(5000, 1)
    y, ry, cy = _clusters(4000, 2)
    keep = ((cx[:, None] - cy[None]) ** 2).sum(-1) < 0.35**2
    from lazytensor.torch.cluster import from_matrix

    ranges = from_matrix(rx, ry, keep)
    x, y = x.to(dtype), y.to(dtype)
    b = torch.randn(4000, 2, dtype=dtype)
    want = _run(name, x, y, b, "cpu", ranges)
    got = _run(name, x.cuda(), y.cuda(), b.cuda(), "auto", ranges)
    _compare(got, want, dtype, x, y)


def test_ranges_batch_and_gradients():
    x0, rx, cx = _clusters(3000, 3)
    y0, ry, cy = _clusters(2000, 4)
    from lazytensor.torch.cluster import from_matrix

    ranges = from_matrix(rx, ry, ((cx[:, None] - cy[None]) ** 2).sum(-1) < 0.35**2)
    b0 = torch.randn(2, 1, 2000, 1, dtype=torch.float64)
    x0 = torch.stack([x0, x0.flip(-1)])[:, :, None]  # batch of 2, the same ranges

    def grads(device):
        x, y, b = (t.to(device).requires_grad_() for t in (x0, y0[None, None], b0))
        K = (-LazyTensor(x).sqdist(LazyTensor(y)) * 9).exp() * LazyTensor(b)
        out = K.sum(dim=2, ranges=ranges)
        lse = (-LazyTensor(x).sqdist(LazyTensor(y)) * 9).logsumexp(dim=1, ranges=ranges)
        loss = (out ** 2).sum() + lse.nan_to_num(neginf=0).sum()
        return (out, *torch.autograd.grad(loss, [x, y, b]))

    for g, w in zip(grads("cuda"), grads("cpu")):
        _compare(g, w, torch.float64)
