"""Gradients at the ops' singular points follow torch's conventions, in every grad mode
(symbolic, dual) and through the indices of min, max and the K-min family.

Each case is a formula of ``u = x_i - y_j`` (and ``x_i``, ``y_j``) over points chosen so
that many pairs sit exactly on the op's singular point (u = 0, a base 0 with an exponent
0, the origin of atan2, the edges of a clamp), reduced over j, then differentiated
through ``sum(out ** 2)``: the gradient in x and y is compared with dense float64 torch on
the same formula, NaN for NaN, inf for inf. Where we differ from torch by design, the
case says so and checks our documented value instead:

- ``sqrt``'s derivative at 0 is 0 (KeOps's convention, so that a distance
  ``sqrt(|x - y|²)`` has the gradient ``torch.linalg.norm`` gives at x = y, where torch's
  ``sqrt`` gives ``inf * 0 = NaN``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lazytensor.codegen import compilers

from lazytensor import Vi, Vj

needs_cxx = pytest.mark.skipif(not compilers.cpu_compiler().available, reason="no C++ compiler")

# name: (LazyTensor formula of (xi, yj), the torch formula of (x[:, None], y[None]))
CASES = {
    "atan2_origin": (lambda a, b: (a[1] - b[1]).atan2(a[0] - b[0]),
                     lambda a, b: torch.atan2(a[..., 1:2] - b[..., 1:2], a[..., 0:1] - b[..., 0:1])),
    "abs": (lambda a, b: (a - b).abs().sum(), lambda a, b: (a - b).abs().sum(-1, keepdim=True)),
    "relu": (lambda a, b: (a - b).relu().sum(), lambda a, b: torch.relu(a - b).sum(-1, keepdim=True)),
    "sign": (lambda a, b: (a - b).sign().sum() * a.sum(),
             lambda a, b: torch.sign(a - b).sum(-1, keepdim=True) * a.sum(-1, keepdim=True)),
    "step": (lambda a, b: (a - b).step().sum() * b.sum(),
             lambda a, b: (a - b >= 0).to(a.dtype).sum(-1, keepdim=True) * b.sum(-1, keepdim=True)),
    "clamp_edges": (lambda a, b: (a - b).clamp(-1.0, 1.0).sum(),
                    lambda a, b: (a - b).clamp(-1.0, 1.0).sum(-1, keepdim=True)),
    "clamp_formula_bounds": (lambda a, b: a.clamp(b - 1.0, b + 1.0).sum(),
                             lambda a, b: torch.clamp(a, b - 1.0, b + 1.0).sum(-1, keepdim=True)),
    "log_at_0": (lambda a, b: ((a - b).square().sum() + 1.0).log(),
                 lambda a, b: (((a - b) ** 2).sum(-1, keepdim=True) + 1.0).log()),
    "norm_at_0": (lambda a, b: (a - b).norm2(),
                  lambda a, b: torch.linalg.vector_norm(a - b, dim=-1, keepdim=True)),
    "pow_0_base": (lambda a, b: ((a - b) ** 3).sum() + ((a - b) ** 1).sum()
                   + ((a - b) ** 0).sum() * a.sum(),
                   lambda a, b: ((a - b) ** 3).sum(-1, keepdim=True) + ((a - b) ** 1).sum(-1, keepdim=True)
                   + ((a - b) ** 0).sum(-1, keepdim=True) * a.sum(-1, keepdim=True)),
    "powf_0_base_0_exponent": (lambda a, b: (a - b).abs().powf(b.abs()).sum(),
                               lambda a, b: torch.pow((a - b).abs(), b.abs()).sum(-1, keepdim=True)),
    "sinxdivx_at_0": (lambda a, b: (a - b).sinxdivx().sum(),
                      lambda a, b: torch.sinc((a - b) / torch.pi).sum(-1, keepdim=True)),
    "ifelse_at_0": (lambda a, b: (a - b).sum().ifelse(a.sum() * 2.0, b.sum() * 3.0),
                    lambda a, b: torch.where((a - b).sum(-1, keepdim=True) >= 0, a.sum(-1, keepdim=True) * 2.0,
                                             b.sum(-1, keepdim=True) * 3.0)),
    "maximum_tie": (lambda a, b: torch.maximum(a, b).sum() + torch.minimum(a, b * 2.0).sum(),
                    lambda a, b: torch.maximum(a, b).sum(-1, keepdim=True)
                    + torch.minimum(a, b * 2.0).sum(-1, keepdim=True)),
    "torch_clamp_edges": (lambda a, b: torch.clamp((a - b) * 0.5, -0.5, 0.5).sum()
                          + torch.clamp(a - b, min=0.0).sum() + torch.clamp(a - b, max=1.0).sum(),
                          lambda a, b: torch.clamp((a - b) * 0.5, -0.5, 0.5).sum(-1, keepdim=True)
                          + torch.clamp(a - b, min=0.0).sum(-1, keepdim=True)
                          + torch.clamp(a - b, max=1.0).sum(-1, keepdim=True)),
    # ours by design (see the module docstring): sqrt'(0) = 0, the norm's subgradient
    "sqrt_at_0": (lambda a, b: (a - b).square().sum().sqrt(),
                  lambda a, b: torch.linalg.vector_norm(a - b, dim=-1, keepdim=True)),
}


def _points(rng, n: int) -> np.ndarray:
    """n points of dimension 2 on a coarse grid (many equal values, zeros, +-1 apart)."""
    return rng.integers(-2, 3, size=(n, 2)).astype(np.float64)


def _gradients(case: str, x: torch.Tensor, y: torch.Tensor, mode: str | None):
    lazy, dense = CASES[case]
    xs, ys = x.clone().requires_grad_(), y.clone().requires_grad_()
    if mode is None:
        out = dense(xs[:, None], ys[None]).sum(1)
    else:
        out = lazy(Vi(xs), Vj(ys)).sum(dim=1, grad_mode=mode)
    grads = torch.autograd.grad(out.square().sum(), [xs, ys], allow_unused=True)
    return out.detach(), [torch.zeros_like(v) if g is None else g for g, v in zip(grads, (xs, ys))]


@needs_cxx
@pytest.mark.parametrize("mode", ["symbolic", "dual"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_gradient_at_singular_points_follows_torch(case, mode, rng):
    x = torch.from_numpy(_points(rng, 40))
    y = torch.cat([x[:25], torch.from_numpy(_points(rng, 15))])  # y_j = x_i for many pairs
    value, (gx, gy) = _gradients(case, x, y, mode)
    want, (wx, wy) = _gradients(case, x, y, None)
    torch.testing.assert_close(value, want, rtol=1e-12, atol=1e-12, equal_nan=True)
    torch.testing.assert_close(gx, wx, rtol=1e-12, atol=1e-12, equal_nan=True)
    torch.testing.assert_close(gy, wy, rtol=1e-12, atol=1e-12, equal_nan=True)


@needs_cxx
@pytest.mark.parametrize("mode", ["symbolic", "dual", "auto"])
def test_atan2_over_one_point_set_has_torch_gradient(mode, rng):
    """The report's case: every self-pair is atan2(0, 0); torch's gradient there is 0."""
    x = torch.tensor(rng.standard_normal((300, 2)), requires_grad=True)  # 90 000 pairs
    xi, xj = Vi(x), Vj(x)
    out = (xi[1] - xj[1]).atan2(xi[0] - xj[0]).sum(dim=1, grad_mode=mode)
    got, = torch.autograd.grad(out.square().sum(), [x])
    xd = x.detach().requires_grad_()
    d = xd[:, None] - xd[None]
    want, = torch.autograd.grad(torch.atan2(d[..., 1], d[..., 0]).sum(1).square().sum(), [xd])
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_sqrt_at_0_differs_from_torch_by_design():
    """What the documented exception is: torch's sqrt'(0) is inf, ours 0."""
    x = torch.zeros(3, 1, dtype=torch.float64, requires_grad=True)
    g, = torch.autograd.grad(torch.sqrt(x).sum(), [x])
    assert torch.isinf(g).all()
    xs = x.detach().requires_grad_()
    ones = Vj(torch.ones(2, 1, dtype=torch.float64))
    ours, = torch.autograd.grad((Vi(xs).sqrt() * ones).sum(dim=1, grad_mode="symbolic").sum(), [xs])
    assert torch.equal(ours, torch.zeros_like(ours))


@needs_cxx
@pytest.mark.parametrize("reduction", ["min", "max", "kmin"])
def test_gradients_through_indices_follow_the_same_conventions(reduction, rng):
    """Min, max and K-min gradients are computed at the pairs their indices select: there
    too sqrt'(0) and relu'(0) are 0 (as the Sum's gradient), not NaN and 1."""
    x = torch.from_numpy(rng.standard_normal((30, 1)))
    y = torch.cat([x[:20], torch.from_numpy(rng.standard_normal((10, 1)))])  # u = 0 pairs
    xs, ys = x.clone().requires_grad_(), y.clone().requires_grad_()
    sign = -1.0 if reduction == "max" else 1.0
    F = (Vi(xs) - Vj(ys)).abs().sqrt() * sign + (Vi(xs) - Vj(ys)).relu() * 1e-3
    out = F.Kmin(2, dim=1) if reduction == "kmin" else getattr(F, reduction)(dim=1)
    gx, gy = torch.autograd.grad(out.sum(), [xs, ys])
    assert torch.isfinite(gx).all() and torch.isfinite(gy).all()
    # the rows whose best pair is x_i = y_i: there the pair's gradient is exactly 0
    zero_rows = torch.arange(20)
    if reduction != "kmin":
        assert torch.equal(gx[zero_rows], torch.zeros_like(gx[zero_rows]))
