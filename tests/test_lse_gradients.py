"""Gradients of the log-sum-exp family: float32 accuracy, and the limit at +inf.

The weights exp(f - lse) of these gradients amplify any difference between the f the
forward reduced and the f the backward evaluates: at f ~ -1e5 (squared distances of
3 * randn points in dimension 64, divided by 1e-2), one float32 ulp of f is 0.008. The
backward rounds f as the forward stored it (op ``softmax_weight``) and normalizes the
i-side gradients by the weights' own sum. Errors are measured against float64 on the
same float32 inputs, next to dense torch float32's (the yardstick: near ties between
terms make both lose digits on some draws).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lazytensor import Vi, Vj


def _lse_and_grads(x, y, dim: int, eps: float, how: str, g=None):
    """(output, grad x, grad y) in float64 of ``logsumexp(-|x_i - y_j|^2 / eps)`` over
    ``dim``: dense torch (``how="dense"``) or lazytensor with ``grad_mode=how``."""
    x, y = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    if how == "dense":
        out = torch.logsumexp(-((x[:, None] - y[None]) ** 2).sum(-1) / eps, dim)
    else:
        out = (-Vi(x).sqdist(Vj(y)) / eps).logsumexp(dim=dim, grad_mode=how).reshape(-1)
    (out * (1 if g is None else g.to(out.dtype))).sum().backward()
    return [t.detach().double() for t in (out, x.grad, y.grad)]


def _rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("dim", [1, 0])
@pytest.mark.parametrize("grad_mode", ["auto", "symbolic", "dual"])
def test_float32_gradients_are_as_accurate_as_dense_torch(rng, grad_mode, dim):
    """The reported case: 200 x 300 points, D = 64, eps = 1e-2 (errors of 1e-3 to 1e-1
    before, where dense float32 torch has about 6e-8)."""
    x = torch.from_numpy(3 * rng.standard_normal((200, 64))).float()
    y = torch.from_numpy(3 * rng.standard_normal((300, 64))).float()
    ref = _lse_and_grads(x.double(), y.double(), dim, 1e-2, "dense")
    dense = _lse_and_grads(x, y, dim, 1e-2, "dense")
    got = _lse_and_grads(x, y, dim, 1e-2, grad_mode)
    for name, a, d, r in zip(("value", "grad x", "grad y"), got, dense, ref):
        err, yardstick = _rel(a, r), _rel(d, r)
        print(f"{name}: {err:.1e} (dense float32: {yardstick:.1e})")
        assert err <= 4 * yardstick + 1e-6, (name, err, yardstick)


def test_float32_gradients_with_a_random_cotangent_and_a_weighted_lse(rng):
    """A random output cotangent, and the softmax-weighted sum (its j-side weights and
    its i-side, normalized, gradients) against float64."""
    x = torch.from_numpy(3 * rng.standard_normal((150, 32))).float()
    y = torch.from_numpy(3 * rng.standard_normal((220, 32))).float()
    g = torch.from_numpy(rng.standard_normal(150))
    ref = _lse_and_grads(x.double(), y.double(), 1, 1e-2, "dense", g)
    dense = _lse_and_grads(x, y, 1, 1e-2, "dense", g)
    got = _lse_and_grads(x, y, 1, 1e-2, "auto", g)
    for a, d, r in zip(got, dense, ref):
        assert _rel(a, r) <= 4 * _rel(d, r) + 1e-6

    b = torch.from_numpy(rng.standard_normal((220, 3)))

    def ssw(xx, yy, bb, lazy):
        xx, yy, bb = (t.detach().clone().requires_grad_() for t in (xx, yy, bb))
        if lazy:
            out = (-Vi(xx).sqdist(Vj(yy)) / 1e-2).sumsoftmaxweight(Vj(bb), dim=1)
        else:
            out = torch.softmax(-((xx[:, None] - yy[None]) ** 2).sum(-1) / 1e-2, 1) @ bb
        (out * g[:, None].to(out.dtype)).sum().backward()
        return [t.detach().double() for t in (out, bb.grad)]

    ref = ssw(x.double(), y.double(), b, False)
    dense = ssw(x, y, b.float(), False)
    got = ssw(x, y, b.float(), True)
    for a, d, r in zip(got, dense, ref):
        assert _rel(a, r) <= 4 * _rel(d, r) + 1e-6


@pytest.mark.parametrize("grad_mode", ["symbolic", "dual"])
def test_float32_j_side_weights_below_the_ulp_of_f(rng, grad_mode):
    """Σ_i exp(f_ij - lse_i), the j-side weights (the gradient of a zero j-offset b_j):
    where a row's second term is e^-7 below its first, f - lse ~ -1e-3 is below the
    float32 ulp of f ~ -7e4, so weights taken from the stored lse are 1 for 0.9988 (errors
    of 5e-5 where dense torch has 1e-6); they come from f - max and the shifted sum."""
    x = torch.from_numpy(3 * rng.standard_normal((200, 64))).float()
    y = torch.from_numpy(3 * rng.standard_normal((300, 64))).float()
    f64 = -((x.double()[:, None] - y.double()[None]) ** 2).sum(-1) / 1e-2
    ref = torch.softmax(f64, 1).sum(0)
    dense = torch.softmax(-((x[:, None] - y[None]) ** 2).sum(-1) / 1e-2, 1).sum(0).double()
    b = torch.zeros(300, 1, requires_grad=True)
    (-Vi(x).sqdist(Vj(y)) / 1e-2 + Vj(b)).logsumexp(dim=1, grad_mode=grad_mode).sum().backward()
    err, yardstick = _rel(b.grad[:, 0].double(), ref), _rel(dense, ref)
    print(f"column sums of the weights: {err:.1e} (dense float32: {yardstick:.1e})")
    assert err <= 4 * yardstick + 1e-6


# ------------------------------------------------------------------ at +inf


def _x_grads(val: float, form: str):
    """{mode: x.grad} of ``logsumexp_j F(x_i, y_j)`` with x_0 = val."""
    out = {}
    for mode in ("symbolic", "dual"):
        x = torch.tensor([[val], [1.0]], dtype=torch.float64, requires_grad=True)
        y = torch.tensor([[1.0], [2.0], [0.5]], dtype=torch.float64)
        F = Vi(x) * Vj(y) if form == "product" else Vi(x) + Vj(y)
        F.logsumexp(dim=1, grad_mode=mode).sum().backward()
        out[mode] = x.grad.reshape(-1)
    return out


@pytest.mark.parametrize("val", [math.inf, 1e300])
@pytest.mark.parametrize("form", ["sum", "product"])
def test_grad_modes_agree_at_huge_and_infinite_inputs(val, form):
    """Both modes follow the softmax weights' limit: terms at +inf (or equal, as
    1e300 + y_j all round to 1e300) share the weight equally, other terms get 0."""
    got = _x_grads(val, form)
    torch.testing.assert_close(got["symbolic"], got["dual"], rtol=1e-12, atol=0)
    y = np.array([1.0, 2.0, 0.5])
    row1 = (np.exp(y) / np.exp(y).sum() * (y if form == "product" else 1)).sum()
    if form == "sum":
        row0 = 1.0  # d/dx lse_j(x + y_j) = 1 for every x, where torch gives 3 at 1e300
    elif val == math.inf:
        row0 = y.mean()  # every term at +inf: the equal-weight limit
    else:
        row0 = y.max()  # 1e300 * y_j: the largest term alone
    np.testing.assert_allclose(got["symbolic"].numpy(), [row0, row1], rtol=1e-12)
