"""Max_SumShiftExpWeight, KeOps's (m, s) with m = max_j f and s = Σ_j exp(f - m) w_j,
against float64 NumPy: on the CPU (float32, float64), through the dense reference, by its
pykeops names (Genred, ``reduction``), with block-sparse ranges, merged over j-blocks,
with Dask, over the ranks of a process group, and under the CUDA emulator."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_gpu_close  # noqa: E402

from lazytensor import Genred, Vi, Vj
from lazytensor.engine import plans as engine
from lazytensor.scale import blocks


def data(rng, N=37, M=53, D=3, E=2, dtype=np.float64):
    x, y = rng.random((N, D)).astype(dtype), rng.random((M, D)).astype(dtype)
    w = (rng.standard_normal((M, E)) + 0.5).astype(dtype)  # signed weights
    return x, y, w


def expected(x, y, w, mask=None):
    """(m, s) in float64: m = max_j f, s = Σ_j exp(f - m) w_j, f = -4 |x - y|²."""
    f = -4 * ((x[:, None].astype(np.float64) - y[None]) ** 2).sum(-1)
    if mask is not None:
        f = np.where(mask, f, -np.inf)
    m = f.max(1)
    s = np.exp(f - m[:, None]) @ w.astype(np.float64)
    return np.concatenate([m[:, None], s], 1)


def lazy(x, y, w, **kw):
    return (-Vi(x).sqdist(Vj(y)) * 4).max_sumshiftexpweight(Vj(w), dim=1, **kw)


def close(got, want, rtol):
    got = np.asarray(got, np.float64)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("backend", ["cpu", "numpy"])  # numpy: the dense reference
def test_against_numpy(backend, dtype, rng):
    x, y, w = data(rng, N=int(rng.integers(1, 80)), M=int(rng.integers(1, 700)), dtype=dtype)
    got = lazy(x, y, w, backend=backend)
    assert got.shape == (len(x), 3) and got.dtype == dtype
    close(got, expected(x, y, w), 2e-5 if dtype == np.float32 else 1e-12)


def test_pykeops_spellings(rng):
    x, y, w = data(rng)
    want = expected(x, y, w)
    g = Genred("-IntCst(4) * SqDist(x, y)", ["x = Vi(3)", "y = Vj(3)", "w = Vj(2)"],
               reduction_op="Max_SumShiftExpWeight", axis=1, formula2="w")
    close(g(x, y, w), want, 1e-12)
    K = -Vi(x).sqdist(Vj(y)) * 4
    close(K.reduction("Max_SumShiftExpWeight", other=Vj(w), dim=1), want, 1e-12)
    close(K.max_sumshiftexpweight_reduction(Vj(w), dim=1), want, 1e-12)
    with pytest.raises(ValueError, match="needs formula2"):
        Genred("x", ["x = Vi(3)"], reduction_op="Max_SumShiftExpWeight", axis=1)
    with pytest.raises(ValueError, match="scalar formula"):
        (Vi(x) - Vj(y)).max_sumshiftexpweight(Vj(w), dim=1)


def test_with_ranges(rng):
    from lazytensor.scale.cluster import (
        cluster_ranges_centroids,
        from_matrix,
        grid_cluster,
        sort_clusters,
    )

    x, y, w = data(rng, 200, 150, D=2)
    x, xl = sort_clusters(x, grid_cluster(x, 0.25))
    (y, w), yl = sort_clusters((y, w), grid_cluster(y, 0.25))
    rx, cx, _ = cluster_ranges_centroids(x, xl)
    ry, cy, _ = cluster_ranges_centroids(y, yl)
    keep = ((cx[:, None] - cy[None]) ** 2).sum(-1) < 0.45 ** 2
    keep[:, 0] = True  # every row keeps a block: no empty reduction
    mask = keep[xl][:, yl]
    assert 0.05 < mask.mean() < 0.95
    close(lazy(x, y, w, ranges=from_matrix(rx, ry, keep)), expected(x, y, w, mask), 1e-12)


def test_merged_over_blocks(rng):
    x, y, w = data(rng)
    K = (-Vi(x).sqdist(Vj(y)) * 4).concat(Vj(w))
    cuts = np.sort(rng.integers(0, 54, size=5))
    got = blocks.split_reduce(K.formula, K.variables, "max_sumshiftexp_weight", 1, {},
                              [0, *cuts.tolist(), 53])
    close(got, expected(x, y, w), 1e-12)
    one = engine.reduce(K.formula, K.variables, "max_sumshiftexp_weight", 1, {})
    close(got, np.asarray(one), 1e-12)


def test_with_dask(rng):
    da = pytest.importorskip("dask.array")
    from lazytensor import dask as ltdask

    x, y, w = data(rng, 40, 90)
    out = ltdask.reduce(lambda a, b, c: (-Vi(a).sqdist(Vj(b)) * 4, Vj(c)),
                        da.from_array(x, chunks=15), da.from_array(y, chunks=20),
                        da.from_array(w, chunks=20), reduction="Max_SumShiftExpWeight")
    close(out.compute(), expected(x, y, w), 1e-12)


def _ranks(rank, world, report, seed):
    from test_distributed import compare, shard_sizes

    import lazytensor.distributed as ltd

    rng = np.random.default_rng(seed)
    N, M = 23, 31
    x, y, w = data(rng, N, M)
    n_sizes = shard_sizes(rng, N, world)
    m_sizes = shard_sizes(rng, M, world, empty_rank=1 if world > 2 else None)
    n0, m0 = sum(n_sizes[:rank]), sum(m_sizes[:rank])
    rows, cols = slice(n0, n0 + n_sizes[rank]), slice(m0, m0 + m_sizes[rank])
    want = expected(x, y, w)[rows]
    for mode in ("ring", "allgather"):
        with ltd.sharded(mode=mode):
            got = lazy(torch.tensor(x[rows]), torch.tensor(y[cols]), torch.tensor(w[cols]))
        compare(report, f"max_sumshiftexpweight ({mode})", [got], [torch.tensor(want)])


@pytest.mark.distributed
def test_over_the_ranks_of_a_process_group(rng):
    from test_distributed import assert_all_ok, launch

    assert_all_ok(launch(_ranks, 3, int(rng.integers(1 << 30))), 3)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_on_the_gpu(gpu, dtype, rng):
    x, y, w = (torch.from_numpy(a) for a in data(rng, 150, 300, dtype=dtype))
    got = lazy(gpu.to(x), gpu.to(y), gpu.to(w))
    assert_gpu_close(gpu, got, lazy(x, y, w, backend="cpu"), str(np.dtype(dtype)))
