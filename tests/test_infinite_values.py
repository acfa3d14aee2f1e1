"""Log-sum-exp rows at +inf: the gradients of the other rows and columns stay finite.

``f(i, j) = -log |x_i - y_j|²`` is +inf where a point x_i sits on a point y_j, so the
log-sum-exp of that row is +inf too. Dense torch gives NaN only where the pair's own
derivative is undefined (the x_i and y_j that coincide) and finite gradients everywhere
else; the j-side gradient of the CPU kernel reads each row's log-sum-exp through its
maximum and shifted sum, and an infinite row must not spread NaN over every y_j.
"""
import numpy as np
import pytest
import torch

from lazytensor import Vi, Vj


def _points(seed, d):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((7, d))
    y = rng.standard_normal((5, d))
    x[2] = y[3]  # row 2 is +inf, column 3 has the undefined derivative
    return torch.from_numpy(x).requires_grad_(), torch.from_numpy(y).requires_grad_()


def _same(got, want, what):
    assert torch.equal(torch.isnan(got), torch.isnan(want)), f"{what}: NaN at other places\n{got}\n{want}"
    finite = ~torch.isnan(want)
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-10, atol=1e-12, msg=what)


@pytest.mark.parametrize("backend", ["CPU", "numpy"])
@pytest.mark.parametrize("grad_mode", ["auto", "symbolic", "dual"])
@pytest.mark.parametrize("d", [1, 3])
def test_logsumexp_rows_at_infinity_keep_the_other_gradients(backend, grad_mode, d):
    seed = np.random.SeedSequence().entropy % 2 ** 32
    x, y = _points(seed, d)
    w = torch.from_numpy(np.random.default_rng(seed + 1).standard_normal((7, 1)))
    F = -((Vi(x) - Vj(y)) ** 2).sum(-1).log()
    out = F.logsumexp(dim=1, backend=backend, grad_mode=grad_mode)
    gx, gy = torch.autograd.grad((out * w).sum(), [x, y])

    xd, yd = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    dense = -(((xd[:, None] - yd[None]) ** 2).sum(-1)).log()
    want = torch.logsumexp(dense, 1, keepdim=True)
    wx, wy = torch.autograd.grad((want * w).sum(), [xd, yd])

    assert torch.isinf(out[2]).all() and torch.isfinite(out[[0, 1, 3, 4, 5, 6]]).all(), seed
    _same(out.detach(), want.detach(), f"values, seed {seed}")
    _same(gx, wx, f"gradient in x, seed {seed}")
    _same(gy, wy, f"gradient in y, seed {seed}")
    assert torch.isfinite(gy[[0, 1, 2, 4]]).all(), f"seed {seed}: NaN spread over the columns"


@pytest.mark.parametrize("backend", ["CPU", "numpy"])
def test_softmax_weighted_sum_with_an_infinite_row_keeps_the_weight_gradients(backend):
    """Σ_j softmax_j(f) w_j with row 2 at +inf: the weights' gradient of the finite rows
    (and the finite part of row 2, the limit of its softmax: all weight on column 3)."""
    seed = np.random.SeedSequence().entropy % 2 ** 32
    x, y = _points(seed, 2)
    v = torch.from_numpy(np.random.default_rng(seed + 2).standard_normal((5, 2))).requires_grad_()
    F = -((Vi(x) - Vj(y)) ** 2).sum(-1).log()
    out = F.sumsoftmaxweight(Vj(v), dim=1, backend=backend)
    (gv,) = torch.autograd.grad(out.sum(), [v])

    dense = -(((x.detach()[:, None] - y.detach()[None]) ** 2).sum(-1)).log()
    finite_rows = torch.arange(7) != 2
    p = torch.softmax(dense[finite_rows], 1)  # (6, 5)
    vd = v.detach().clone().requires_grad_()
    want = p @ vd
    (wv,) = torch.autograd.grad(want.sum(), [vd])
    wv = wv.clone()
    wv[3] += 1.0  # row 2: all its weight on column 3
    torch.testing.assert_close(out.detach()[finite_rows], want.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out.detach()[2], v.detach()[3], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gv, wv, rtol=1e-10, atol=1e-12, msg=f"seed {seed}")


@pytest.mark.parametrize("backend", ["CPU", "numpy"])
@pytest.mark.parametrize("grad_mode", ["auto", "symbolic", "dual"])
@pytest.mark.parametrize("columns", [[2], [1, 3]])
def test_infinite_columns_follow_the_limit_on_both_sides(backend, grad_mode, columns):
    """f = <x_i, y_j> + c_j with c_j = +inf on ``columns``: every row's log-sum-exp is +inf
    and its softmax puts weight 1/k on each of the k infinite columns (the forward's limit).
    The gradients follow that limit on both sides: x_i gets the mean of those y_j, and each
    of those y_j gets (1/k) Σ_i w_i x_i; the finite columns get nothing."""
    seed = np.random.SeedSequence().entropy % 2 ** 32
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal((6, 2))).requires_grad_()
    y = torch.from_numpy(rng.standard_normal((5, 2))).requires_grad_()
    c = torch.from_numpy(rng.standard_normal((5, 1)))
    c[columns] = float("inf")
    w = torch.from_numpy(rng.standard_normal((6, 1)))
    F = (Vi(x) * Vj(y)).sum(-1) + Vj(c)
    out = F.logsumexp(dim=1, backend=backend, grad_mode=grad_mode)
    gx, gy = torch.autograd.grad((out * w).sum(), [x, y])
    k = len(columns)
    assert torch.isinf(out).all()
    want_x = w * y.detach()[columns].mean(0)
    want_y = torch.zeros_like(gy)
    want_y[columns] = (w * x.detach()).sum(0) / k
    torch.testing.assert_close(gx, want_x, rtol=1e-10, atol=1e-12, msg=f"x, seed {seed}")
    torch.testing.assert_close(gy, want_y, rtol=1e-10, atol=1e-12, msg=f"y, seed {seed}")
