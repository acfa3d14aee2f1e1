"""Kernel linear solves: against numpy.linalg.solve, torch gradients against dense torch, and
SciPy's LinearOperator protocol (aslinearoperator + cg)."""

import warnings

import numpy as np
import pytest
import scipy.sparse.linalg as sla
import torch

from lazytensor import KernelSolve, LazyTensor, Vi, Vj
from lazytensor.api.solve import solve

N = 40


def _gauss(x, y, scale=4.0):
    return np.exp(-scale * ((x[:, None] - y[None]) ** 2).sum(-1))


def _kernel(x, scale=4.0):
    return (-Vi(x).sqdist(Vj(x)) * scale).exp()


def test_solve_matches_dense_numpy(rng):
    x, b = rng.uniform(size=(N, 2)), rng.normal(size=(N, 3))
    alpha = 0.2
    dense = _gauss(x, x) + alpha * np.eye(N)
    a = _kernel(x).solve(b, alpha=alpha, eps=1e-12)
    np.testing.assert_allclose(a, np.linalg.solve(dense, b), rtol=1e-8, atol=1e-9)
    a1 = solve(_kernel(x), b[:, 0], alpha=alpha, eps=1e-12)  # a vector b gives a vector x
    assert a1.shape == (N,)
    np.testing.assert_allclose(a1, np.linalg.solve(dense, b[:, 0]), rtol=1e-8, atol=1e-9)
    np.testing.assert_array_equal(solve(_kernel(x), np.zeros((N, 1)), alpha=alpha), 0)
    # var=: K is a formula linear in a Vj leaf (here the same IR, hence the same kernel)
    v = Vj(np.zeros((N, 3)))
    a2 = (_kernel(x) * v).solve(b, alpha=alpha, eps=1e-12, var=v)
    np.testing.assert_allclose(a2, np.linalg.solve(dense, b), rtol=1e-8, atol=1e-9)


def test_kernel_solve_both_axes(rng):
    x, b = rng.uniform(size=(N, 2)), rng.normal(size=(N, 3))
    expected = np.linalg.solve(_gauss(x, x) + 0.2 * np.eye(N), b)
    # The same IR as _kernel(x).solve(...): the compiled kernel is shared.
    Kinv = KernelSolve("Exp(-SqDist(x, y) * g) * b", ["x = Vi(2)", "y = Vj(2)", "g = Pm(1)",
                                                       "b = Vj(3)"], "b", axis=1)
    np.testing.assert_allclose(Kinv(x, x, 4.0, b, alpha=0.2, eps=1e-12), expected, rtol=1e-8, atol=1e-9)
    Kinv0 = KernelSolve("Exp(-SqDist(x, y) * g) * b", ["x = Vi(2)", "y = Vj(2)", "g = Pm(1)",
                                                        "b = Vi(3)"], "b", axis=0)
    out = Kinv0(x, x, np.array([4.0]), b, alpha=0.2, eps=1e-12, backend="numpy")
    np.testing.assert_allclose(out, expected, rtol=1e-8, atol=1e-9)
    with pytest.raises(ValueError, match="must be Vj"):
        KernelSolve("x * b", ["x = Vi(1)", "b = Vi(1)"], "b", axis=1)
    with pytest.raises(ValueError, match="not one of the aliases"):
        KernelSolve("x * b", ["x = Vi(1)", "b = Vj(1)"], "c", axis=1)


def test_torch_gradients_match_dense_torch(rng):
    x0, b0, w0 = rng.uniform(size=(N, 2)), rng.normal(size=(N, 2)), rng.normal(size=(N, 2))
    x = torch.tensor(x0, requires_grad=True)
    b = torch.tensor(b0, requires_grad=True)
    alpha = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    a = _kernel(x).solve(b, alpha=alpha, eps=1e-13)
    w = torch.tensor(w0)
    got = torch.autograd.grad((a * w).sum(), [x, b, alpha])

    xd, bd = torch.tensor(x0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    ad_alpha = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    K = torch.exp(-4 * ((xd[:, None] - xd[None]) ** 2).sum(-1))
    ad = torch.linalg.solve(K + ad_alpha * torch.eye(N, dtype=torch.float64), bd)
    np.testing.assert_allclose(a.detach().numpy(), ad.detach().numpy(), rtol=1e-9, atol=1e-10)
    want = torch.autograd.grad((ad * w).sum(), [xd, bd, ad_alpha])
    for g, h in zip(got, want):
        np.testing.assert_allclose(g.numpy(), h.numpy(), rtol=1e-7, atol=1e-8)


def test_torch_gradient_through_kernel_solve_with_parameter(rng):
    """x passed twice (as Vi and Vj) and a parameter: each slot gets its own gradient."""
    x0, b0 = rng.uniform(size=(N, 2)), rng.normal(size=(N, 3))
    Kinv = KernelSolve("Exp(-SqDist(x, y) * g) * b", ["x = Vi(2)", "y = Vj(2)", "g = Pm(1)",
                                                       "b = Vj(3)"], "b", axis=1)
    x = torch.tensor(x0, requires_grad=True)
    g = torch.tensor([4.0], dtype=torch.float64, requires_grad=True)
    a = Kinv(x, x, g, torch.tensor(b0), alpha=0.2, eps=1e-13)
    got = torch.autograd.grad(a.pow(2).sum(), [x, g])
    xd, gd = torch.tensor(x0, requires_grad=True), torch.tensor([4.0], dtype=torch.float64,
                                                                 requires_grad=True)
    K = torch.exp(-gd * ((xd[:, None] - xd[None]) ** 2).sum(-1))
    ad = torch.linalg.solve(K + 0.2 * torch.eye(N, dtype=torch.float64), torch.tensor(b0))
    want = torch.autograd.grad(ad.pow(2).sum(), [xd, gd])
    for u, v in zip(got, want):
        np.testing.assert_allclose(u.numpy(), v.numpy(), rtol=1e-7, atol=1e-8)


def test_scipy_aslinearoperator_and_cg(rng):
    x, y = rng.uniform(size=(N, 2)), rng.uniform(size=(N + 7, 2))
    K = (-Vi(x).sqdist(Vj(x)) * 4.0).exp()
    assert K.shape == (N, N)
    A = sla.aslinearoperator(K)
    assert A.shape == (N, N) and A.dtype == np.float64
    b = rng.normal(size=N)
    dense = _gauss(x, x)
    sol, info = sla.cg(A + 0.5 * sla.aslinearoperator(np.eye(N)), b, rtol=1e-12, atol=0)
    assert info == 0
    np.testing.assert_allclose(sol, np.linalg.solve(dense + 0.5 * np.eye(N), b), rtol=1e-7, atol=1e-8)
    # A rectangular kernel: matvec, rmatvec and matmat against the dense matrix.
    R = sla.aslinearoperator((-Vi(x).sqdist(Vj(y)) * 4.0).exp())
    D = _gauss(x, y)
    v, u, V = rng.normal(size=N + 7), rng.normal(size=N), rng.normal(size=(N + 7, 3))
    np.testing.assert_allclose(R.matvec(v), D @ v, rtol=1e-12)
    np.testing.assert_allclose(R.rmatvec(u), D.T @ u, rtol=1e-12)
    np.testing.assert_allclose(R.matmat(V), D @ V, rtol=1e-12)
    u32 = u.astype(np.float32)  # cast to the kernel's dtype
    np.testing.assert_allclose(R.rmatvec(u32), D.T @ u32.astype(np.float64), rtol=1e-12)


def test_not_converged_warns_and_bad_inputs_raise(rng):
    x = rng.uniform(size=(N, 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _kernel(x).solve(rng.normal(size=(N, 1)), alpha=1e-3, maxiter=1)
    assert any(issubclass(w.category, RuntimeWarning) and "maxiter" in str(w.message) for w in caught)
    y = rng.uniform(size=(N + 1, 2))
    with pytest.raises(ValueError, match="square"):
        solve((-Vi(x).sqdist(Vj(y))).exp(), np.ones(N))
    with pytest.raises(ValueError, match="scalar"):
        solve(Vi(x) - Vj(x), np.ones(N))
    with pytest.raises(ValueError, match="non-negative"):
        solve(_kernel(x), np.ones(N), alpha=-1.0)
    assert isinstance(_kernel(x), LazyTensor)
