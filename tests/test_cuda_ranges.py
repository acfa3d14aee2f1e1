"""Block-sparse ranges on the CUDA backend: one launch, a block of threads per piece of a
block of rows, against the CPU backend (itself checked against dense float64 in
test_ranges_kernel.py) on a GPU or the emulator.

Patterns with every edge: a single-row block, a block longer than a block of threads (cut
into pieces), gaps (rows without pairs), a block without intervals, empty, repeated and
out-of-order intervals, N not a multiple of the block size; every reduction in float32 and
float64, each kernel scheme (direct, wide sums, wide softmax, chunked), batch dimensions,
gradients (the transposed ranges), NumPy arrays on the GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import (
    GPU_REDUCTIONS,
    assert_gpu_close,
    clustered_pattern,
    expected,
    gpu_reduction,
)

from lazytensor import LazyTensor, Vi, Vj
from lazytensor.scale.cluster import (
    cluster_ranges_centroids,
    from_matrix,
    grid_cluster,
    sort_clusters,
)
from lazytensor.scale.ranges import BlockRanges

pytestmark = [pytest.mark.cuda]

DTYPES = [torch.float32, torch.float64]


def edge_ranges(rng, N: int, M: int):
    """A forward pattern (the transposed half empty) with every edge case: blocks of 1,
    N - 130 (longer than a block of threads) and the rest, in shuffled order, a gap of rows,
    a block without intervals, intervals empty, repeated and out of order."""
    assert N > 160 and M > 20
    blocks = [(0, 1), (1, 9), (12, 30), (30, N - 130), (N - 130, N)]  # rows 9-11: a gap
    ivs = []
    for k, _ in enumerate(blocks):
        own = []
        if k == 2:  # a block without intervals
            ivs.append(own)
            continue
        for _ in range(int(rng.integers(1, 4))):
            s = int(rng.integers(0, M - 1))
            own.append((s, int(rng.integers(s + 1, M + 1))))
        own.append((int(rng.integers(0, M)),) * 2)  # empty
        own.append(own[0])  # repeated: counted twice
        ivs.append([own[q] for q in rng.permutation(len(own))])
    order = rng.permutation(len(blocks))
    red = [iv for k in order for iv in ivs[k]]
    slices = np.cumsum([len(ivs[k]) for k in order])
    empty = np.zeros((0, 2), np.int64)
    return (np.array([blocks[k] for k in order], np.int64), slices.astype(np.int64),
            np.array(red, np.int64), empty, np.zeros(0, np.int64), empty)


def _data(rng, N, M, dtype, E=2):
    x = torch.from_numpy(rng.standard_normal((N, 3))).to(dtype)
    y = torch.from_numpy(rng.standard_normal((M, 3))).to(dtype)
    b = torch.from_numpy(rng.standard_normal((M, E))).to(dtype)
    return x, y, b


def _one_launch(gpu):
    if gpu.emulated:
        assert len([line for line in gpu.emu.launch_log() if "lt_reduce" in line]) == 1
        assert not [line for line in gpu.emu.launch_log() if "lt_merge" in line]
        gpu.emu.clear_launch_log()


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", GPU_REDUCTIONS)
def test_every_reduction_with_ranges_matches_cpu(gpu, name, dtype, rng):
    N, M = 300, 70
    x, y, b = _data(rng, N, M, dtype)
    ranges = edge_ranges(rng, N, M)
    want = gpu_reduction(name, x, y, b, "cpu", ranges=ranges)
    if gpu.emulated:
        gpu.emu.clear_launch_log()
    got = gpu_reduction(name, gpu.to(x), gpu.to(y), gpu.to(b), "auto", ranges=ranges)
    _one_launch(gpu)
    assert_gpu_close(gpu, got, want, dtype, x, y)


def test_sums_and_kmin_against_dense_float64(gpu, rng):
    """The GPU against the dense oracle itself: a sum and a K-min with padded blocks."""
    N, M = 200, 40
    x, y, b = _data(rng, N, M, torch.float64, E=1)
    ranges = edge_ranges(rng, N, M)
    d2 = ((x[:, None] - y[None]) ** 2).sum(-1).numpy()[..., None]
    got = gpu_reduction("sum", gpu.to(x), gpu.to(y), gpu.to(b), "auto", ranges=ranges)
    want, _ = expected(np.exp(-d2) * b.numpy()[None], ranges, "sum")
    np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-12, atol=1e-12)
    vals, idx = Vi(gpu.to(x)).sqdist(Vj(gpu.to(y))).Kmin_argKmin(8, dim=1, ranges=ranges)
    want, want_i = expected(d2, ranges, "kmin", K=8)
    np.testing.assert_allclose(vals.cpu().numpy(), want, rtol=1e-12)
    np.testing.assert_array_equal(idx.cpu().numpy(), want_i)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_max_sumshiftexp_with_ranges(gpu, dtype, rng):
    """The row pass of log-sum-exp gradients (max and sum of shifted exponentials)."""
    from lazytensor.scale import ranges as ranges_module

    N, M = 200, 50
    x, y, _ = _data(rng, N, M, dtype)
    pattern = edge_ranges(rng, N, M)

    def run(x, y, backend):
        F = -Vi(x).sqdist(Vj(y))
        return ranges_module.reduce(F.formula, F.variables, "max_sumshiftexp", 1, {}, backend,
                                    None, pattern)

    assert_gpu_close(gpu, run(gpu.to(x), gpu.to(y), "auto"), run(x, y, "cpu"), dtype)


@pytest.mark.parametrize("scheme", ["wide", "wide_softmax", "wide_lse", "chunked"])
def test_kernel_schemes_with_ranges(gpu, scheme, rng):
    """K @ V (several threads per row: pieces of fewer rows), attention and weighted
    log-sum-exp with wide values, vector sums chunked through shared memory."""
    N, M = 230, 60
    x = torch.from_numpy(rng.standard_normal((N, 40)) / 6).float()
    y = torch.from_numpy(rng.standard_normal((M, 40)) / 6).float()
    v = torch.from_numpy(rng.standard_normal((M, 24))).float()
    ranges = edge_ranges(rng, N, M)

    def run(x, y, v, backend):
        small = Vi(x[:, :3]).sqdist(Vj(y[:, :3]))
        if scheme == "wide":
            return ((-small).exp() * Vj(v)).sum(dim=1, ranges=ranges, backend=backend)
        if scheme == "wide_softmax":
            return (Vi(x) | Vj(y)).sumsoftmaxweight(Vj(v), dim=1, ranges=ranges,
                                                   backend=backend)
        if scheme == "wide_lse":
            return (-small).logsumexp(dim=1, weight=Vj(v.abs() + 0.1), ranges=ranges,
                                      backend=backend)
        return (-Vi(x).sqdist(Vj(y))).exp().sum(dim=1, ranges=ranges, backend=backend)

    assert_gpu_close(gpu, run(gpu.to(x), gpu.to(y), gpu.to(v), "auto"), run(x, y, v, "cpu"),
                     torch.float32)


@pytest.mark.parametrize("grad_mode, dtype", [("symbolic", torch.float32),
                                               ("dual", torch.float64)], ids=["symbolic-f32", "dual-f64"])
def test_batch_dimensions_and_gradients(gpu, dtype, grad_mode, rng):
    """The same ranges in every batch element (y broadcast); gradients of x, y, b and a
    parameter: reductions over i with the transposed ranges, and the fused (dual) form."""
    B, N, M = 2, 150, 110
    ranges, mask = clustered_pattern(rng, N, M)
    xs = rng.standard_normal((B, N, 1, 2))
    ys, bs = rng.standard_normal((1, 1, M, 2)), rng.standard_normal((B, 1, M, 1))

    def grads(to, backend):
        x, y, b = (to(torch.from_numpy(a).to(dtype)).requires_grad_() for a in (xs, ys, bs))
        s = to(torch.tensor([0.8], dtype=dtype)).requires_grad_()
        K = (-LazyTensor(x).sqdist(LazyTensor(y)) * LazyTensor(s, axis=2)).exp()
        out = (K * LazyTensor(b)).sum(dim=2, ranges=ranges, backend=backend,
                                      grad_mode=grad_mode)
        lse = (-LazyTensor(x).sqdist(LazyTensor(y))).logsumexp(
            dim=1, ranges=ranges, backend=backend, grad_mode=grad_mode)
        ok = torch.from_numpy(mask.any(0))  # columns that see a row
        loss = (out ** 2).sum() + lse[:, ok].sum()
        return (out, lse, *torch.autograd.grad(loss, [x, y, b, s]))

    got = grads(gpu.to, "auto")
    want = grads(lambda t: t, "cpu")
    for g, w in zip(got, want):
        assert_gpu_close(gpu, g.detach(), w.detach(), dtype)


def test_numpy_arrays_on_the_gpu_with_ranges(gpu, rng):
    N, M = 180, 50
    x, y = rng.random((N, 3)), rng.random((M, 3))
    ranges = edge_ranges(rng, N, M)
    for fn in ("sum", "argmin"):
        got = getattr(Vi(x).sqdist(Vj(y)), fn)(dim=1, ranges=ranges, backend="gpu")
        want = getattr(Vi(x).sqdist(Vj(y)), fn)(dim=1, ranges=ranges, backend="cpu")
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_pieces_cover_each_block_within_a_block_of_threads(rng):
    r = BlockRanges.build(edge_ranges(rng, 300, 40), 300, 40)
    for rows in (1, 32, 96, 256):
        p = r.pieces(rows)
        assert p[0, 0] == 0 and p[-1, 1] == 300 and np.all(p[1:, 0] == p[:-1, 1])
        assert np.all((p[:, 1] - p[:, 0] <= rows) & (p[:, 1] > p[:, 0]))
        for i0, i1, s0, s1 in r.blocks:  # each piece keeps its block's intervals
            inside = (p[:, 0] >= i0) & (p[:, 1] <= i1)
            assert p[inside, 1].max() == i1 and np.all(p[inside, 2:] == (s0, s1))


# ------------------------------------------------- clustered points (sizes for a GPU)


def _clusters(n: int, seed: int, dtype):
    """Points in the unit cube sorted by grid cell, their cluster ranges and centroids."""
    x = torch.rand(n, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    x, lab = sort_clusters(x, grid_cluster(x, 0.2))
    r, c, _ = cluster_ranges_centroids(x, lab)
    return x.to(dtype), r, c


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", GPU_REDUCTIONS)
def test_clustered_ranges_match_cpu(gpu, name, dtype):
    n, m = (400, 300) if gpu.emulated else (5000, 4000)
    x, rx, cx = _clusters(n, 1, dtype)
    y, ry, cy = _clusters(m, 2, dtype)
    ranges = from_matrix(rx, ry, ((cx[:, None] - cy[None]) ** 2).sum(-1) < 0.35 ** 2)
    b = torch.randn(m, 2, generator=torch.Generator().manual_seed(3), dtype=dtype)
    want = gpu_reduction(name, x, y, b, "cpu", ranges=ranges)
    got = gpu_reduction(name, gpu.to(x), gpu.to(y), gpu.to(b), "auto", ranges=ranges)
    assert_gpu_close(gpu, got, want, dtype, x, y)


def test_gpu_check_ranges_cases(gpu):
    """``make gpu-check``'s block-sparse case (forward and gradients, float32), at a small
    scale, passes its own error check against the CPU backend."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    try:
        from tools import gpu_cases, gpu_check
    finally:
        sys.path.pop(0)
    ranged = [c for c in gpu_cases.cases(scale=0.004) if c.name.startswith("ranges")]
    assert {c.dtype for c in ranged} == {"float32", "float64"}
    for case in [c for c in ranged if c.dtype == "float32"]:
        t_cpu = case.inputs(torch, torch.Generator().manual_seed(0))
        got = case.lazy({k: gpu.to(v) for k, v in t_cpu.items()}, "cuda")
        want = case.lazy(t_cpu, "cpu")
        assert gpu_check._error(case, t_cpu, got, want) <= gpu_check.TOL[case.dtype]
