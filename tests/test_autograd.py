"""Autodiff: gradcheck / gradgradcheck of every differentiable reduction and every op,
symbolic vs dual (mixed) mode, float32 against dense torch, and linear memory."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from lazytensor.codegen import ops
from lazytensor.codegen.elementwise import ELEMENTWISE

from lazytensor import LazyTensor


@pytest.fixture(autouse=True)
def _float64_default():
    """gradcheck wants float64; restore the default so other test modules are unaffected."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _seed(rng):
    torch.manual_seed(int(rng.integers(2**31)))


def _lt(x, cat):
    return LazyTensor(x[:, None, :] if cat == "i" else x[None, :, :])


# ------------------------------------------------------------------ every reduction


def _gauss(x, y, p):
    xi, yj = _lt(x, "i"), _lt(y, "j")
    return (-xi.sqdist(yj) * LazyTensor(p)).exp()


REDUCTIONS = {
    "sum": lambda x, y, p, b: (_gauss(x, y, p) * _lt(b, "j")).sum(1),
    "sum_i": lambda x, y, p, b: (_gauss(x, y, p) * _lt(b, "j")).sum(0),
    "min": lambda x, y, p, b: (_lt(x, "i").sqdist(_lt(y, "j")) * LazyTensor(p)).min(1),
    "max_i": lambda x, y, p, b: (_lt(x, "i") * _lt(y, "j") * LazyTensor(p)).max(0),
    "min_argmin": lambda x, y, p, b: (_lt(x, "i").sqdist(_lt(y, "j")) * LazyTensor(p)).min_argmin(1)[0],
    "kmin": lambda x, y, p, b: (_lt(x, "i").sqdist(_lt(y, "j")) * LazyTensor(p)).Kmin(3, 1),
    "kmin_vec": lambda x, y, p, b: ((_lt(x, "i") - _lt(y, "j")) ** 2 * LazyTensor(p)).Kmin(2, 1),
    "logsumexp": lambda x, y, p, b: (-_lt(x, "i").sqdist(_lt(y, "j")) * LazyTensor(p)).logsumexp(1),
    "logsumexp_w": lambda x, y, p, b: (-_lt(x, "i").sqdist(_lt(y, "j")) * LazyTensor(p)).logsumexp(
        1, weight=_lt(b.exp(), "j")),
    "softmax": lambda x, y, p, b: (-_lt(x, "i").sqdist(_lt(y, "j")) * LazyTensor(p)).sumsoftmaxweight(
        _lt(b, "j"), dim=1),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_gradcheck_reductions(name, rng):
    _seed(rng)
    x = torch.randn(5, 2, requires_grad=True)
    y = torch.randn(6, 2, requires_grad=True)
    p = (torch.rand(1) + 0.5).requires_grad_()
    b = torch.randn(6, 2, requires_grad=True)
    f = REDUCTIONS[name]
    assert torch.autograd.gradcheck(f, (x, y, p, b), atol=1e-7, rtol=1e-5)
    if not name.startswith(("min", "max", "kmin")):  # piecewise: 2nd order is 0 a.e.
        assert torch.autograd.gradgradcheck(f, (x, y, p, b), atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("mode", ["symbolic", "dual"])
def test_gradcheck_batched(mode, rng):
    """Batch dims, broadcast on each side, parameters with their own batch dims."""
    _seed(rng)
    x = torch.randn(2, 1, 4, 1, 3, requires_grad=True)
    y = torch.randn(1, 3, 1, 5, 3, requires_grad=True)
    p = (torch.rand(2, 3, 1, 1, 1) + 0.5).requires_grad_()
    b = torch.randn(1, 1, 1, 5, 2)

    def f(x, y, p):
        K = (-LazyTensor(x).sqdist(LazyTensor(y)) * LazyTensor(p)).exp()
        return (K * LazyTensor(b)).sum(dim=3, grad_mode=mode)

    assert torch.autograd.gradcheck(f, (x, y, p), atol=1e-7, rtol=1e-5)
    dense = ((-((x - y) ** 2).sum(-1, keepdim=True) * p).exp() * b).sum(3)
    assert torch.allclose(f(x, y, p), dense, atol=1e-12)


# ------------------------------------------------------------------ every op

# Per op: how to build its operands from u (i-side) and v (j-side) formulas with values
# in the op's domain and away from its kinks. Every registered differentiable op must be
# listed: a new op cannot go untested.
def _pos(t):
    return t.square() + 0.5


OP_CASES = {
    "add": lambda u, v: u + v, "sub": lambda u, v: u - v, "mul": lambda u, v: u * v,
    "div": lambda u, v: u / _pos(v), "neg": lambda u, v: -(u * v),
    "pow": lambda u, v: _pos(u - v) ** 1.7, "exp": lambda u, v: (u - v).exp(),
    "log": lambda u, v: _pos(u - v).log(), "sqrt": lambda u, v: _pos(u * v).sqrt(),
    "sin": lambda u, v: (u * v).sin(), "cos": lambda u, v: (u - v).cos(),
    "tan": lambda u, v: ((u - v) * 0.3).tan(), "sinh": lambda u, v: (u - v).sinh(),
    "cosh": lambda u, v: (u - v).cosh(), "tanh": lambda u, v: (u * v).tanh(),
    "asin": lambda u, v: ((u * v).tanh() * 0.9).asin(), "acos": lambda u, v: ((u - v).tanh() * 0.9).acos(),
    "atan": lambda u, v: (u * v).atan(), "asinh": lambda u, v: (u - v).asinh(),
    "acosh": lambda u, v: (_pos(u - v) + 1).acosh(), "atanh": lambda u, v: ((u * v).tanh() * 0.9).atanh(),
    "erf": lambda u, v: (u - v).erf(), "erfc": lambda u, v: (u * v).erfc(),
    "atan2": lambda u, v: u.atan2(_pos(v)), "log1p": lambda u, v: _pos(u - v).log1p(),
    "expm1": lambda u, v: (u * v).expm1(), "square": lambda u, v: (u - v).square(),
    "inv": lambda u, v: _pos(u + v).inv(), "rsqrt": lambda u, v: _pos(u * v).rsqrt(),
    "sigmoid": lambda u, v: (u * v).sigmoid(), "softplus": lambda u, v: (u - v).softplus(),
    "logsigmoid": lambda u, v: (u * v).logsigmoid(), "xlogx": lambda u, v: _pos(u - v).xlogx(),
    "sinxdivx": lambda u, v: (_pos(u * v) + 0.1).sinxdivx(),
    "softmax_weight": lambda u, v: (u * v)._op("softmax_weight", u + v, params=(True,)), "abs": lambda u, v: (u - v).abs(),
    "relu": lambda u, v: (u - v).relu(), "ifelse": lambda u, v: (u - v).ifelse(u * v, (u + v).exp()),
    "min2": lambda u, v: u._op("min2", v * 2), "max2": lambda u, v: u._op("max2", v * 2),
    "clamp": lambda u, v: (u * v).clamp(-0.3, 0.4),
    "sum": lambda u, v: (u * v).sum(-1), "expand": lambda u, v: (u * v).sum(-1) * u,
    "vmin": lambda u, v: (u * v).min(-1), "vmax": lambda u, v: (u - v).max(-1),
    "slice": lambda u, v: (u * v)[1:3], "pad": lambda u, v: (u * v)[0] + u,
    "concat": lambda u, v: u.concat(v * u), "matvec": lambda u, v: u.concat(v).matvecmult(v)[0:2],
    "vecmat": lambda u, v: u.vecmatmult(v.concat(u)), "tensorprod": lambda u, v: u.tensorprod(v),
    "matmul": lambda u, v: u.tensorprod(v)._op("matmul", v.tensorprod(u), params=(3,)),
    "powf": lambda u, v: _pos(u - v).powf(u * v) + (-_pos(u * v)).powf(3.0),
    "gather": lambda u, v: (u * v)._op("gather", params=((2, 0, 0, 1),)),
    "scatter": lambda u, v: (u - v)._op("scatter", params=((3, 0, 3), 5)),
}


def _differentiable_ops():
    return sorted(n for n, d in ops.REGISTRY.items() if d.differentiable and not d.user)


def test_every_differentiable_op_has_a_gradient_case():
    missing = set(_differentiable_ops()) - set(OP_CASES)
    assert not missing, f"add gradient cases for {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(OP_CASES))
def test_gradcheck_op(name, rng):
    _seed(rng)
    x = (torch.randn(3, 3) * 0.8).requires_grad_()
    y = (torch.randn(4, 3) * 0.8).requires_grad_()

    def f(x, y):
        formula = OP_CASES[name](_lt(x, "i"), _lt(y, "j"))
        # random projection of a vector-valued formula, so every component matters
        w = torch.linspace(0.5, 1.5, formula.formula.dim)
        return (formula * LazyTensor(w)).sum(-1).sum(1, grad_mode="symbolic")

    assert torch.autograd.gradcheck(f, (x, y), atol=1e-6, rtol=1e-4)


def test_elementwise_partials_exist_for_sympy_ops():
    """Every sympy-defined elementwise op can be differentiated (no untranslatable result)."""
    from lazytensor.codegen import ir
    from lazytensor.codegen.elementwise import partial_derivatives

    for name, opdef in ELEMENTWISE.items():
        if not ops.get(name).differentiable:
            continue
        args = [ir.var(k, 2, "i") for k in range(opdef.arity)]
        params = {"pow": (1.5,), "softmax_weight": (True,)}.get(name, ())
        node = ops.apply(name, *args, params=params)
        parts = partial_derivatives(node)
        assert len(parts) == opdef.arity


# ------------------------------------------------------------------ modes, float32, memory


@pytest.mark.parametrize("reduction", ["sum", "logsumexp"])
def test_dual_equals_symbolic_and_torch(reduction, rng):
    _seed(rng)
    x = torch.randn(40, 2, requires_grad=True)
    y = torch.randn(30, 2, requires_grad=True)
    p = torch.tensor([0.7], requires_grad=True)

    def ours(mode):
        xi, yj = _lt(x, "i"), _lt(y, "j")
        z = (xi - yj).sum(-1)
        F = (z - 0.2).ifelse(z.sigmoid(), (z * LazyTensor(p)).tanh()) * (xi | yj).relu() \
            - xi.sqdist(yj).clamp(0.1, 2.0) * LazyTensor(p)
        out = F.sum(1, grad_mode=mode) if reduction == "sum" else F.logsumexp(1, grad_mode=mode)
        return torch.autograd.grad(out.sum(), [x, y, p])

    def dense():
        z = (x[:, None] - y[None]).sum(-1)
        F = torch.where(z - 0.2 >= 0, z.sigmoid(), (z * p).tanh()) * torch.relu((x[:, None] * y[None]).sum(-1)) \
            - ((x[:, None] - y[None]) ** 2).sum(-1).clamp(0.1, 2.0) * p
        out = F.sum(1) if reduction == "sum" else torch.logsumexp(F, 1)
        return torch.autograd.grad(out.sum(), [x, y, p])

    for a, b, c in zip(ours("symbolic"), ours("dual"), dense()):
        assert torch.allclose(a, c, atol=1e-11)
        assert torch.allclose(b, c, atol=1e-11)


def test_dual_second_order_falls_back_to_symbolic(rng):
    _seed(rng)
    x = torch.randn(10, 2, requires_grad=True)
    y = torch.randn(12, 2)

    def f(x):
        return (-_lt(x, "i").sqdist(_lt(y, "j"))).exp().sum(1, grad_mode="dual")

    assert torch.autograd.gradgradcheck(f, (x,), atol=1e-6, rtol=1e-4)


def test_float32_gradients_match_dense_torch(rng):
    _seed(rng)
    x = torch.rand(300, 3, dtype=torch.float32, requires_grad=True)
    y = torch.rand(400, 3, dtype=torch.float32, requires_grad=True)
    b = torch.randn(400, 2, dtype=torch.float32)
    s = torch.tensor([0.3], dtype=torch.float32, requires_grad=True)
    K = (-_lt(x, "i").sqdist(_lt(y, "j")) / LazyTensor(s)).exp()
    ours = torch.autograd.grad((K @ b).square().sum(), [x, y, s])
    Kd = (-((x[:, None] - y[None]) ** 2).sum(-1) / s).exp()
    dense = torch.autograd.grad((Kd @ b).square().sum(), [x, y, s])
    for a, d in zip(ours, dense):
        assert torch.allclose(a, d, rtol=1e-4, atol=1e-4 * d.abs().max().item())


def test_symbolic_grad_method(rng):
    """pykeops-style ``.grad(v, g)``: a LazyTensor that can be reduced."""
    _seed(rng)
    x = torch.randn(20, 3)
    y = torch.randn(25, 3)
    g = torch.randn(20, 1)
    xi = _lt(x, "i")
    K = (-xi.sqdist(_lt(y, "j"))).exp()
    ours = K.grad(xi, g).sum(1)
    xr = x.clone().requires_grad_()
    Kd = (-((xr[:, None] - y[None]) ** 2).sum(-1)).exp().sum(1, keepdim=True)
    (dense,) = torch.autograd.grad(Kd, xr, g)
    assert torch.allclose(ours, dense, atol=1e-12)


def test_backward_memory_is_linear():
    """N = M = 50,000 in float32: forward + backward (w.r.t. y, a reduction over i) in a
    process whose peak RSS growth (about 40 MB whatever N: the kernels, torch's autograd)
    stays below 200 MB, where one N x M float buffer would take 10 GB and even one
    N x 1024 block of it 200 MB."""
    code = textwrap.dedent("""
        import resource, torch
        from lazytensor import LazyTensor
        torch.manual_seed(0)
        N = 50_000
        x = torch.rand(N, 3); y = torch.rand(N, 3, requires_grad=True); b = torch.rand(N, 1)
        K = (-LazyTensor(x[:, None]).sqdist(LazyTensor(y[None])) * 50.0).exp()
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = K @ b
        (gy,) = torch.autograd.grad(out.sum(), [y])
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert torch.isfinite(gy).all() and gy.abs().sum() > 0
        print((peak - base) * 1024)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    grown = int(proc.stdout.strip().splitlines()[-1])
    assert grown < 200e6, f"peak RSS grew by {grown / 1e6:.0f} MB"


def test_no_grad_needed_gives_plain_outputs(rng):
    _seed(rng)
    x = torch.randn(5, 2)
    y = torch.randn(6, 2, requires_grad=True)
    with torch.no_grad():
        out = _lt(x, "i").sqdist(_lt(y, "j")).sum(1)
    assert not out.requires_grad
    out = _lt(x, "i").sqdist(_lt(y, "j")).argmin(1)
    assert out.dtype == torch.int64 and not out.requires_grad
    np.testing.assert_array_equal(out[:, 0].numpy(), ((x[:, None] - y[None].detach()) ** 2).sum(-1).argmin(1).numpy())


GATHERED = {  # name: (LazyTensor reduction, dense torch reduction of the (N, M) matrix)
    "min": (lambda d: d.min(1), lambda D: D.min(1, keepdim=True).values),
    "max_i": (lambda d: d.max(0), lambda D: D.max(0).values[:, None]),
    "kmin": (lambda d: d.Kmin(3, 1), lambda D: D.topk(3, dim=1, largest=False).values),
}


@pytest.mark.parametrize("name", sorted(GATHERED))
def test_gathered_gradients_differentiate_again_as_dense_torch(name, rng):
    """Min, max and K-min gradients go through the selected pairs; in a backward that
    builds a graph they are differentiable again. First and second derivatives (a
    Hessian-vector product) against dense torch, also with one tensor as both variables."""
    _seed(rng)
    lazy, dense = GATHERED[name]
    x, y = torch.randn(7, 3, requires_grad=True), torch.randn(9, 3, requires_grad=True)
    for a, b in ((x, y), (x, x)):
        leaves = [x, y] if b is y else [x]
        got = lazy(_lt(a, "i").sqdist(_lt(b, "j") * 2.0))
        want = dense(((a[:, None] - 2.0 * b[None]) ** 2).sum(-1))
        w = torch.randn(want.shape)
        g_got = torch.autograd.grad((got * w).sum(), leaves, create_graph=True)
        g_want = torch.autograd.grad((want * w).sum(), leaves, create_graph=True)
        v = [torch.randn(t.shape) for t in leaves]
        h_got = torch.autograd.grad(sum((g * u).sum() for g, u in zip(g_got, v)), leaves)
        h_want = torch.autograd.grad(sum((g * u).sum() for g, u in zip(g_want, v)), leaves)
        for got_t, want_t in zip([*g_got, *h_got], [*g_want, *h_want]):
            torch.testing.assert_close(got_t, want_t, rtol=1e-10, atol=1e-12)
