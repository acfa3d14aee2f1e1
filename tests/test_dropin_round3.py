"""KeOps's documented examples through the pykeops alias, round 3: symbolic variables
(LazyTensor tutorial part 3, LDDMM surface registration), pykeops's helper modules,
``K.solve(..., call=False)``, integer options given as 0-d tensors (torchdr), each
pykeops module's ``grid_cluster``, ``dtype_acc="float16"`` and ``print(K)``.

pykeops-style code written here, compared with float64 NumPy or torch references; where
the behaviour is pykeops's choice (printed text, labels, messages), the test states what
pykeops 2.3 gives.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from lazytensor import Genred, LazyTensor, Pm, Vi, Vj
from lazytensor.compat import pykeops as alias


@pytest.fixture
def pk():
    """The pykeops alias for one test; sys.modules as it was afterwards."""
    before = set(sys.modules)
    module = alias.install()
    yield module
    alias.uninstall()
    for name in set(sys.modules) - before:
        if name.partition(".")[0] in ("pykeops", "keopscore"):
            del sys.modules[name]


def sqd(x, y):
    return ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)


def close(a, b, rtol=1e-10, atol=1e-12):
    a = a.detach().numpy() if torch.is_tensor(a) else np.asarray(a)
    b = b.detach().numpy() if torch.is_tensor(b) else np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


# ------------------------------------------------------------------ 1. symbolic variables


def test_symbolic_gaussian_sum_is_a_function_of_the_arrays(rng):
    """The tutorial's ``gammafun = Kxyb.sum_reduction(axis=1); gammafun(x, y, beta, sigmas)``."""
    M, N, D, Dv = 40, 50, 3, 4
    x, y, beta = rng.standard_normal((M, D)), rng.standard_normal((N, D)), rng.random((N, Dv))
    sigmas = np.array([0.5, 1.0, 2.0, 4.0])
    xi, yj, bj, s = Vi(0, D), Vj(1, D), Vj(2, Dv), Pm(3, 4)
    dxy2 = LazyTensor.sum((xi - yj) ** 2)
    gammafun = (LazyTensor.exp(-dxy2 / s**2).sum() * bj).sum_reduction(axis=1)
    assert callable(gammafun) and gammafun.symbolic_variables == (
        (0, D, 0), (1, D, 1), (2, Dv, 1), (3, 4, 2))
    d2 = sqd(x, y)
    want = sum(np.exp(-d2 / sg**2) for sg in sigmas) @ beta
    close(gammafun(x, y, beta, sigmas), want)
    # new sizes: the same function
    x2, y2, b2 = rng.standard_normal((7, D)), rng.standard_normal((9, D)), rng.random((9, Dv))
    close(gammafun(x2, y2, b2, sigmas), sum(np.exp(-sqd(x2, y2) / sg**2) for sg in sigmas) @ b2)
    # LazyTensor((index, dim, cat)) is the same symbolic variable
    f = (-LazyTensor((0, D, 0)).sqdist(LazyTensor((1, D, 1)))).exp().sum(dim=1)
    close(f(x, y), np.exp(-d2).sum(1, keepdims=True))


def test_symbolic_and_bound_variables_mix(rng):
    """``xi = Vi(x); yj = Vj(0, D); bj = Vj(beta)``: a function of y only; pykeops numbers
    the bound arrays after the symbolic ones (callfun's order)."""
    M, N, D, Dv = 30, 20, 3, 2
    x, y, beta = rng.standard_normal((M, D)), rng.standard_normal((N, D)), rng.random((N, Dv))
    sigmas = np.array([0.5, 2.0])
    xi, yj, bj = Vi(x), Vj(0, D), Vj(beta)
    dxy2 = LazyTensor.sum((xi - yj) ** 2)
    gammafun = (LazyTensor.exp(-dxy2 / sigmas**2).sum() * bj).sum_reduction(axis=1)
    want = sum(np.exp(-sqd(x, y) / sg**2) for sg in sigmas) @ beta
    close(gammafun(y), want)
    close(gammafun.callfun(y, x, sigmas**2, beta), want)  # y (index 0), then x, sigmas², beta
    text = str(gammafun)
    assert "symbolic variables: Var(0, 3, 1)" in text and "reduction: Sum (axis=1)" in text
    assert "Var(0,3,1)" in text and "Var(1,3,0)" in text  # y first, then x, as pykeops


def test_symbolic_reductions_of_every_kind(rng):
    x, y, w = rng.standard_normal((12, 2)), rng.standard_normal((15, 2)), rng.random((15, 3))
    d2 = sqd(x, y)
    D = Vi(0, 2).sqdist(Vj(1, 2))
    close(D.min(dim=1)(x, y), d2.min(1, keepdims=True))
    np.testing.assert_array_equal(D.argKmin(3, dim=1)(x, y), np.argsort(d2, 1, kind="stable")[:, :3])
    lse = (-D).logsumexp(dim=1)(x, y)
    top = (-d2).max(1, keepdims=True)
    close(lse, top + np.log(np.exp(-d2 - top).sum(1, keepdims=True)))
    soft = (-D).sumsoftmaxweight(Vj(2, 3), dim=1)(x, y, w)
    e = np.exp(-d2 - (-d2).max(1, keepdims=True))
    close(soft, (e @ w) / e.sum(1, keepdims=True))
    close(D.sum(dim=0)(x, y), d2.sum(0)[:, None])  # over i: indexed by j


def test_symbolic_gradients_first_and_second_order(rng):
    """The LDDMM tutorial's Hamiltonian ``H(p, q) = ½ <p, K(q, q, p)>``: its gradients with
    ``create_graph=True``, then a loss of them differentiated again, as torch on the dense
    kernel."""

    def gauss_kernel(sigma):
        x, y, b = Vi(0, 3), Vj(1, 3), Vj(2, 3)
        gamma = 1 / (sigma * sigma)
        K = (-x.sqdist(y) * gamma).exp()
        return (K * b).sum_reduction(axis=1)

    def dense_kernel(sigma):
        def K(x, y, b):
            return torch.exp(-((x[:, None] - y[None]) ** 2).sum(-1) / sigma**2) @ b
        return K

    sigma = torch.tensor([0.7], dtype=torch.float64)
    q0 = torch.from_numpy(rng.standard_normal((25, 3)))
    p0 = torch.from_numpy(rng.standard_normal((25, 3)))
    results = []
    for K in (gauss_kernel(sigma), dense_kernel(sigma)):
        q, p = q0.clone().requires_grad_(True), p0.clone().requires_grad_(True)
        H = 0.5 * (p * K(q, q, p)).sum()
        Gp, Gq = torch.autograd.grad(H, (p, q), create_graph=True)
        loss = (Gp**2).sum() + (Gq * q).sum()
        loss.backward()
        results.append((H.detach(), Gp.detach(), Gq.detach(), q.grad, p.grad))
    for got, want in zip(*results):
        close(got, want, rtol=1e-9, atol=1e-11)


def test_symbolic_five_variable_varifold_kernel(rng):
    """The LDDMM tutorial's ``GaussLinKernel``: ``Vi(0, 3), Vj(1, 3), Vi(2, 3), Vj(3, 3),
    Vj(4, 1)``, with the gradient in the i- and j-points (one tensor passed twice)."""
    x, y, u, v, b = Vi(0, 3), Vj(1, 3), Vi(2, 3), Vj(3, 3), Vj(4, 1)
    K = (-x.sqdist(y) * 0.5).exp() * (u * v).sum() ** 2
    f = (K * b).sum_reduction(axis=1)
    c = torch.from_numpy(rng.standard_normal((18, 3))).requires_grad_(True)
    n = torch.from_numpy(rng.standard_normal((18, 3)))
    w = torch.from_numpy(rng.random((18, 1)))
    out = (w * f(c, c, n, n, w)).sum()
    (g,) = torch.autograd.grad(out, c)
    cd = c.detach().clone().requires_grad_(True)
    Kd = torch.exp(-((cd[:, None] - cd[None]) ** 2).sum(-1) * 0.5) * (n @ n.T) ** 2
    ref = (w * (Kd @ w)).sum()
    (gd,) = torch.autograd.grad(ref, cd)
    close(out, ref)
    close(g, gd, rtol=1e-9, atol=1e-11)


def test_symbolic_errors_name_the_variable(rng):
    f = Vi(0, 3).sqdist(Vj(1, 3)).sum(dim=1)
    x = rng.random((4, 3))
    with pytest.raises(TypeError, match=r"Vi\(0, 3\), Vj\(1, 3\).*expected 2, got 1"):
        f(x)
    with pytest.raises(ValueError, match=r"argument 1 .*Vj\(1, 3\).*shape \(5, 2\)"):
        f(x, rng.random((5, 2)))
    with pytest.raises(ValueError, match="index 0 is missing"):
        Vi(1, 3).sqdist(Vj(2, 3)).sum(dim=1)
    with pytest.raises(ValueError, match="share index 0"):
        (Vi(0, 3) + Vj(0, 3)).sum(dim=1)
    with pytest.raises(ValueError, match=r"Vi\(0, 0\)|LazyTensor\(\(0, 0, 0\)\): dim must be a positive integer, got 0"):
        Vi(0, 0)


def test_call_false_without_symbolic_variables_keeps_its_arrays(rng):
    """The tutorial's "no call" mode: ``gammafun = ....sum_reduction(axis=1, call=False)``,
    then ``gammafun()``; printing it shows the reduction as pykeops."""
    x, y, b = rng.random((10, 3)), rng.random((12, 3)), rng.random((12, 2))
    gammafun = ((-Vi(x).sqdist(Vj(y))).exp() * Vj(b)).sum_reduction(axis=1, call=False)
    close(gammafun(), np.exp(-sqd(x, y)) @ b)
    close(gammafun.callfun(x, y, b), np.exp(-sqd(x, y)) @ b)
    assert str(gammafun).splitlines()[-1] == "    reduction: Sum (axis=1)"


# ------------------------------------------------------------------ 2. pykeops's helper modules


def test_numpy_utils_kernels_match_their_definitions(pk, rng):
    from pykeops.numpy.utils import (
        chain_rules,
        differences,
        grad_np_kernel,
        log_np_kernel,
        log_sum_exp,
        np_kernel,
        squared_distances,
    )

    x, y, s = rng.standard_normal((9, 3)), rng.standard_normal((7, 3)), 0.8
    d2 = sqd(x, y)
    close(squared_distances(x, y), d2, atol=1e-12)
    close(differences(x, y), np.moveaxis(x[:, None, :] - y[None, :, :], 2, 0))
    forms = {"gaussian": np.exp(-d2 / s**2), "laplacian": np.exp(-np.sqrt(d2) / s),
             "cauchy": 1 / (1 + d2 / s**2), "inverse_multiquadric": (1 + d2 / s**2) ** -0.5}
    for name, want in forms.items():
        close(np_kernel(x, y, s, name), want, rtol=1e-9)
        close(log_np_kernel(x, y, s, name), np.log(want), rtol=1e-9, atol=1e-9)
        # the derivative in the squared distance, by central differences in d2
        h = 1e-6
        sq = squared_distances(x, y)
        fd = (_kernel_of_sq(sq + h, s, name) - _kernel_of_sq(sq - h, s, name)) / (2 * h)
        close(grad_np_kernel(x, y, s, name), fd, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="unknown kernel 'gauss'.*gaussian"):
        np_kernel(x, y, s, "gauss")
    m = rng.standard_normal((5, 6))
    close(log_sum_exp(m, axis=1), np.log(np.exp(m).sum(1)))
    # chain_rules: Σ_j q_i·(2 (a_i - b_j) A_ij p_j), per dimension (float32, as pykeops)
    a, b = rng.random((4, 2)), rng.random((6, 2))
    A, p, q = rng.random((4, 6)), rng.random((6, 3)), rng.random((4, 3))
    want = np.stack([(q * ((2 * (a[:, d][:, None] - b[:, d][None]) * A) @ p)).sum(1)
                     for d in range(2)], 1)
    got = chain_rules(q, a, b, A, p)
    assert got.dtype == np.float32
    close(got, want, rtol=1e-6, atol=1e-6)


def _kernel_of_sq(sq, s, name):
    u = sq / s**2
    return {"gaussian": np.exp(-u), "laplacian": np.exp(-np.sqrt(u)), "cauchy": 1 / (1 + u),
            "inverse_multiquadric": (1 + u) ** -0.5}[name]


def test_torch_utils_and_tools(pk, rng):
    from pykeops.numpy.utils import np_kernel, numpytools
    from pykeops.torch.utils import squared_distances, torch_kernel, torchtools

    x, y = rng.standard_normal((6, 2)), rng.standard_normal((8, 2))
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    close(squared_distances(xt, yt), sqd(x, y), atol=1e-12)
    for name in ("gaussian", "laplacian", "cauchy", "inverse_multiquadric"):
        close(torch_kernel(xt, yt, 0.5, name), np_kernel(x, y, 0.5, name), rtol=1e-9)
    tt, nt = torchtools(), numpytools()
    assert tt.dtypename(torch.float16) == "float16" and nt.dtypename(np.dtype("float32")) == "float32"
    assert tt.array([1, 2], "int64", "cpu").dtype == torch.int64
    assert nt.zeros((2, 3), "float32").dtype == np.float32 and nt.size(np.zeros((2, 3))) == 6
    z = nt.view_as_complex(np.array([[1.0, 2.0]]))
    assert z.dtype == np.complex128 and z[0, 0] == 1 + 2j
    close(tt.view_as_real(tt.view_as_complex(xt)), xt)
    with pytest.raises(ValueError, match="incompatible with KeOps"):
        tt.dtypename(torch.int8)
    assert tt.Genred is Genred


def test_common_modules(pk, capsys):
    import pykeops
    from pykeops.common.gpu_utils import get_gpu_number
    from pykeops.common.utils import (
        axis2cat,
        cat2axis,
        check_broadcasting,
        get_tools,
        pyKeOps_Message,
    )
    from pykeops.numpy.utils import WarmUpGpu

    assert get_gpu_number() == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert (axis2cat(0), axis2cat(1), cat2axis(1)) == (1, 0, 0)
    with pytest.raises(ValueError, match="Axis should be 0 or 1"):
        axis2cat(2)
    assert check_broadcasting((2, 1), (3,)) == (2, 3)
    with pytest.raises(ValueError, match="Incompatible batch dimensions"):
        check_broadcasting((2,), (3,))
    assert type(get_tools("pytorch")).__name__ == "torchtools"
    WarmUpGpu()
    pyKeOps_Message("done", use_tag=False)
    # pykeops 2.3 prints exactly this (its WarmUpGpu runs kernels only with a GPU)
    assert capsys.readouterr().out == "[pyKeOps] Warming up the Gpu (numpy bindings) !!!\ndone\n"
    pykeops.set_verbose(False)
    pyKeOps_Message("silent")
    assert capsys.readouterr().out == ""


# ------------------------------------------------------------------ 3. solve with call=False


def test_solve_call_false_returns_a_callable(rng):
    x, b = rng.random((40, 2)), rng.random((40, 2))
    A = 0.1 * np.eye(40) + np.exp(-4 * sqd(x, x))
    want = np.linalg.solve(A, b)
    Kxx = (-Vi(x).sqdist(Vj(x)) * 4).exp()
    res = LazyTensor.solve(Kxx, Vi(b), alpha=0.1, eps=1e-12, call=False)
    close(res(), want, rtol=1e-7, atol=1e-9)
    close(res.callfun(b, x, x), want, rtol=1e-7, atol=1e-9)  # b first, then K's arrays
    close(res(alpha=1.0), np.linalg.solve(A + 0.9 * np.eye(40), b), rtol=1e-7, atol=1e-9)
    assert str(res).endswith("reduction: Solve (axis=1)")
    with pytest.raises(TypeError, match="takes 0 arrays"):
        res(b)
    # with symbolic variables the solve waits for the arrays, b's included
    Ks = (-Vi(0, 2).sqdist(Vj(1, 2)) * 4).exp()
    fs = Ks.solve(Vi(2, 2), alpha=0.1, eps=1e-12)
    close(fs(x, x, b), want, rtol=1e-7, atol=1e-9)


def test_deferred_solve_is_differentiable(rng):
    x = torch.from_numpy(rng.random((30, 1)))
    b = torch.from_numpy(rng.random((30, 1))).requires_grad_(True)
    f = (-Vi(x).sqdist(Vj(x))).exp().solve(Vi(b), alpha=0.5, eps=1e-12, call=False)
    (g,) = torch.autograd.grad(f().sum(), b)
    A = 0.5 * torch.eye(30, dtype=torch.float64) + torch.exp(-((x[:, None] - x[None]) ** 2).sum(-1))
    (gd,) = torch.autograd.grad(torch.linalg.solve(A, b).sum(), b)
    close(g, gd, rtol=1e-7, atol=1e-9)


# ------------------------------------------------------------------ 4. integer options


def test_k_as_a_0d_tensor_or_numpy_integer(rng):
    """torchdr's ``Kmin_argKmin(K=torch.tensor(90), dim=1)``."""
    x, y = torch.from_numpy(rng.random((100, 2))), torch.from_numpy(rng.random((120, 2)))
    D = Vi(x).sqdist(Vj(y))
    values, indices = D.Kmin_argKmin(K=torch.tensor(90), dim=1)
    ref = ((x[:, None] - y[None]) ** 2).sum(-1).sort(dim=1, stable=True)
    close(values, ref.values[:, :90])
    assert torch.equal(indices, ref.indices[:, :90])
    assert torch.equal(D.argKmin(np.int64(5), dim=torch.tensor(1)), ref.indices[:, :5])
    nn = Genred("SqDist(x, y)", ["x = Vi(2)", "y = Vj(2)"], "ArgKMin", axis=1,
                opt_arg=torch.tensor(4))
    assert torch.equal(nn(x, y), ref.indices[:, :4])
    for bad, what in ((3.0, "3.0"), (torch.tensor(3.0), "dtype float32"),
                      (torch.tensor([3]), "shape \\(1,\\)"), (True, "True"), (0, "0")):
        with pytest.raises(ValueError, match=f"K must be a positive integer, got .*{what}"):
            D.argKmin(K=bad, dim=1)


# ------------------------------------------------------------------ 5. grid_cluster


def test_grid_cluster_follows_each_pykeops_module(pk, rng):
    from pykeops.numpy.cluster import grid_cluster as np_grid_cluster
    from pykeops.numpy.cluster import sort_clusters
    from pykeops.torch.cluster import grid_cluster as torch_grid_cluster

    x = np.array([[0.07], [0.12], [0.13], [0.26]])
    # pykeops 2.3: NumPy floor(x / size) gives [0, 1, 1, 2]; torch anchors at x.min(): [0, 0, 0, 1]
    assert np_grid_cluster(x, 0.1).tolist() == [0, 1, 1, 2]
    assert torch_grid_cluster(torch.from_numpy(x), 0.1).tolist() == [0, 0, 0, 1]
    # random points in 3D: same label exactly when the same cell of the grid at the origin
    pts = rng.standard_normal((300, 3))
    lab = np_grid_cluster(pts, 0.7)
    cells = np.floor(pts / 0.7).astype(np.int64)
    same_cell = (cells[:, None] == cells[None]).all(-1)
    assert np.array_equal(lab[:, None] == lab[None], same_cell)
    order = np.lexsort(np.unique(cells, axis=0).T[::-1])  # labels in lexicographic cell order
    assert np.array_equal(order, np.arange(len(order))) and lab.max() + 1 == len(order)
    # sort_clusters is stable: inside a cluster the points keep their order
    (xs, idx), ls = sort_clusters((pts, np.arange(300)), lab)
    assert np.array_equal(idx, np.argsort(lab, kind="stable")) and np.array_equal(xs, pts[idx])
    assert np.all(np.diff(ls) >= 0)


# ------------------------------------------------------------------ 6. dtype_acc="float16"


def test_dtype_acc_float16_for_half_data(rng):
    x = rng.random((300, 3)).astype(np.float16)
    y = rng.random((200, 3)).astype(np.float16)
    exact = np.exp(-sqd(x.astype(np.float64), y.astype(np.float64))).sum(1, keepdims=True)
    for acc in ("float16", "float32", "auto"):
        out = (-Vi(x).sqdist(Vj(y))).exp().sum(dim=1, dtype_acc=acc)
        assert out.dtype == np.float16
        close(out, exact, rtol=2e-3, atol=0)
    g = Genred("Exp(-SqDist(x, y))", ["x = Vi(3)", "y = Vj(3)"], axis=1, dtype_acc="float16")
    close(g(torch.from_numpy(x), torch.from_numpy(y)), exact, rtol=2e-3, atol=0)
    # pykeops's rule: float16 data takes float16 or float32, float32 data float32 or float64,
    # float64 data float64 only
    for dtype, acc in (("float32", "float16"), ("float64", "float32"), ("float16", "float64")):
        K = Vi(x.astype(dtype)).sqdist(Vj(y.astype(dtype)))
        with pytest.raises(ValueError, match=f"dtype_acc='{acc}' does not apply to {dtype} data"):
            K.sum(dim=1, dtype_acc=acc)
    with pytest.raises(ValueError, match="'float16', 'float32' or 'float64'.*'half'"):
        Vi(x).sqdist(Vj(y)).sum(dim=1, dtype_acc="half")


# ------------------------------------------------------------------ 7. print(K)


def test_print_as_pykeops(rng, capsys):
    x, y = rng.random((1000, 3)), rng.random((2000, 3))
    x_i, y_j = LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :])
    K = (-((x_i - y_j) ** 2).sum(-1)).exp()
    print(K)
    # pykeops 2.3 prints these three lines for this kernel
    assert capsys.readouterr().out == (
        "KeOps LazyTensor\n"
        "    formula: Exp(Minus(Sum(Square((Var(0,3,0) - Var(1,3,1))))))\n"
        "    shape: (1000, 2000)\n")
    assert repr(K) == str(K)
    V = (x_i - y_j) * Vj(y[:, :1])
    assert str(V).splitlines()[1:] == ["    formula: ((Var(0,3,0) - Var(1,3,1)) * Var(2,1,1))",
                                       "    shape: (1000, 2000, 3)"]
    f = (Vi(0, 3) | Vj(1, 3)).argKmin(4, dim=1)
    assert str(f).splitlines()[1:] == [
        "    formula: Sum((Var(0,3,0) * Var(1,3,1)))",
        "    symbolic variables: Var(0, 3, 0), Var(1, 3, 1)",
        "    shape: (1, 1)",
        "    reduction: ArgKMin (axis=1)",
        "        opt_arg: 4"]


def test_symbolic_formula_has_no_dense_value():
    with pytest.raises(ValueError, match=r"symbolic variables \(Vi\(0, 3\), Vj\(1, 3\)\)"):
        Vi(0, 3).sqdist(Vj(1, 3)).dense()


def test_a_number_on_the_left_is_numbered_after_the_arrays(rng):
    """``0.5 * x_i``: pykeops keeps x first (Var 0) and the number second (Var 1), in the
    printed formula and in callfun's arguments."""
    x = rng.random((6, 3))
    K = 0.5 * Vi(x)
    assert str(K).splitlines()[1] == "    formula: (Var(1,1,2) * Var(0,3,0))"
    f = (2.0 - Vi(x).sqnorm2() * Vj(0, 1)).sum(dim=1)
    y = rng.random((4, 1))
    want = (2.0 - (x**2).sum(1, keepdims=True) * y.T).sum(1, keepdims=True)
    close(f(y), want)
    close(f.callfun(y, x, 2.0), want)  # y (symbolic), x, then the number


def test_symbolic_reduction_takes_ranges_and_out_at_call(rng):
    from lazytensor.scale.cluster import cluster_ranges, from_matrix, grid_cluster, sort_clusters

    x, y = np.sort(rng.random((60, 1)), 0), np.sort(rng.random((50, 1)), 0)
    xl, yl = grid_cluster(x, 0.25), grid_cluster(y, 0.25)
    x, xl = sort_clusters(x, xl)
    y, yl = sort_clusters(y, yl)
    rx, ry = cluster_ranges(xl), cluster_ranges(yl)
    keep = np.abs(np.arange(len(rx))[:, None] - np.arange(len(ry))[None]) <= 1
    f = (-Vi(0, 1).sqdist(Vj(1, 1))).exp().sum(dim=1)
    mask = keep[xl][:, yl]  # the pairs whose clusters interact
    out = np.empty((60, 1))
    got = f(x, y, ranges=from_matrix(rx, ry, keep), out=out)
    assert got is out
    close(out, (np.exp(-sqd(x, y)) * mask).sum(1, keepdims=True))
