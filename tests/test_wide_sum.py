"""Sums of wide terms on the CPU as weighted sums of j-vectors (codegen.cpu.wide),
against float64 dense NumPy: K @ V with many columns, combinations, tails, schemes."""

from __future__ import annotations

import numpy as np
import pytest
from lazytensor.codegen import ir, ops
from lazytensor.codegen.cpu.kernel import render_cpu_kernel
from lazytensor.codegen.render_c import VarSpec

from lazytensor import LazyTensor, Vi, Vj


def _gauss(x, y, s=1.0):
    return np.exp(-((x[..., :, None, :] - y[..., None, :, :]) ** 2).sum(-1) / s)


def test_the_kernel_uses_weighted_sums():
    x, y, v = ir.var(0, 3, "i"), ir.var(1, 3, "j"), ir.var(2, 64, "j")
    k = ops.apply("exp", ops.apply("neg", ops.apply("sum", ops.apply("square", ops.apply("sub", x, y)))))
    src = render_cpu_kernel(ops.apply("mul", k, v), [VarSpec(0, 3, "i"), VarSpec(1, 3, "j"),
                                                     VarSpec(2, 64, "j")], "sum", {}, "float32")
    assert "wtile" in src and "LtWsum<64, 64, 0>" in src
    src = render_cpu_kernel(ops.apply("concat", k, v), [VarSpec(0, 3, "i"), VarSpec(1, 3, "j"),
                                                        VarSpec(2, 64, "j")], "sumsoftmaxweight",
                            {}, "float32")
    assert "wtile" in src and "lt_lse_add" in src


@pytest.mark.parametrize("dtype,rtol", [("float32", 2e-5), ("float64", 1e-12)])
@pytest.mark.parametrize("E", [17, 33, 64, 70, 130])
@pytest.mark.parametrize("N,M", [(257, 300), (3, 20_000)])  # row blocks; split-j with few rows
def test_matmul_wide_values(E, dtype, rtol, N, M, rng):
    x = rng.random((N, 3)).astype(dtype)
    y = rng.random((M, 3)).astype(dtype)
    V = rng.standard_normal((M, E)).astype(dtype)
    out = (-Vi(x).sqdist(Vj(y)) / 0.1).exp() @ V
    K = _gauss(x.astype(np.float64), y.astype(np.float64), 0.1)
    want = K @ V.astype(np.float64)
    scale = K @ np.abs(V.astype(np.float64))
    assert np.all(np.abs(out - want) <= rtol * scale + 1e-30)


def test_kernels_with_dot_products_sum_several_rows_at_once():
    x, y, v = ir.var(0, 64, "i"), ir.var(1, 64, "j"), ir.var(2, 40, "j")
    k = ops.apply("exp", ops.apply("neg", ops.apply("sum", ops.apply("square", ops.apply("sub", x, y)))))
    src = render_cpu_kernel(ops.apply("mul", k, v), [VarSpec(0, 64, "i"), VarSpec(1, 64, "j"),
                                                     VarSpec(2, 40, "j")], "sum", {}, "float32")
    assert "lt_dot64" in src and "lt_wblock(" in src and "LtWsumBlock<40, 40, 0, 6, false>" in src


@pytest.mark.parametrize("dtype,rtol", [("float32", 2e-5), ("float64", 1e-12)])
@pytest.mark.parametrize("E", [17, 64, 70])
@pytest.mark.parametrize("scheme", ["block_sum", "kahan_scheme"])
def test_matmul_wide_values_with_dot_products(E, dtype, rtol, scheme, rng):
    """D = 64: row blocks of LT_R rows, their weighted sums 6 rows at a time and the odd
    rows (N = 41) one by one; E = 17 and 70 leave a tail of components."""
    N, M, D = 41, 530, 64
    x = (rng.random((N, D)) * 0.3).astype(dtype)
    y = (rng.random((M, D)) * 0.3).astype(dtype)
    V = rng.standard_normal((M, E)).astype(dtype)
    out = ((-Vi(x).sqdist(Vj(y)) / 2.0).exp() * Vj(V)).sum(1, sum_scheme=scheme)
    K = _gauss(x.astype(np.float64), y.astype(np.float64), 2.0)
    want = K @ V.astype(np.float64)
    scale = K @ np.abs(V.astype(np.float64))
    assert np.all(np.abs(np.asarray(out) - want) <= rtol * scale + 1e-30)


@pytest.mark.parametrize("scheme", ["direct_sum", "block_sum", "kahan_scheme"])
def test_combinations_schemes_and_batches(scheme, rng):
    B, N, M, D, E = 2, 40, 333, 20, 24
    x = rng.random((B, N, 1, D))
    y = rng.random((B, 1, M, D))
    V = rng.standard_normal((B, 1, M, E))
    W = rng.standard_normal((1, 1, M, E))
    xi, yj, vj, wj = LazyTensor(x), LazyTensor(y), LazyTensor(V), LazyTensor(W)
    k = (-xi.sqdist(yj) / 2.0).exp()
    s = (xi | yj).sin()
    # two j-vectors, two weights, a constant factor, a direct scalar component
    F = (k * vj - 2.0 * s * wj + k * wj).concat(k * s)
    out = F.sum(dim=2, sum_scheme=scheme)
    Kd = _gauss(x[:, :, 0], y[:, 0], 2.0)
    Sd = np.sin(np.einsum("bnd,bmd->bnm", x[:, :, 0], y[:, 0]))
    want = np.concatenate([Kd @ V[:, 0] - 2 * Sd @ W[:, 0] + Kd @ W[:, 0],
                           (Kd * Sd).sum(-1, keepdims=True)], -1)
    np.testing.assert_allclose(out, want, rtol=1e-11, atol=1e-11)


def test_wide_sum_gradients_match_dense(rng):
    torch = pytest.importorskip("torch")
    x = torch.rand(60, 3, dtype=torch.float64, requires_grad=True)
    y = torch.rand(70, 3, dtype=torch.float64, requires_grad=True)
    V = torch.randn(70, 40, dtype=torch.float64, requires_grad=True)
    out = (-Vi(x).sqdist(Vj(y)) / 0.2).exp() @ V
    g = torch.randn_like(out)
    grads = torch.autograd.grad((out * g).sum(), (x, y, V))
    Kd = torch.exp(-((x[:, None] - y[None]) ** 2).sum(-1) / 0.2)
    want = torch.autograd.grad(((Kd @ V) * g).sum(), (x, y, V))
    for a, w in zip(grads, want):
        torch.testing.assert_close(a, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("D", [20, 64])
def test_high_dimensional_gradients_split_row_terms(D, rng):
    """∂/∂x of Σ_j k(x_i, y_j) b_j in dimension D: c_ij (x_i - y_j) runs as x_i Σ_j c_ij
    minus a weighted sum of the y_j; first and second order against dense torch, batched."""
    torch = pytest.importorskip("torch")
    x = torch.rand(2, 50, 1, D, dtype=torch.float64, requires_grad=True)
    y = torch.rand(1, 1, 60, D, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 1, 60, 2, dtype=torch.float64, requires_grad=True)
    s = torch.tensor([[[[0.3 * D]]]], dtype=torch.float64, requires_grad=True)
    K = (-LazyTensor(x).sqdist(LazyTensor(y)) / LazyTensor(s.reshape(1, 1, 1, 1))).exp()
    out = (K * LazyTensor(b)).sum(dim=2)
    g = torch.randn_like(out)
    grads = torch.autograd.grad((out * g).sum(), (x, y, b, s), create_graph=True)
    Kd = torch.exp(-((x - y) ** 2).sum(-1) / s[..., 0])
    want = torch.autograd.grad(((Kd @ b[:, 0]) * g).sum(), (x, y, b, s), create_graph=True)
    for a, w in zip(grads, want):
        torch.testing.assert_close(a, w, rtol=1e-9, atol=1e-11)
    h = torch.autograd.grad(grads[0].square().sum() + grads[1].sum(), (x, y))
    hw = torch.autograd.grad(want[0].square().sum() + want[1].sum(), (x, y))
    for a, w in zip(h, hw):
        torch.testing.assert_close(a, w, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("dtype,rtol", [("float32", 3e-5), ("float64", 1e-12)])
@pytest.mark.parametrize("E", [17, 64, 70])
def test_attention_and_weighted_lse_with_wide_values(E, dtype, rtol, rng):
    N, M, D = 130, 700, 8
    q = rng.standard_normal((N, D)).astype(dtype)
    k = rng.standard_normal((M, D)).astype(dtype)
    v = rng.standard_normal((M, E)).astype(dtype)
    S = q.astype(np.float64) @ k.astype(np.float64).T
    P = np.exp(S - S.max(1, keepdims=True))
    out = (Vi(q) | Vj(k)).sumsoftmaxweight(Vj(v), dim=1)
    want = (P @ v.astype(np.float64)) / P.sum(1, keepdims=True)
    np.testing.assert_allclose(out, want, rtol=rtol, atol=rtol * np.abs(v).max())
    w = np.abs(v) + 0.5
    lse = (Vi(q) | Vj(k)).logsumexp(dim=1, weight=Vj(w))
    want_l = S.max(1, keepdims=True) + np.log(P @ w.astype(np.float64))
    np.testing.assert_allclose(lse, want_l, rtol=rtol, atol=rtol)
    # a weight that is a combination: softmax of f times (2 v + s w) with s = sin(q.k)
    s = (Vi(q) | Vj(k)).sin()
    out2 = (Vi(q) | Vj(k)).sumsoftmaxweight(2.0 * Vj(v) + s * Vj(w), dim=1)
    want2 = (P @ (2 * v.astype(np.float64)) + (P * np.sin(S)) @ w) / P.sum(1, keepdims=True)
    np.testing.assert_allclose(out2, want2, rtol=10 * rtol, atol=10 * rtol * np.abs(w).max())


def test_wide_softmax_special_values():
    """+inf terms dominate (each counts 1), rows of -inf only give NaN / -inf, NaN propagates:
    the same results as the NumPy reference backend."""
    g = np.array([[1.0], [np.inf], [-np.inf], [2.0], [np.inf]])
    x = np.array([[1.0], [-np.inf], [np.nan], [0.5]])
    v = np.arange(5 * 20, dtype=np.float64).reshape(5, 20)
    F = Vi(x) * Vj(g)
    for red in ("sumsoftmaxweight", "logsumexp"):
        kw = dict(weight=Vj(v + 1)) if red == "logsumexp" else {}
        args = (Vj(v),) if red == "sumsoftmaxweight" else ()
        got = getattr(F, red)(*args, dim=1, backend="cpu", **kw)
        ref = getattr(F, red)(*args, dim=1, backend="numpy", **kw)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


def test_attention_gradients_wide(rng):
    """Gradients of softmax attention with 20-dim keys and 40-wide values (the backward
    formulas read ⟨g_i, v_j - out_i⟩ and slices of g: dot products and column terms once
    simplified), first and second order, against dense torch."""
    torch = pytest.importorskip("torch")
    q = torch.randn(70, 20, dtype=torch.float64, requires_grad=True)
    k = torch.randn(90, 20, dtype=torch.float64, requires_grad=True)
    v = torch.randn(90, 40, dtype=torch.float64, requires_grad=True)
    out = (Vi(q / 4) | Vj(k)).sumsoftmaxweight(Vj(v), dim=1)
    ref = torch.softmax((q / 4) @ k.T, dim=1) @ v
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    g = torch.randn_like(out)
    grads = torch.autograd.grad((out * g).sum(), (q, k, v), create_graph=True)
    want = torch.autograd.grad((ref * g).sum(), (q, k, v), create_graph=True)
    for a, w in zip(grads, want):
        torch.testing.assert_close(a, w, rtol=1e-9, atol=1e-11)
    h = torch.autograd.grad(sum(a.square().sum() for a in grads), (q, k, v))
    hw = torch.autograd.grad(sum(a.square().sum() for a in want), (q, k, v))
    for a, w in zip(h, hw):
        torch.testing.assert_close(a, w, rtol=1e-8, atol=1e-10)
