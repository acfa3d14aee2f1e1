"""lazytensor.dask: reductions of chunked Dask arrays equal one process's, on the threaded
scheduler (uneven chunks, the reduced side broadcast or chunked, both axes, every merge
family), the process scheduler and a dask.distributed LocalCluster with two workers."""

import numpy as np
import pytest

da = pytest.importorskip("dask.array")

from lazytensor import Pm, Vi, Vj  # noqa: E402
from lazytensor import dask as ltdask  # noqa: E402


def uneven_chunks(rng, n, parts):
    cuts = np.sort(rng.choice(np.arange(1, n), size=parts - 1, replace=False))
    return tuple(np.diff([0, *cuts, n]).tolist())


def check(got, want, rtol=1e-12):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.dtype == np.int64:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * np.abs(w).max())


def data(rng, N=157, M=203, D=3):
    return rng.random((N, D)), rng.random((M, D)), rng.standard_normal((M, 2)), rng.random(1) + 1


def gauss(x, y, b, p):
    return (-Vi(x).sqdist(Vj(y)) * Pm(p)).exp() * Vj(b)


def dist(x, y, b, p):
    return Vi(x).sqdist(Vj(y)) * Pm(p)


CASES = [  # (reduction, formula, options, one-process result from LazyTensors)
    ("sum", gauss, {}, lambda K: K.sum(dim=1)),
    ("sum", gauss, {"sum_scheme": "kahan_scheme"},
     lambda K: K.sum(dim=1, sum_scheme="kahan_scheme")),
    ("min_argmin", dist, {}, lambda K: K.min_argmin(dim=1)),
    ("argkmin", dist, {"K": 7}, lambda K: K.argKmin(7, dim=1)),
    ("kmin_argkmin", lambda x, y, b, p: (Vi(x) - Vj(y)).abs(), {"K": 3},
     lambda K: K.Kmin_argKmin(3, dim=1)),
    ("logsumexp", lambda x, y, b, p: -dist(x, y, b, p), {}, lambda K: K.logsumexp(dim=1)),
]


@pytest.mark.parametrize("reduction,formula,opts,one", CASES,
                         ids=[f"{c[0]}{'-' + '-'.join(c[2]) if c[2] else ''}" for c in CASES])
def test_chunked_reductions_equal_one_process_on_threads(reduction, formula, opts, one, rng):
    x, y, b, p = data(rng)
    want = one(formula(x, y, b, p))
    for y_chunks in ((203,), uneven_chunks(rng, 203, 4)):  # y broadcast whole, then chunked
        args = (da.from_array(x, chunks=(uneven_chunks(rng, 157, 3), 3)),
                da.from_array(y, chunks=(y_chunks, 3)), da.from_array(b, chunks=(y_chunks, 2)), p)
        got = ltdask.reduce(formula, *args, reduction=reduction, split_every=2, **opts)
        got = tuple(g.compute(scheduler="threads") for g in got) if isinstance(got, tuple) else \
            got.compute(scheduler="threads")
        check(got, want)


def test_weighted_reductions_and_numpy_reduced_side(rng):
    x, y, b, p = data(rng)
    xd = da.from_array(x, chunks=40)
    for reduction, one in (("logsumexp_weight", lambda f, w: f.logsumexp(dim=1, weight=w)),
                           ("sumsoftmaxweight", lambda f, w: f.sumsoftmaxweight(w, dim=1))):
        w = b + 3.0 if reduction == "logsumexp_weight" else b
        got = ltdask.reduce(lambda x, y, w: (-Vi(x).sqdist(Vj(y)), Vj(w)), xd,
                            da.from_array(y, chunks=60), da.from_array(w, chunks=60),
                            reduction=reduction)
        check(got.compute(scheduler="threads"), one(-Vi(x).sqdist(Vj(y)), Vj(w)))
    got = ltdask.reduce(gauss, xd, y, b, p)  # NumPy y and b: one chunk, sent to every task
    check(got.compute(scheduler="sync"), gauss(x, y, b, p).sum(dim=1))


def test_reduction_over_i_has_the_rows_of_j(rng):
    x, y, b, p = data(rng)
    got = ltdask.reduce(lambda x, y: Vi(x).sqdist(Vj(y)), da.from_array(x, chunks=50),
                        da.from_array(y, chunks=70), reduction="argmin", dim=0)
    assert got.chunks[0] == (70, 70, 63)
    check(got.compute(scheduler="threads"), Vi(x).sqdist(Vj(y)).argmin(dim=0))


def test_float32_chunks_merge_to_float32_results(rng):
    x, y, b, p = (a.astype(np.float32) for a in data(rng))
    got = ltdask.reduce(gauss, da.from_array(x, chunks=50), da.from_array(y, chunks=50),
                        da.from_array(b, chunks=50), p).compute(scheduler="threads")
    assert got.dtype == np.float32
    x64, y64, b64, p64 = (a.astype(np.float64) for a in (x, y, b, p))
    check(got.astype(np.float64), gauss(x64, y64, b64, p64).sum(dim=1), rtol=2e-6)


def test_formulas_the_tasks_cannot_rebuild_are_refused(rng):
    x, y = da.from_array(rng.random((10, 3)), chunks=5), da.from_array(rng.random((8, 3)), chunks=4)
    outside = rng.random((8, 3))
    with pytest.raises(ValueError, match="not one of the arguments"):
        ltdask.reduce(lambda x, y: Vi(x).sqdist(Vj(outside)), x, y)
    with pytest.raises(ValueError, match="must be 2D"):
        ltdask.reduce(lambda x, y: Vi(x).sqdist(Vj(y)), x, da.from_array(rng.random(8), chunks=4))
    with pytest.raises(TypeError, match=r"\(f, weight\)"):
        ltdask.reduce(lambda x, y: Vi(x).sqdist(Vj(y)), x, y, reduction="sumsoftmaxweight")
    with pytest.raises(ValueError, match="K=20 is larger"):
        ltdask.reduce(lambda x, y: Vi(x).sqdist(Vj(y)), x, y, reduction="argkmin", K=20)


@pytest.mark.distributed
def test_process_scheduler_and_a_local_cluster_of_two_workers(rng):
    """The tasks pickle to other processes; on a LocalCluster with 2 worker processes
    sum, argKmin and log-sum-exp equal one process."""
    distributed = pytest.importorskip("distributed")
    x, y, b, p = data(rng, N=300, M=400)
    args = (da.from_array(x, chunks=100), da.from_array(y, chunks=(uneven_chunks(rng, 400, 3), 3)),
            da.from_array(b, chunks=(uneven_chunks(rng, 400, 3), 2)), p)
    want_sum = gauss(x, y, b, p).sum(dim=1)
    sums = ltdask.reduce(gauss, *args)
    import dask

    # forked pool processes (the kernels' runtime is fork-safe); spawned ones cost a
    # fresh interpreter each, which the LocalCluster below pays anyway
    with dask.config.set({"multiprocessing.context": "fork"}):
        check(sums.compute(scheduler="processes", num_workers=2), want_sum)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        idx = ltdask.reduce(dist, *args, reduction="argkmin", K=5)
        lse = ltdask.reduce(lambda x, y, b, p: -dist(x, y, b, p), *args, reduction="logsumexp")
        got = client.compute([sums, idx, lse], sync=True)
        assert len(client.scheduler_info()["workers"]) == 2
    check(got[0], want_sum)
    check(got[1], dist(x, y, b, p).argKmin(5, dim=1))
    check(got[2], (-dist(x, y, b, p)).logsumexp(dim=1))
