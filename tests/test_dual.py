"""The fused (dual) forward's tangents (codegen/tangents.py, lazytensor/dual.py) and the CPU
sums that add tiles lane by lane (codegen/cpu/kernel.py), against dense float64 torch.

The tangents are rewritten before they reach the kernel (one-hot vectors pushed out,
constant factors applied after the sum, equal tangents summed once, the forward's
products reused), so each rewrite is checked numerically against the plain JVP, and the
gradients end to end against dense autograd: odd sizes, batch dimensions, vector-valued
formulas, parameters, float32 and float64, Sum and LogSumExp, and inf/NaN inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lazytensor.codegen import compilers, diff, ir, ops
from lazytensor.codegen.evaluate import evaluate
from lazytensor.codegen.tangents import basis_jvp, fused_tangents

from lazytensor import LazyTensor, Pm, Vi, Vj

needs_cxx = pytest.mark.skipif(not compilers.cpu_compiler().available, reason="no C++ compiler")

X, Y, B, P = ir.var(0, 3, "i"), ir.var(1, 3, "j"), ir.var(2, 1, "j"), ir.var(3, 1, "p")


def _a(name, *args, params=()):
    return ops.apply(name, *args, params=params)


def _formulas():
    d = _a("sub", X, Y)
    sq = _a("sum", _a("mul", d, d))
    z = _a("sum", _a("mul", X, Y))
    u = _a("sum", d)
    return {
        "gauss": _a("mul", _a("exp", _a("neg", _a("div", sq, _a("mul", P, P)))), B),
        "gate": _a("mul", _a("ifelse", _a("sub", z, ir.const(0.5)), _a("sigmoid", u), _a("tanh", u)), B),
        "vector": _a("mul", _a("mul", X, Y), _a("exp", _a("neg", sq))),  # dimension 3
        "concat": _a("concat", _a("slice", _a("mul", X, X), params=(1, 2)), _a("div", z, _a("add", sq, P))),
        "linear": _a("add", _a("mul", z, P), B),  # tangents constant along some inputs
    }


def _env(rng):
    return {0: rng.standard_normal((7, 1, 3)), 1: rng.standard_normal((1, 9, 3)),
            2: rng.standard_normal((1, 9, 1)), 3: np.array([0.8])}


@pytest.mark.parametrize("name", sorted(_formulas()))
def test_basis_derivatives_equal_the_plain_jvp(name, rng):
    F = _formulas()[name]
    env = _env(rng)
    for v in (X, Y, P):
        for c in range(v.dim):
            e = [0.0] * v.dim
            e[c] = 1.0
            plain = evaluate(diff.jvp(F, {v: ir.const(e)}), env)
            ours = evaluate(basis_jvp(F, v, c), env)
            np.testing.assert_allclose(np.broadcast_to(ours, plain.shape), plain,
                                       rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(_formulas()))
def test_fused_tangents_rebuild_every_tangent(name, rng):
    F = _formulas()[name]
    env = _env(rng)
    tangents = [basis_jvp(F, v, c) for v in (X, Y, P) for c in range(v.dim)]
    unique, uses = fused_tangents(F, tangents)
    assert len(uses) == len(tangents)
    for t, (k, scale) in zip(tangents, uses):
        want = np.broadcast_to(evaluate(t, env), (7, 9, F.dim))
        got = 0.0 if k < 0 else scale * np.broadcast_to(evaluate(unique[k], env), (7, 9, F.dim))
        np.testing.assert_allclose(np.broadcast_to(got, want.shape), want, rtol=1e-12, atol=1e-12)


def test_fused_tangents_share_the_forward_product_and_pull_constants_out():
    F = _formulas()["gauss"]
    unique, uses = fused_tangents(F, [basis_jvp(F, X, c) for c in range(3)])
    assert [scale for _, scale in uses] == [-2.0, -2.0, -2.0]
    for u in unique:  # F itself is a factor: one multiply per tangent and pair
        assert F in ir.topo_order(u)
        assert not any(n.op == "const" and n.dim > 1 for n in ir.topo_order(u))


def test_equal_tangents_are_summed_once():
    F = _formulas()["gate"]  # depends on x only through Σ x and ⟨x, y⟩'s sign
    unique, uses = fused_tangents(F, [basis_jvp(F, X, c) for c in range(3)])
    assert len(unique) == 1 and [k for k, _ in uses] == [0, 0, 0]


# ------------------------------------------------------------------ end to end


def _dense(x, y, b, s, kind):
    d = x[..., :, None, :] - y[..., None, :, :]
    sq = (d * d).sum(-1)
    if kind == "gauss":
        return (torch.exp(-sq / (s * s)) * b[..., None, :, 0]).sum(-1, keepdim=True)
    if kind == "vector":
        F = x[..., :, None, :] * y[..., None, :, :] * torch.exp(-sq)[..., None] * s
        return F.sum(-2)
    if kind == "lse":
        return torch.logsumexp(-sq / (s * s) + b[..., None, :, 0], -1, keepdim=True)
    raise AssertionError(kind)


def _ours(x, y, b, s, kind, mode):
    xi, yj, bj = (LazyTensor(x.unsqueeze(-2)), LazyTensor(y.unsqueeze(-3)),
                  LazyTensor(b.unsqueeze(-3)))
    if kind == "gauss":
        return ((-xi.sqdist(yj) / (Pm(s) * Pm(s))).exp() * bj).sum(x.dim() - 1, grad_mode=mode)
    if kind == "vector":
        return (xi * yj * (-xi.sqdist(yj)).exp() * Pm(s)).sum(x.dim() - 1, grad_mode=mode)
    if kind == "lse":
        return (-xi.sqdist(yj) / (Pm(s) * Pm(s)) + bj).logsumexp(x.dim() - 1, grad_mode=mode)
    raise AssertionError(kind)


@needs_cxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", ["gauss", "vector", "lse"])
@pytest.mark.parametrize("batch", [(), (2,)])
def test_dual_gradients_match_dense_float64(kind, dtype, batch, rng):
    torch.manual_seed(int(rng.integers(2**31)))
    N, M = 37, 2053  # odd, and over one group of lane sums
    x64 = torch.randn(*batch, N, 3, dtype=torch.float64)
    y64 = torch.randn(*batch, M, 3, dtype=torch.float64) * 0.7
    b64 = torch.randn(*batch, M, 1, dtype=torch.float64)
    s64 = torch.tensor([0.9], dtype=torch.float64)
    g = torch.randn(*batch, N, 3 if kind == "vector" else 1, dtype=torch.float64)
    leaves64 = [t.clone().requires_grad_() for t in (x64, s64)]
    want = torch.autograd.grad((_dense(leaves64[0], y64, b64, leaves64[1], kind) * g).sum(), leaves64)
    leaves = [t.to(dtype).requires_grad_() for t in (x64, s64)]
    out = _ours(leaves[0], y64.to(dtype), b64.to(dtype), leaves[1], kind, "dual")
    got = torch.autograd.grad((out * g.to(dtype)).sum(), leaves)
    tol = 1e-10 if dtype == torch.float64 else 2e-4
    for a, w in zip(got, want):
        assert a.dtype == dtype
        scale = w.abs().max().item()
        assert torch.allclose(a.double(), w, rtol=tol, atol=tol * scale), (a, w)


@needs_cxx
def test_dual_gate_with_equal_tangents_matches_dense(rng):
    torch.manual_seed(int(rng.integers(2**31)))
    x = torch.randn(31, 3, dtype=torch.float64, requires_grad=True)
    y, b = torch.randn(45, 3, dtype=torch.float64), torch.randn(45, 1, dtype=torch.float64)
    xi, yj = Vi(x), Vj(y)
    z, u = (xi * yj).sum(-1), (xi - yj).sum(-1)
    out = ((z - 0.5).ifelse(u.sigmoid(), u.tanh()) * Vj(b)).sum(1, grad_mode="dual")
    got, = torch.autograd.grad(out.square().sum(), [x])
    zd = x @ y.T
    ud = x.sum(-1, keepdim=True) - y.sum(-1)
    dense = (torch.where(zd - 0.5 >= 0, ud.sigmoid(), ud.tanh()) @ b)
    want, = torch.autograd.grad(dense.square().sum(), [x])
    assert torch.allclose(got, want, rtol=1e-10, atol=1e-10)


@needs_cxx
def test_dual_gradient_of_an_input_the_formula_ignores_is_zero():
    x = torch.randn(10, 2, dtype=torch.float64, requires_grad=True)
    p = torch.tensor([0.5], dtype=torch.float64, requires_grad=True)
    y = torch.randn(12, 2, dtype=torch.float64)
    F = (Vi(x) - Vj(y)).sum(-1).exp() + Pm(p) * 0.0
    gx, gp = torch.autograd.grad(F.sum(1, grad_mode="dual").sum(), [x, p], allow_unused=True)
    want = (x[:, None] - y[None]).sum(-1).exp().sum(1, keepdim=True).expand(10, 2)
    assert torch.allclose(gx, want, rtol=1e-12)
    assert gp is None or torch.equal(gp, torch.zeros_like(gp))


@needs_cxx
def test_dual_gradients_with_infinite_and_nan_inputs_follow_dense_torch():
    x = torch.randn(6, 3, dtype=torch.float64)
    y = torch.randn(8, 3, dtype=torch.float64)
    y[2, 0] = float("inf")
    x[4, 1] = float("nan")
    b = torch.randn(8, 1, dtype=torch.float64)
    xs = x.clone().requires_grad_()
    got, = torch.autograd.grad(((-Vi(xs).sqdist(Vj(y))).exp() * Vj(b)).sum(1, grad_mode="dual").sum(), [xs])
    xd = x.clone().requires_grad_()
    want, = torch.autograd.grad(((-((xd[:, None] - y[None]) ** 2).sum(-1)).exp() @ b).sum(), [xd])
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-300, equal_nan=True)


@needs_cxx
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sums_over_many_lane_groups_chunks_and_split_j_match_float64(dtype, rng):
    """M across groups of lane sums, staged chunks (16384 columns at F = 1) and a split j
    (one row: the columns are shared among threads)."""
    for N, M in ((1, 40001), (3, 16385), (13, 2049)):
        x = rng.standard_normal((N, 3))
        y = rng.standard_normal((M, 3))
        b = rng.standard_normal((M, 2))
        want = np.exp(-((x[:, None] - y[None]) ** 2).sum(-1)) @ b
        got = (-Vi(x.astype(dtype)).sqdist(Vj(y.astype(dtype)))).exp() @ b.astype(dtype)
        scale = np.abs(np.exp(-((x[:, None] - y[None]) ** 2).sum(-1))) @ np.abs(b)
        tol = 1e-12 if dtype == np.float64 else 2e-6
        assert np.all(np.abs(np.asarray(got) - want) <= tol * scale + 1e-30)


@needs_cxx
def test_lazytensor_dual_output_is_the_plain_forward(rng):
    """The fused forward's first output is the forward itself, bit for bit."""
    x = torch.from_numpy(rng.standard_normal((50, 3)).astype(np.float32))
    y = torch.from_numpy(rng.standard_normal((70, 3)).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal((70, 1)).astype(np.float32))
    K = lambda xx: (-LazyTensor(xx[:, None]).sqdist(LazyTensor(y[None]))).exp() * LazyTensor(b[None])  # noqa: E731
    with torch.no_grad():
        plain = K(x).sum(1)
    fused = K(x.clone().requires_grad_()).sum(1, grad_mode="dual")
    assert torch.equal(plain, fused.detach())


@pytest.mark.parametrize("E, k, want", [(1, 3, "dual"), (1, 15, "dual"), (1, 16, "grad"),
                                        (2, 7, "dual"), (2, 8, "grad"), (4, 1, "grad")])
def test_auto_picks_dual_mode_within_the_measured_crossover(E, k, want, rng):
    """``auto`` fuses while F (E components) and its k tangents fit the vector width and
    E <= 3 (lazytensor.autodiff.dual's constants); the gradient is right on either route."""
    from lazytensor.engine import plans as engine

    n = 300  # 9e4 pairs, past AUTO_MIN_PAIRS
    x = torch.tensor(0.3 * rng.standard_normal((n, k)), requires_grad=True)
    y, b = (torch.tensor(0.3 * rng.standard_normal((n, d))) for d in (k, E))
    engine.clear_plans()
    out = ((-Vi(x).sqdist(Vj(y))).exp() * Vj(b)).sum(1, grad_mode="auto")
    routes = {p.route for p in engine._plans._plans.values()}
    assert want in routes, routes
    got, = torch.autograd.grad(out.square().sum(), [x])
    xd = x.detach().requires_grad_()
    dense = torch.exp(-((xd[:, None] - y[None]) ** 2).sum(-1)) @ b
    expect, = torch.autograd.grad(dense.square().sum(), [xd])
    torch.testing.assert_close(got, expect, rtol=1e-9, atol=1e-12)


# Every input reaches F only through ops of zero derivative: no tangent is distinct, and
# the gradient is zero, as in symbolic mode (dual mode once failed indexing the empty
# tangents). The formulas: a neighbour count, signs, floors, comparisons, and an ifelse
# whose condition alone reads the inputs.
_ZERO_DERIVATIVE = {
    "step": lambda xi, yj, p: (0.5 - xi.sqdist(yj)).step(),
    "sign": lambda xi, yj, p: (xi - yj).sum(-1).sign() * p.sign(),
    "floor": lambda xi, yj, p: (xi * yj).sum(-1).floor() + (p * 3).floor(),
    "compare": lambda xi, yj, p: (xi.sqdist(yj) < p) + (xi.sqdist(yj) >= 1.0),
    "ifelse": lambda xi, yj, p: (xi.sqdist(yj) - p).ifelse(2.0, -1.0),
}


@needs_cxx
@pytest.mark.parametrize("mode", ["dual", "auto", "symbolic"])
@pytest.mark.parametrize("name", sorted(_ZERO_DERIVATIVE))
def test_gradient_through_zero_derivative_ops_only_is_zero(name, mode, rng):
    n, m = 300, 250  # 75 000 pairs: "auto" fuses from 2 ** 16
    dtype = torch.float32 if name in ("step", "ifelse") else torch.float64
    x = torch.tensor(rng.standard_normal((n, 3)), dtype=dtype, requires_grad=True)
    y = torch.tensor(rng.standard_normal((m, 3)), dtype=dtype)
    p = torch.tensor([0.7], dtype=dtype, requires_grad=True)
    F = _ZERO_DERIVATIVE[name](Vi(x), Vj(y), Pm(p))
    out = F.sum(dim=1, grad_mode=mode)
    gx, gp = torch.autograd.grad(out.square().sum(), [x, p], allow_unused=True)
    assert gx is not None and gx.shape == x.shape and torch.equal(gx, torch.zeros_like(x))
    assert gp is None or torch.equal(gp, torch.zeros_like(p))
    c = (0.5 - Vi(x).sqdist(Vj(y))).step().sum(dim=1, grad_mode=mode)  # the report's case
    c.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))
