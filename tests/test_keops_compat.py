"""KeOps users' code, ported by changing the import, against float64 dense references.

Each test is a scenario written the way pykeops's documentation and tutorials write it
(kernel products, K-NN classification, attention, Sinkhorn, kernel ridge regression,
Genred formula strings, gradients, batches, scipy operators), run through lazytensor and
compared with the same computation on the dense N x M matrix in float64. Data are float32
where KeOps users have float32 (tolerances are what float32 sums of a few dozen terms
meet) and float64 for gradients. Sizes are small: what matters is the API, and each new
formula costs a compilation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from lazytensor.codegen.compilers import cpu_compiler

import lazytensor.numpy as ltnp
import lazytensor.torch as ltt
from lazytensor import LazyTensor, Pm, Vi, Vj

pytestmark = pytest.mark.skipif(not cpu_compiler().available, reason="no C++ compiler")

N, M, D = 31, 23, 3


def sqdist(x, y):
    """Dense squared distances (N, M), in the inputs' library and dtype."""
    return ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)


def close(got, ref, rtol, scale=None):
    """max |got - ref| <= rtol * scale (default: max |ref|), in float64."""
    got = got.detach().double().numpy() if torch.is_tensor(got) else np.asarray(got, np.float64)
    ref = ref.detach().double().numpy() if torch.is_tensor(ref) else np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    scale = np.abs(ref).max() if scale is None else scale
    err = np.abs(got - ref).max() if got.size else 0.0
    assert err <= rtol * scale, f"max error {err:.3g} > {rtol:g} x {scale:.3g}"


def _points(rng, dtype=np.float32):
    x = rng.standard_normal((N, D)).astype(dtype)
    y = rng.standard_normal((M, D)).astype(dtype)
    b = rng.standard_normal((M, 2)).astype(dtype)
    return x, y, b


# ---------------------------------------------------------------- kernel products

SIGMA = 0.8
SQRT3 = math.sqrt(3.0)
# name: (LazyTensor kernel of (x_i, y_j), dense float64 NumPy kernel of the (N, M) distances²)
KERNELS = {
    "gaussian": (lambda x_i, y_j: (-((x_i - y_j) ** 2).sum(-1) / (2 * SIGMA**2)).exp(),
                 lambda d2: np.exp(-d2 / (2 * SIGMA**2))),
    "laplacian": (lambda x_i, y_j: (-((x_i - y_j) ** 2).sum(-1).sqrt() / SIGMA).exp(),
                  lambda d2: np.exp(-np.sqrt(d2) / SIGMA)),
    "cauchy": (lambda x_i, y_j: 1 / (1 + x_i.sqdist(y_j) / SIGMA**2),
               lambda d2: 1 / (1 + d2 / SIGMA**2)),
    "matern32": (lambda x_i, y_j: (1 + SQRT3 * (x_i - y_j).norm2() / SIGMA)
                 * (-SQRT3 * (x_i - y_j).norm2() / SIGMA).exp(),
                 lambda d2: (1 + SQRT3 * np.sqrt(d2) / SIGMA) * np.exp(-SQRT3 * np.sqrt(d2) / SIGMA)),
}


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_kernel_product(kernel, lib, rng):
    """``K @ b`` for 2D and 1D b, with 3D leaves and with Vi/Vj, in NumPy and torch."""
    lazy, dense = KERNELS[kernel]
    x, y, b = _points(rng)
    Kd = dense(sqdist(x.astype(np.float64), y.astype(np.float64)))
    wrap = torch.from_numpy if lib == "torch" else np.asarray
    X, Y, B = wrap(x), wrap(y), wrap(b)
    K = lazy(LazyTensor(X[:, None, :]), LazyTensor(Y[None, :, :]))
    assert K.shape == (N, M) and K.ndim == 1
    scale = np.abs(Kd).sum(1).max() * np.abs(b).max()
    out = K @ B
    assert type(out) is type(X) and out.dtype == X.dtype and out.shape == (N, 2)
    close(out, Kd @ b.astype(np.float64), 2e-6, scale)
    out1 = K @ B[:, 0]  # a vector gives a vector
    assert out1.shape == (N,)
    close(out1, Kd @ b[:, 0].astype(np.float64), 2e-6, scale)
    # the same kernel written with Vi/Vj, and summed the other way (K.T @ a = Σ_i K_ij a_i)
    K2 = lazy(Vi(X), Vj(Y))
    close(K2 @ B, Kd @ b.astype(np.float64), 2e-6, scale)
    a = wrap(rng.standard_normal((N, 2)).astype(np.float32))
    close(K2.T @ a, Kd.T @ np.asarray(a, np.float64), 2e-6, np.abs(Kd).sum(0).max() * 3)


def test_sum_dims_and_vector_defaults(rng):
    """``.sum(dim=0/1)`` reduce; ``.sum(dim=2)``, ``.sum(-1)`` and ``.sum()`` are symbolic sums
    over the vector, as in pykeops (so are ``.min()``, ``.max()``, ``.argmin()``)."""
    x, y, _ = _points(rng)
    x_i, y_j = LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :])
    diff = x[:, None, :].astype(np.float64) - y[None, :, :]
    F = (x_i - y_j) ** 2  # (N, M, D)
    assert F.shape == (N, M, D) and F.ndim == D and F.dim() == 3
    close(F.sum(dim=1), (diff**2).sum(1), 1e-6)
    close(F.sum(dim=0), (diff**2).sum(0), 1e-6)
    close(F.sum(axis=1), (diff**2).sum(1), 1e-6)
    for vec in (F.sum(dim=2), F.sum(-1), F.sum(), F.sum(axis=-1)):
        assert isinstance(vec, LazyTensor) and vec.shape == (N, M)
        close(vec.sum(dim=1), (diff**2).sum((1, 2))[:, None], 1e-6)
    G = x_i - y_j
    close(G.min().sum(1), diff.min(2).sum(1, keepdims=True), 1e-5)
    close(G.max(-1).min(0), diff.max(2).min(0)[:, None], 1e-6)
    close(G.argmin().sum(1), diff.argmin(2).sum(1, keepdims=True).astype(np.float64), 0)
    close(G.sum_reduction(dim=1), diff.sum(1), 1e-5, np.abs(diff).sum(1).max())
    with pytest.raises(ValueError, match="dim=0"):
        G.sum_reduction()  # the explicit form always reduces


# ---------------------------------------------------------------- K-NN and min reductions


def test_knn_classification(rng):
    """The pykeops K-NN tutorial: argKmin over j, then a majority vote of the labels."""
    x_train = rng.standard_normal((60, 2))
    labels = (x_train[:, 0] * x_train[:, 1] > 0).astype(np.int64)
    x_test = rng.standard_normal((40, 2))
    X_i = LazyTensor(x_test[:, None, :])
    X_j = LazyTensor(x_train[None, :, :])
    D_ij = ((X_i - X_j) ** 2).sum(-1)
    K = 5
    ind_knn = D_ij.argKmin(K, dim=1)
    assert ind_knn.dtype == np.int64 and ind_knn.shape == (40, K)
    d = sqdist(x_test, x_train)
    np.testing.assert_array_equal(ind_knn, np.argsort(d, axis=1, kind="stable")[:, :K])
    lab_knn = labels[ind_knn]
    pred = (lab_knn.mean(1) > 0.5).astype(np.int64)
    np.testing.assert_array_equal(pred, (labels[np.argsort(d, 1)[:, :K]].mean(1) > 0.5))
    # torch: the same, indices are int64 tensors usable for indexing
    Xt_i, Xt_j = LazyTensor(torch.from_numpy(x_test)[:, None]), LazyTensor(torch.from_numpy(x_train)[None])
    ind_t = ((Xt_i - Xt_j) ** 2).sum(-1).argKmin(K=K, dim=1)
    assert ind_t.dtype == torch.int64
    np.testing.assert_array_equal(torch.from_numpy(labels)[ind_t].numpy(), lab_knn)
    # min / argmin / min_argmin / Kmin_argKmin, over j and over i
    np.testing.assert_allclose(D_ij.min(dim=1)[:, 0], d.min(1), rtol=1e-12)
    np.testing.assert_allclose(D_ij.min(0)[:, 0], d.min(0), rtol=1e-12)
    np.testing.assert_array_equal(D_ij.argmin(dim=1)[:, 0], d.argmin(1))
    np.testing.assert_array_equal(D_ij.argmin(axis=0)[:, 0], d.argmin(0))
    vals, idx = D_ij.min_argmin(dim=1)
    np.testing.assert_allclose(vals[:, 0], d.min(1), rtol=1e-12)
    np.testing.assert_array_equal(idx[:, 0], d.argmin(1))
    vals, idx = D_ij.Kmin_argKmin(K, dim=1)
    np.testing.assert_allclose(vals, np.sort(d, 1)[:, :K], rtol=1e-12)
    np.testing.assert_array_equal(idx, ind_knn)
    np.testing.assert_allclose(D_ij.Kmin(3, dim=0), np.sort(d, 0)[:3].T, rtol=1e-12)


def test_knn_float32_indices_point_at_nearest(rng):
    """In float32 near-ties may order differently from float64: check the distances the
    returned indices point at, not the indices."""
    x, y, _ = _points(rng)
    d = sqdist(x.astype(np.float64), y.astype(np.float64))
    idx = Vi(x).sqdist(Vj(y)).argKmin(4, dim=1)
    np.testing.assert_allclose(np.take_along_axis(d, idx, 1), np.sort(d, 1)[:, :4], rtol=1e-5,
                               atol=1e-6)


# ---------------------------------------------------------------- log-sum-exp family


def test_logsumexp_and_softmax(rng):
    x, y, b = _points(rng)
    bpos = np.abs(b) + 0.1
    x_i, y_j = Vi(x), Vj(y)
    S = -x_i.sqdist(y_j) * 3.0  # large negative values: the stable form matters
    s = -3.0 * sqdist(x.astype(np.float64), y.astype(np.float64))
    ref = np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)) + s.max(1)
    close(S.logsumexp(dim=1)[:, 0], ref, 1e-6)
    refw = np.log(np.exp(s) @ bpos.astype(np.float64))
    close(S.logsumexp(dim=1, weight=Vj(bpos)), refw, 1e-6)
    close(S.logsumexp_reduction(dim=0)[:, 0], np.log(np.exp(s).sum(0)), 1e-6)
    w = np.exp(s - s.max(1, keepdims=True))
    w /= w.sum(1, keepdims=True)
    close(S.sumsoftmaxweight(Vj(b), dim=1), w @ b.astype(np.float64), 1e-5, np.abs(b).max())


def test_softmax_attention_torch(rng):
    """``softmax(q kᵀ / √d) v`` as a SumSoftMaxWeight reduction, against torch.softmax."""
    d = 8
    q, k = torch.randn(N, d), torch.randn(M, d)
    v = torch.randn(M, 4)
    q_i, k_j, v_j = LazyTensor(q[:, None, :]), LazyTensor(k[None, :, :]), LazyTensor(v[None, :, :])
    out = ((q_i | k_j) / math.sqrt(d)).sumsoftmaxweight(v_j, dim=1)
    ref = torch.softmax(q.double() @ k.double().T / math.sqrt(d), dim=1) @ v.double()
    assert out.dtype == torch.float32
    close(out, ref, 1e-5, v.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sinkhorn_log_domain(dtype):
    """Entropic OT as in the pykeops/geomloss tutorials: ``(-C/eps).logsumexp`` on a
    j-indexed potential, alternating over j and over i."""
    torch.manual_seed(0)
    n, m, eps = 40, 30, 0.1
    x, y = torch.rand(n, 2, dtype=dtype), torch.rand(m, 2, dtype=dtype) + 0.2
    a, b = torch.full((n,), 1 / n, dtype=dtype), torch.full((m,), 1 / m, dtype=dtype)
    x_i, y_j = LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :])
    C_ij = ((x_i - y_j) ** 2).sum(-1) / 2
    f, g = torch.zeros(n, dtype=dtype), torch.zeros(m, dtype=dtype)
    C = sqdist(x.double(), y.double()) / 2
    fd, gd = torch.zeros(n, dtype=torch.float64), torch.zeros(m, dtype=torch.float64)
    for _ in range(30):
        g_j = LazyTensor((g + eps * b.log())[None, :, None])
        f = -eps * ((g_j - C_ij) / eps).logsumexp(dim=1).view(-1)
        f_i = LazyTensor((f + eps * a.log())[:, None, None])
        g = -eps * ((f_i - C_ij) / eps).logsumexp(dim=0).view(-1)
        fd = -eps * torch.logsumexp((gd[None] + eps * b.double().log()[None] - C) / eps, dim=1)
        gd = -eps * torch.logsumexp((fd[:, None] + eps * a.double().log()[:, None] - C) / eps, dim=0)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    close(f, fd, tol, 1.0)
    close(g, gd, tol, 1.0)
    # the transport plan's marginals: P_ij = a_i b_j exp((f_i + g_j - C_ij) / eps)
    P = LazyTensor(f[:, None, None]) + LazyTensor(g[None, :, None]) - C_ij
    row = (P / eps).exp() @ b
    close(row * a, a.double(), 1e-4 if dtype == torch.float32 else 1e-10)


# ---------------------------------------------------------------- linear solves


def test_kernel_ridge_solve_and_kernelsolve(rng):
    x = rng.standard_normal((50, 2))
    b = rng.standard_normal((50, 2))
    alpha, g = 0.5, 2.0
    Kd = np.exp(-g * sqdist(x, x))
    ref = np.linalg.solve(Kd + alpha * np.eye(50), b)
    K_xx = (-g * Vi(x).sqdist(Vj(x))).exp()
    close(K_xx.solve(Vi(b), alpha=alpha, eps=1e-10), ref, 1e-7)
    close(K_xx.solve(b, alpha=alpha, eps=1e-10, backend="CPU", dtype_acc="float64"), ref, 1e-7)
    close(K_xx.solve(b[:, 0], alpha=alpha, eps=1e-10), ref[:, 0], 1e-7)
    # KernelSolve (pykeops.torch), with a bandwidth parameter and options as users pass them
    Kinv = ltt.KernelSolve("Exp(-g * SqDist(x, y)) * b", ["x = Vi(2)", "y = Vj(2)", "b = Vj(2)",
                                                           "g = Pm(1)"], "b", axis=1,
                           dtype="float64", enable_chunks=False)
    xt, bt = torch.from_numpy(x), torch.from_numpy(b)
    out = Kinv(xt, xt, bt, torch.tensor([g], dtype=torch.float64), alpha=alpha, eps=1e-10,
               backend="CPU")
    close(out, ref, 1e-7)
    solver = K_xx.solve(Vi(b), alpha=alpha, eps=1e-10, call=False)  # a callable, as pykeops
    close(solver(), ref, 1e-7)
    close(solver.callfun(b, x, x, -g), ref, 1e-7)  # pykeops's order: b, then K's x, x, -g


def test_scipy_linear_operator(rng):
    """``aslinearoperator(K)`` as in the pykeops docs: eigsh and cg on the kernel matrix."""
    from scipy.sparse.linalg import aslinearoperator, cg, eigsh

    x = rng.standard_normal((60, 3))
    Kd = np.exp(-sqdist(x, x))
    K_xx = (-LazyTensor(x[:, None, :]).sqdist(LazyTensor(x[None, :, :]))).exp()
    op = aslinearoperator(K_xx)
    assert op.shape == (60, 60) and op.dtype == np.float64
    vals = eigsh(op, k=3, return_eigenvectors=False)
    np.testing.assert_allclose(np.sort(vals), np.linalg.eigvalsh(Kd)[-3:], rtol=1e-8)
    b = rng.standard_normal(60)
    sol, info = cg(aslinearoperator(K_xx) + 0.1 * aslinearoperator(np.eye(60)), b, rtol=1e-12,
                   maxiter=2000)
    assert info == 0
    close(sol, np.linalg.solve(Kd + 0.1 * np.eye(60), b), 1e-7)
    v = rng.standard_normal((60, 2))
    close(op.matmat(v), Kd @ v, 1e-12)
    close(op.rmatvec(v[:, 0]), Kd.T @ v[:, 0], 1e-12)


# ---------------------------------------------------------------- Genred formula strings

GENRED_ALIASES = ["x = Vi(3)", "y = Vj(3)", "b = Vj(2)", "g = Pm(1)"]


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_genred_reductions(lib, rng):
    G = ltt.Genred if lib == "torch" else ltnp.Genred
    x, y, b = _points(rng)
    g = np.array([0.7], np.float32)
    wrap = torch.from_numpy if lib == "torch" else np.asarray
    X, Y, B, P = wrap(x), wrap(y), wrap(b), wrap(g)
    d = sqdist(x.astype(np.float64), y.astype(np.float64))
    Kd = np.exp(-d * 0.7)
    bd = b.astype(np.float64)
    gauss = G("Exp(-SqDist(x,y)*g)*b", GENRED_ALIASES, reduction_op="Sum", axis=1, dtype="float32")
    close(gauss(X, Y, B, P), Kd @ bd, 2e-6, Kd.sum(1).max() * np.abs(bd).max())
    close(gauss(X, Y, B, P, backend="CPU"), Kd @ bd, 2e-6, Kd.sum(1).max() * np.abs(bd).max())
    # the same with positional aliases and a reduction over i (b is then i-indexed)
    gauss0 = G("Exp(-SqDist(x,y)*g)*b", ["x = Vi(0, 3)", "y = Vj(1, 3)", "b = Vi(2, 2)",
                                           "g = Pm(3, 1)"], reduction_op="Sum", axis=0)
    a = rng.standard_normal((N, 2)).astype(np.float32)
    close(gauss0(X, Y, wrap(a), P), Kd.T @ a.astype(np.float64), 2e-6, Kd.sum(0).max() * 3)
    # accuracy and code-generation options as pykeops users pass them
    opts = G("Exp(-SqDist(x,y)*g)*b", GENRED_ALIASES, "Sum", axis=1, dtype_acc="float64",
             sum_scheme="kahan_scheme", enable_chunks=False, use_fast_math=True)
    close(opts(X, Y, B, P), Kd @ bd, 2e-6, Kd.sum(1).max() * np.abs(bd).max())
    dbl = G("Exp(-SqDist(x,y)*g)*b", GENRED_ALIASES, "Sum", axis=1, use_double_acc=True)
    close(dbl(X, Y, B, P), Kd @ bd, 2e-6, Kd.sum(1).max() * np.abs(bd).max())
    # LogSumExp, with and without formula2
    lse = G("-SqDist(x,y)*g", ["x = Vi(3)", "y = Vj(3)", "g = Pm(1)"], "LogSumExp", axis=1)
    close(lse(X, Y, P), np.log(np.exp(-0.7 * d).sum(1, keepdims=True)), 1e-6)
    bp = np.abs(b) + 0.1
    lsew = G("-SqDist(x,y)*g", GENRED_ALIASES, "LogSumExp", axis=1, formula2="b")
    close(lsew(X, Y, wrap(bp), P), np.log(np.exp(-0.7 * d) @ bp.astype(np.float64)), 1e-6)
    # ArgKMin with opt_arg, Min_ArgMin, SumSoftMaxWeight
    knn = G("SqDist(x,y)", ["x = Vi(3)", "y = Vj(3)"], "ArgKMin", axis=1, opt_arg=3)
    idx = knn(X, Y)
    assert idx.shape == (N, 3) and str(idx.dtype).endswith("int64")
    np.testing.assert_allclose(np.take_along_axis(d, np.asarray(idx), 1), np.sort(d, 1)[:, :3],
                               rtol=1e-5, atol=1e-6)
    vals, ind = G("SqDist(x,y)", ["x = Vi(3)", "y = Vj(3)"], "Min_ArgMin", axis=0)(X, Y)
    close(vals[:, 0], d.min(0), 1e-6)
    close(d[np.asarray(ind)[:, 0], np.arange(M)], d.min(0), 1e-5)
    smw = G("-SqDist(x,y)*g", GENRED_ALIASES, "SumSoftMaxWeight", axis=1, formula2="b")
    w = np.exp(-0.7 * d)
    close(smw(X, Y, B, P), (w / w.sum(1, keepdims=True)) @ bd, 1e-5, np.abs(bd).max())


def test_genred_generic_helpers_and_formula_ops(rng):
    x, y, b = _points(rng)
    d = sqdist(x.astype(np.float64), y.astype(np.float64))
    gsum = ltnp.generic_sum("Inv(IntCst(1) + SqDist(x,y)) * b", "a = Vi(2)", "x = Vi(3)",
                            "y = Vj(3)", "b = Vj(2)")
    close(gsum(x, y, b), (1 / (1 + d)) @ b.astype(np.float64), 2e-6, 1 / (1 + d).min() * M * 3)
    glse = ltnp.generic_logsumexp("-Sqrt(SqDist(x,y))", "a = Vi(1)", "x = Vi(3)", "y = Vj(3)")
    close(glse(x, y), np.log(np.exp(-np.sqrt(d)).sum(1, keepdims=True)), 1e-6)
    gk = ltnp.generic_argkmin("SqDist(x,y)", "a = Vi(2)", "x = Vi(3)", "y = Vj(3)")
    np.testing.assert_allclose(np.take_along_axis(d, gk(x, y), 1), np.sort(d, 1)[:, :2],
                               rtol=1e-5, atol=1e-6)
    gm = ltnp.generic_argmin("SqDist(x,y)", "a = Vj(1)", "x = Vi(3)", "y = Vj(3)")
    close(d[gm(x, y)[:, 0], np.arange(M)], d.min(0), 1e-5)
    # a formula with many of KeOps's operations (the x·y dot, Elem, Extract, Square, Pow,
    # Exp, Log, Abs, Step, ReLU, WeightedSqDist, Concat) in one kernel
    formula = ("Concat((x|y) * Elem(x, 0) + Extract(y, 1, 1), Square(Norm2(x - y)) + Pow(Elem(y, 2), 3)"
               " + Log(IntCst(1) + Exp(-Abs(Elem(x, 1)))) + Step(Elem(x, 2)) * ReLU(Elem(y, 0))"
               " + WeightedSqDist(s, x, y))")
    f = ltnp.Genred(formula, ["x = Vi(3)", "y = Vj(3)", "s = Pm(3)"], axis=1)
    s = np.array([1.0, 2.0, 0.5], np.float32)
    xd, yd = x[:, None, :].astype(np.float64), y[None, :, :].astype(np.float64)
    first = (xd * yd).sum(-1) * xd[..., 0] + yd[..., 1]
    second = (d + yd[..., 2] ** 3 + np.log(1 + np.exp(-np.abs(xd[..., 1])))
              + (xd[..., 2] >= 0) * np.maximum(yd[..., 0], 0) + ((xd - yd) ** 2 * s).sum(-1))
    ref = np.stack([first.sum(1), second.sum(1)], -1)
    close(f(x, y, s), ref, 1e-5, np.abs(np.stack([first, second], -1)).sum(1).max())


def test_genred_option_errors(rng):
    x, y, _ = _points(rng)
    with pytest.raises(ValueError, match="sum-type"):
        ltnp.Genred("SqDist(x,y)", ["x = Vi(3)", "y = Vj(3)"], "Min", axis=1, dtype_acc="float64")
    with pytest.raises(ValueError, match="either use_double_acc"):
        ltnp.Genred("SqDist(x,y)", ["x = Vi(3)", "y = Vj(3)"], axis=1, dtype_acc="float32",
                    use_double_acc=True)
    red = ltnp.Genred("SqDist(x,y)", ["x = Vi(3)", "y = Vj(3)"], axis=1)
    with pytest.raises(ValueError, match="cuda"):  # "GPU" means CUDA: needs CUDA tensors
        red(torch.from_numpy(x), torch.from_numpy(y), backend="GPU")
    with pytest.raises(ValueError, match="backend"):
        red(x, y, backend="GPU_3D")
    half = red(x.astype(np.float16), y.astype(np.float16))  # computed in float32
    assert half.dtype == np.float16
    close(half, red(x.astype(np.float16).astype(np.float32), y.astype(np.float16)
                    .astype(np.float32)), 2e-3)


# ---------------------------------------------------------------- gradients


def _grad_data(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.randn(M, D, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(M, 2, dtype=torch.float64, generator=g, requires_grad=True)
    s = torch.tensor([0.9], dtype=torch.float64, requires_grad=True)
    return x, y, b, s


def _kp_lazy(x, y, b, s):
    x_i, y_j = LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :])
    return (-((x_i - y_j) ** 2).sum(-1) / (s**2)).exp() @ b  # s: a 1D tensor -> Pm


def _kp_dense(x, y, b, s):
    return torch.exp(-sqdist(x, y) / s**2) @ b


def _lse_lazy(x, y, b, s):
    w = b.abs() + 0.1
    return (-Vi(x).sqdist(Vj(y)) * LazyTensor(s)).logsumexp(dim=1, weight=Vj(w))


def _lse_dense(x, y, b, s):
    w = b.abs() + 0.1
    return torch.logsumexp(-sqdist(x, y)[:, :, None] * s + w.log()[None], dim=1)


@pytest.mark.parametrize("which", ["kernel_product", "logsumexp"])
def test_gradients_first_and_second_order(which, rng):
    lazy, dense = {"kernel_product": (_kp_lazy, _kp_dense),
                   "logsumexp": (_lse_lazy, _lse_dense)}[which]
    x, y, b, s = _grad_data(int(rng.integers(1 << 31)))
    e = torch.randn(N, 2, dtype=torch.float64)  # a random output cotangent
    inputs = [x, y, b, s]
    got = torch.autograd.grad((lazy(*inputs) * e).sum(), inputs, create_graph=True)
    ref = torch.autograd.grad((dense(*inputs) * e).sum(), inputs, create_graph=True)
    for gg, rr in zip(got, ref):
        close(gg, rr, 1e-10)
    # second order: the gradient of a function of ∂/∂x, w.r.t. x, y and the bandwidth
    got2 = torch.autograd.grad((got[0] ** 2).sum() + got[3].sum(), [x, y, s])
    ref2 = torch.autograd.grad((ref[0] ** 2).sum() + ref[3].sum(), [x, y, s])
    for gg, rr in zip(got2, ref2):
        close(gg, rr, 1e-9)


def test_genred_gradient_and_grad_method(rng):
    x, y, b, _ = _grad_data(int(rng.integers(1 << 31)))
    red = ltt.Genred("Exp(-SqDist(x,y)) * b", ["x = Vi(3)", "y = Vj(3)", "b = Vj(2)"], axis=1)
    gx = torch.autograd.grad(red(x, y, b).sum(), [x])[0]
    rx = torch.autograd.grad((torch.exp(-sqdist(x, y)) @ b).sum(), [x])[0]
    close(gx, rx, 1e-10)
    # the symbolic gradient of pykeops's LazyTensor.grad, reduced: Σ_j ∂_x k(x_i, y_j)ᵀ e_i
    e = torch.randn(N, 1, dtype=torch.float64)
    x_i, y_j = LazyTensor(x.detach()[:, None, :]), LazyTensor(y.detach()[None, :, :])
    K = (-((x_i - y_j) ** 2).sum(-1)).exp()
    gsym = K.grad(x_i, e).sum(dim=1)
    xx = x.detach().clone().requires_grad_(True)
    ref = torch.autograd.grad((torch.exp(-sqdist(xx, y.detach())).sum(1, keepdim=True) * e).sum(),
                              [xx])[0]
    close(gsym, ref, 1e-10)


# ---------------------------------------------------------------- batches


def test_batched_kernels(rng):
    B = 3
    x = torch.randn(B, N, 1, D, dtype=torch.float64)
    y = torch.randn(B, 1, M, D, dtype=torch.float64)
    p = torch.rand(B, 1, 1, D, dtype=torch.float64) + 0.5  # per-batch anisotropic scales
    v = torch.randn(B, M, 2, dtype=torch.float64)
    x_i, y_j, p_b = LazyTensor(x), LazyTensor(y), LazyTensor(p)
    D_ij = ((x_i - y_j) ** 2 * p_b).sum(-1)
    assert D_ij.shape == (B, N, M) and D_ij.nbatchdims == 1 and D_ij.dim() == 4
    K = (-D_ij).exp()
    Dd = ((x - y) ** 2 * p).sum(-1)
    close(K @ v, torch.exp(-Dd) @ v, 1e-12)
    close(K.sum(dim=2), torch.exp(-Dd).sum(2, keepdim=True), 1e-12)
    close(K.sum(dim=1), torch.exp(-Dd).sum(1)[..., None], 1e-12)
    close(D_ij.logsumexp(dim=2), torch.logsumexp(Dd, 2, keepdim=True), 1e-12)
    idx = D_ij.argKmin(3, dim=2)
    assert idx.shape == (B, N, 3)
    np.testing.assert_array_equal(idx.numpy(), torch.argsort(Dd, dim=2)[..., :3].numpy())
    close(K.t() @ torch.ones(B, N, 1, dtype=torch.float64), torch.exp(-Dd).sum(1)[..., None], 1e-12)
    with pytest.raises(ValueError, match="dim=1 .over i. or dim=2 .over j."):
        K.sum(dim=0)  # with one batch dimension, i is dim 1


# ---------------------------------------------------------------- the LazyTensor API


def test_lazytensor_ops_as_users_write_them(rng):
    """The methods pykeops users call, in two kernels (float32), against NumPy float64."""
    x, y, _ = _points(rng)
    A = rng.standard_normal((N, D * D)).astype(np.float32)
    w = np.array([0.5, 1.0, 2.0], np.float32)
    x_i, y_j, A_i = Vi(x), Vj(y), Vi(A)
    xd, yd = x[:, None, :].astype(np.float64), y[None, :, :].astype(np.float64)
    Ad = A[:, None, :].astype(np.float64)
    d2 = ((xd - yd) ** 2).sum(-1, keepdims=True)
    one = np.ones_like(d2)
    exprs = [
        (x_i.sqdist(y_j).exp().log().sqrt().abs(), np.sqrt(d2)),
        ((x_i - y_j).relu().sum(-1), np.maximum(xd - yd, 0).sum(-1, keepdims=True)),
        ((x_i | y_j).clamp(-0.5, 0.5), np.clip((xd * yd).sum(-1, keepdims=True), -0.5, 0.5)),
        ((x_i | y_j).ifelse(x_i.sqnorm2(), -y_j.norm2()),
         np.where((xd * yd).sum(-1, keepdims=True) >= 0, (xd**2).sum(-1, keepdims=True) * one,
                  -np.sqrt((yd**2).sum(-1, keepdims=True)) * one)),
        ((x_i - y_j).step() + (x_i - y_j).sign(), (xd - yd >= 0) + np.sign(xd - yd)),
        (x_i.normalize() * 1, xd / np.sqrt((xd**2).sum(-1, keepdims=True)) * one),
        (x_i.weightedsqdist(y_j, Pm(w)), (((xd - yd) ** 2) * w).sum(-1, keepdims=True)),
        (A_i.matvecmult(y_j), np.einsum("nmkl,nml->nmk", (Ad * one).reshape(N, M, D, D),
                                        yd * one)),
        (x_i.tensorprod(y_j), (xd[..., :, None] * yd[..., None, :]).reshape(N, M, D * D)),
        (x_i.concat(y_j).elem(4) + x_i[:, :, 0] - y_j[..., 1:3].sum(-1),
         yd[..., 1:2] + xd[..., 0:1] - yd[..., 1:3].sum(-1, keepdims=True)),
        ((x_i - y_j) ** 3 / 2.0 * 3 - (1 + d2_lazy(x_i, y_j)) ** -1.5,
         (xd - yd) ** 3 / 2 * 3 - (1 + d2) ** -1.5),
        ((x_i * w) / np.float32(2) + [1.0, 2.0, 3.0] * y_j - np.array([1, 0, 1], np.float32),
         xd * w / 2 + np.array([1.0, 2.0, 3.0]) * yd - np.array([1, 0, 1])),
        ((x_i < y_j) + (x_i >= 0.5) * 2 + (x_i == x_i) * 4, (xd < yd) + (xd >= 0.5) * 2.0 + 4),
        (2.0 ** x_i.elem(0) + (x_i - y_j).abs() ** (y_j.abs()[0] + 0.5),
         2.0 ** xd[..., :1] + np.abs(xd - yd) ** (np.abs(yd[..., :1]) + 0.5)),
        ((x_i - y_j).sum(), (xd - yd).sum(-1, keepdims=True)),
        (LazyTensor.cat(((x_i - y_j).sinc(), y_j[0]), dim=-1)
         + LazyTensor.concatenate((y_j, x_i[2]), axis=-1),
         np.concatenate([np.sinc(xd - yd), yd[..., :1] * one], -1)
         + np.concatenate([yd * one, xd[..., 2:3] * one], -1)),
    ]
    formula = exprs[0][0]
    for e, _ in exprs[1:]:
        formula = formula.concat(e)
    got = formula.sum(dim=1)
    ref_terms = np.concatenate([np.broadcast_to(r, (N, M, r.shape[-1])) for _, r in exprs], -1)
    close(got, ref_terms.sum(1), 2e-6, np.abs(ref_terms).sum(1).max())
    got0 = formula.sum(dim=0)
    close(got0, ref_terms.sum(0), 2e-6, np.abs(ref_terms).sum(0).max())


def d2_lazy(x_i, y_j):
    return ((x_i - y_j) ** 2).sum(-1)


def test_operands_in_torch(rng):
    """Torch tensors (0D and 1D, with and without gradients) and numbers mix with torch
    LazyTensors; a list of floats takes the formula's dtype, as pykeops's lists do."""
    x = torch.randn(N, D)
    y = torch.randn(M, D)
    s = torch.tensor(0.7, requires_grad=True)
    scale = torch.tensor([1.0, 0.5, 2.0])
    x_i, y_j = LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :])
    F = ((x_i - y_j) * scale * [1.0, 1.0, 0.5]).sqnorm2() * s
    assert F.dtype == torch.float32
    out = (-F).exp().sum(dim=1)
    Fd = ((((x[:, None] - y[None]) * scale * torch.tensor([1.0, 1.0, 0.5])) ** 2).sum(-1)).double()
    ref = torch.exp(-Fd * 0.7).sum(1, keepdim=True)
    close(out, ref, 2e-6)
    gs = torch.autograd.grad(out.sum(), [s])[0]
    close(gs, -(Fd * torch.exp(-Fd * 0.7)).sum(), 1e-5)
    # lazytensor.torch.LazyTensor with axis= (2D tensors), as pykeops.torch
    K = (-ltt.LazyTensor(x, axis=0).sqdist(ltt.LazyTensor(y, axis=1))).exp()
    close(K.sum(1), torch.exp(-sqdist(x.double(), y.double())).sum(1, keepdim=True), 2e-6)


def test_attributes_as_pykeops(rng):
    x, y, _ = _points(rng)
    x_i, y_j = LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :])
    K = (-((x_i - y_j) ** 2).sum(-1)).exp()
    V = x_i - y_j
    assert (K.ni, K.nj) == (N, M) and (x_i.ni, y_j.nj) == (N, M)
    assert K.shape == (N, M) and V.shape == (N, M, D)
    assert K.T.shape == (M, N) and K.t().shape == (M, N) and V.T.shape == (M, N, D)
    assert (K.ndim, V.ndim, x_i.ndim) == (1, D, D)  # pykeops: ndim is the vector dimension
    assert K.dim() == 3 and K.nbatchdims == 0
    assert K.dtype == np.float32 and LazyTensor(torch.from_numpy(x)[:, None]).dtype == torch.float32
    assert "Var(0,3,0)" in repr(K) and "Var(1,3,1)" in repr(K)  # pykeops's notation
    # method aliases of pykeops's reductions
    Kd = np.exp(-sqdist(x.astype(np.float64), y.astype(np.float64)))
    close(K.sum_reduction(dim=1)[:, 0], Kd.sum(1), 2e-6)
    close(K.sum(1, backend="CPU", enable_chunks=False, device_id=-1)[:, 0], Kd.sum(1), 2e-6)
    close(K.sum(1, dtype_acc="float64", sum_scheme="kahan_scheme")[:, 0], Kd.sum(1), 2e-6)
    close(K.sum(1, use_double_acc=True)[:, 0], Kd.sum(1), 2e-6)
    close((-K).logsumexp(1, dtype_acc="float64", sum_scheme="block_sum")[:, 0],
          np.log(np.exp(-Kd).sum(1)), 1e-6)
    # the smallest exp(-d²) have d² ~ 11: float32's d² and exp give up to 1.2e-6 of it
    close(K.min_reduction(dim=0)[:, 0], Kd.min(0), 2e-6)
    close(K.logsumexp_reduction(dim=1)[:, 0], np.log(np.exp(Kd).sum(1)), 1e-6)
    # K[:, :, k] and K[..., k] are the component k, as pykeops's indexing of the last axis
    close(V[:, :, 1].sum(1)[:, 0], (x[:, None, 1] - y[None, :, 1]).astype(np.float64).sum(1), 1e-5,
          np.abs(x).max() * M * 2)
    close(V[..., 1:3].sum(1), (x[:, None, 1:3] - y[None, :, 1:3]).astype(np.float64).sum(1), 1e-5,
          np.abs(x).max() * M * 2)


def test_clear_errors_for_what_pykeops_rejects_too(rng):
    x, y, _ = _points(rng)
    x_i, y_j = Vi(x), Vj(y)
    with pytest.raises(TypeError, match=r"mixed dtypes.*float16"):
        (LazyTensor(x.astype(np.float16)[:, None, :]) * y_j).sum(1)
    with pytest.raises(TypeError, match="mixed dtypes.*float32.*float64"):
        (x_i * np.ones(3)).sum(1)  # a float64 array with float32 data
    with pytest.raises(ValueError, match="sum-type"):
        x_i.sqdist(y_j).argKmin(2, dim=1, dtype_acc="float64")
    with pytest.raises(ValueError, match="sum_scheme='kahan_scheme'.*min"):
        x_i.sqdist(y_j).min(dim=1, sum_scheme="kahan_scheme")
    with pytest.raises(TypeError, match="'foo'"):
        x_i.sqdist(y_j).min(dim=1, foo=True)
    with pytest.raises(ValueError, match="cuda"):  # torch CPU tensors (NumPy goes to the GPU)
        Vi(torch.from_numpy(x)).sqdist(Vj(torch.from_numpy(y))).sum(dim=1, backend="GPU")
    with pytest.raises(ValueError, match="dim=0"):
        x_i.sqdist(y_j).sum(backend="CPU")  # options but no dim: meant as a reduction
    with pytest.raises(ValueError, match="2D array of shape"):
        LazyTensor(x)  # a 2D array needs axis=, as pykeops
    # pykeops's symbolic variables: a category outside 0, 1, 2 is refused by name
    with pytest.raises(ValueError, match=r"LazyTensor\(\(1, 2, 3\)\).*category"):
        LazyTensor((1, 2, 3))
    with pytest.raises(ValueError, match="vector dimension"):
        LazyTensor.cat((x_i, y_j), dim=0)
