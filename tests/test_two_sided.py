"""Both sides of a backward in one CPU kernel (lazytensor.backends.cpu.backward, codegen.cpu.twosided),
against float64 NumPy: the Gaussian kernel product's gradients in x, y and σ, a K @ V
gradient with two dot products, batches, thread counts, several spans of columns."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lazytensor.codegen import ir, ops
from lazytensor.codegen.cpu.twosided import render_two_sided, two_sided_formula
from lazytensor.codegen.render_c import VarSpec

import lazytensor.backends.cpu.backward as ts
from lazytensor import LazyTensor, Pm, Vi, Vj


@pytest.fixture
def fused(monkeypatch):
    """Counts the backwards that took the two-sided kernel."""
    seen = []
    real = ts.two_sided_totals

    def spy(*args):
        out = real(*args)
        seen.append(out is not None)
        return out

    monkeypatch.setattr(ts, "two_sided_totals", spy)
    return seen


def _gauss_grads(x, y, b, g, s):
    """float64 NumPy gradients of sum(g * (exp(-|x - y|² / s²) @ b)) in x, y and s, and the
    sums of the terms' magnitudes (the scale float32 rounding errors follow)."""
    diff = x[..., :, None, :] - y[..., None, :, :]
    d2 = (diff ** 2).sum(-1)
    w = g * np.exp(-d2 / s ** 2) * np.swapaxes(b, -1, -2)  # (..., N, M)
    gx = (-2 / s ** 2) * (w[..., None] * diff).sum(-2)
    gy = (2 / s ** 2) * (w[..., None] * diff).sum(-3)
    gs = (w * d2).sum() * 2 / s ** 3
    scale_x = (2 / s ** 2) * (np.abs(w)[..., None] * np.abs(diff)).sum(-2)
    scale_y = (2 / s ** 2) * (np.abs(w)[..., None] * np.abs(diff)).sum(-3)
    scale_s = (np.abs(w) * d2).sum() * 2 / s ** 3
    return (gx, gy, gs), (scale_x, scale_y, scale_s)


def _check(got, want, scale, rtol):
    err = np.abs(np.asarray(got, dtype=np.float64) - want)
    assert np.all(err <= rtol * scale + 1e-30), float((err / (scale + 1e-30)).max())


def _run_gauss(x, y, b, g, s, dtype):
    t = [torch.tensor(v, dtype=dtype) for v in (x, y, b, g, s)]
    xs, ys, ss = (v.clone().requires_grad_(True) for v in (t[0], t[1], t[4]))
    if xs.dim() == 2:
        a = (-Vi(xs).sqdist(Vj(ys)) / Pm(ss * ss)).exp() @ t[2]
    else:  # batch dimensions
        xi, yj = LazyTensor(xs[..., :, None, :]), LazyTensor(ys[..., None, :, :])
        K = (-xi.sqdist(yj) / Pm(ss * ss)).exp()
        a = (K * LazyTensor(t[2][..., None, :, :])).sum(dim=xs.dim() - 1)  # over j
    (a * t[3]).sum().backward()
    return xs.grad.numpy(), ys.grad.numpy(), ss.grad.numpy()


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("D,N,M", [(64, 257, 1100), (17, 41, 530), (100, 300, 1031),
                                   (32, 5, 20_000)])
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-4), (torch.float64, 1e-11)])
def test_gaussian_gradients_in_x_y_and_sigma(D, N, M, dtype, rtol, threads, rng, fused,
                                             monkeypatch):
    """N, M not multiples of the row block, the tile or the chunk; (5, 20,000) on 2
    threads: a span per piece of j (several spans, their partial sums cleared)."""
    monkeypatch.setenv("LAZYTENSOR_NUM_THREADS", threads)
    x = rng.random((N, D)) * 0.3
    y = rng.random((M, D)) * 0.3
    b = rng.standard_normal((M, 1))
    g = rng.standard_normal((N, 1))
    s = np.array([0.1 * D ** 0.5 * 1.3])
    got = _run_gauss(x, y, b, g, s, dtype)
    want, scale = _gauss_grads(x, y, b, g, s[0])
    assert fused == [True]
    for u, v, sc in zip(got, want, scale):
        _check(u.reshape(np.shape(v)), v, sc, rtol)


def test_batches_and_a_broadcast_side(rng, fused):
    """Batch dimensions: x (2, 3, N, D), y broadcast along the first (1, 3, M, D), so its
    gradient sums over it."""
    D, N, M = 20, 37, 150
    x = rng.random((2, 3, N, D)) * 0.4
    y = rng.random((1, 3, M, D)) * 0.4
    b = rng.standard_normal((2, 3, M, 1))
    g = rng.standard_normal((2, 3, N, 1))
    s = np.array([0.9])
    gx, gy, gs = _run_gauss(x, y, b, g, s, torch.float32)
    want, scale = _gauss_grads(x, y, b, g, s[0])
    assert fused == [True]
    _check(gx, want[0], scale[0], 1e-4)
    _check(gy, want[1].sum(0, keepdims=True), scale[1].sum(0, keepdims=True), 1e-4)
    _check(gs, want[2], scale[2], 1e-4)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_matrix_product_gradients_with_two_dot_products(threads, rng, fused, monkeypatch):
    """loss = Σ <G_i, (K @ V)_i>, K Gaussian in dimension 24, V and G 40 wide: the
    i-side weights k <G_i, V_j> (a second dot product), the j-side sums of k G_i (V's
    gradient) and of k <G_i, V_j> x_i (y's)."""
    monkeypatch.setenv("LAZYTENSOR_NUM_THREADS", threads)
    D, E, N, M = 24, 40, 203, 1400
    x, y = rng.random((N, D)) * 0.3, rng.random((M, D)) * 0.3
    V, G = rng.standard_normal((M, E)), rng.standard_normal((N, E))
    xs, ys, Vs = (torch.tensor(a, dtype=torch.float32, requires_grad=True) for a in (x, y, V))
    out = (-Vi(xs).sqdist(Vj(ys))).exp() @ Vs
    (out * torch.tensor(G, dtype=torch.float32)).sum().backward()
    assert fused == [True]
    xd, yd, Vd = (torch.tensor(a, requires_grad=True) for a in (x, y, V))
    K = torch.exp(-((xd[:, None] - yd[None]) ** 2).sum(-1))
    ((K @ Vd) * torch.tensor(G)).sum().backward()
    Kn = K.detach().numpy()
    gv = np.abs(G) @ np.abs(V).T * Kn  # |weights| of the x and y gradients
    scale_x = 2 * (gv[..., None] * np.abs(x[:, None] - y[None])).sum(1)
    scale_y = 2 * (gv[..., None] * np.abs(x[:, None] - y[None])).sum(0)
    _check(xs.grad.numpy(), xd.grad.numpy(), scale_x, 1e-4)
    _check(ys.grad.numpy(), yd.grad.numpy(), scale_y, 1e-4)
    _check(Vs.grad.numpy(), Vd.grad.numpy(), Kn.T @ np.abs(G), 1e-4)


def test_one_side_or_a_graph_takes_the_one_sided_kernels(rng, fused):
    """Only x needs a gradient: one Sum; create_graph: the differentiable Sums (the
    second derivative checked against dense torch)."""
    x = torch.tensor(rng.random((60, 20)) * 0.3, requires_grad=True)
    y = torch.tensor(rng.random((70, 20)) * 0.3, requires_grad=True)
    (-Vi(x).sqdist(Vj(y.detach()))).exp().sum(1).sum().backward()
    assert fused == []
    gx, = torch.autograd.grad((-Vi(x).sqdist(Vj(y))).exp().sum(1).sum(), x, create_graph=True)
    assert fused == []
    (gx ** 2).sum().backward()  # the gradient Sum's own backward (may take the kernel)
    xd, yd = x.detach().clone().requires_grad_(True), y.detach().clone().requires_grad_(True)
    gd, = torch.autograd.grad(torch.exp(-((xd[:, None] - yd[None]) ** 2).sum(-1)).sum(), xd,
                              create_graph=True)
    (gd ** 2).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), yd.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_the_kernel_sums_both_sides_from_one_pair_loop():
    x, y, g = ir.var(0, 64, "i"), ir.var(1, 64, "j"), ir.var(2, 1, "i")
    k = ops.apply("exp", ops.apply("neg", ops.apply("sum", ops.apply("square", ops.apply("sub", x, y)))))
    w = ops.apply("mul", g, k)
    f = two_sided_formula(ops.apply("mul", w, y), ops.apply("mul", w, x))
    src = render_two_sided(f, [VarSpec(0, 64, "i"), VarSpec(1, 64, "j"), VarSpec(2, 1, "i")],
                           {}, "float32")
    # one product for the distances, the weight computed once for both sides
    assert src.count("lt_dot64(Ab0") == 1 and "T o[1];" in src
    assert "lt_wblock(fb, 1 * TJ" in src and "lt_jside(fb, 1 * TJ" in src
    with pytest.raises(ValueError, match="two wide sums"):
        render_two_sided(two_sided_formula(w, w), [VarSpec(0, 64, "i"), VarSpec(1, 64, "j"),
                                                   VarSpec(2, 1, "i")], {}, "float32")
