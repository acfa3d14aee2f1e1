"""Random formulas (hypothesis) against dense float64 torch: values and gradients, at the
ops' singular points, in every grad mode.

Each example draws a scalar formula of depth <= 3 over ``u_c = x_ic - y_jc``, ``x_ic`` and
``y_jc`` (D = 2) from the ops below (each with its torch twin), one reduction over j and,
for the reductions that have one, a grad mode. Its kernels are compiled once and
evaluated on two data sets: continuous points, and points on a coarse grid with every
y_j among the x_i, so that ``u = 0`` (the singular point of abs, sign, step, relu, sqrt,
atan2's origin, powf's zero base, ...), ties between operands (maximum, minimum, clamp
edges, comparisons) and ties between reduced values occur in many pairs.

Checks: the values, and the gradients of ``Σ w_i out_i`` in x and y, against torch on
the dense ``(N, M)`` formula: close where torch's are finite, non-finite where torch's
are. Our conventions that differ from torch's by design are written into the twins:
``sqrt``'s derivative is 0 at 0 (KeOps's), written there as a "safe" sqrt. Ties between
reduced values: the gradient of a min / max goes to one index (torch's ``amin`` splits
it), so rows with a tie are left out of the gradient check; arg-reductions are checked
by the values at the indices they return. The tie rule ("the lowest index") is checked
only for formulas of arithmetic ops, whose value is the same at every position of a tile;
functions evaluated by the vector maths library can differ by an ulp between a tile's
body and its tail, which is a separate fix.

CI runs 20 examples (each compiles 1-3 kernels: 10-50 s on two busy cores);
``LAZYTENSOR_HYPOTHESIS_EXAMPLES`` runs more.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from lazytensor.codegen import compilers

from lazytensor import Vi, Vj

pytestmark = pytest.mark.skipif(not compilers.cpu_compiler().available, reason="no C++ compiler")

EXAMPLES = int(os.environ.get("LAZYTENSOR_HYPOTHESIS_EXAMPLES") or 20)
D = 2


def _safe_sqrt(a):
    """sqrt with derivative 0 at 0 (ours, KeOps's): no NaN from the unselected branch."""
    zero = a == 0
    return torch.where(zero, torch.zeros_like(a), torch.sqrt(torch.where(zero, torch.ones_like(a), a)))


# name: (LazyTensor op, torch twin, arithmetic only)
UNARY = {
    "neg": (lambda a: -a, lambda a: -a, True),
    "abs": (lambda a: a.abs(), torch.abs, True),
    "sign": (lambda a: a.sign(), torch.sign, True),
    "step": (lambda a: a.step(), lambda a: (a >= 0).to(a.dtype), True),
    "relu": (lambda a: a.relu(), torch.relu, True),
    "square": (lambda a: a.square(), torch.square, True),
    "cube": (lambda a: a ** 3, lambda a: a ** 3, True),
    "pow0": (lambda a: a ** 0 * 2.0, lambda a: a ** 0 * 2.0, True),
    "clamp": (lambda a: a.clamp(-1.0, 1.0), lambda a: a.clamp(-1.0, 1.0), True),
    "floor": (lambda a: a.floor(), torch.floor, False),
    "sqrt_abs": (lambda a: a.abs().sqrt(), lambda a: _safe_sqrt(a.abs()), False),
    "exp_neg_abs": (lambda a: (-a.abs()).exp(), lambda a: torch.exp(-a.abs()), False),
    "sin": (lambda a: a.sin(), torch.sin, False),
    "cos": (lambda a: a.cos(), torch.cos, False),
    "tanh": (lambda a: a.tanh(), torch.tanh, False),
    "atan": (lambda a: a.atan(), torch.atan, False),
    "sigmoid": (lambda a: a.sigmoid(), torch.sigmoid, False),
    "softplus": (lambda a: a.softplus(), torch.nn.functional.softplus, False),
    "log1p_abs": (lambda a: a.abs().log1p(), lambda a: torch.log1p(a.abs()), False),
    "sinxdivx": (lambda a: a.sinxdivx(), lambda a: torch.sinc(a / torch.pi), False),
    "log_abs": (lambda a: a.abs().log(), lambda a: torch.log(a.abs()), False),  # -inf at 0
    "inv": (lambda a: a.inv(), torch.reciprocal, True),  # inf at 0
    "erf": (lambda a: a.erf(), torch.erf, False),
    "expm1_neg_abs": (lambda a: (-a.abs()).expm1(), lambda a: torch.expm1(-a.abs()), False),
}
BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b, True),
    "sub": (lambda a, b: a - b, lambda a, b: a - b, True),
    "mul": (lambda a, b: a * b, lambda a, b: a * b, True),
    "div": (lambda a, b: a / (1.0 + b.square()), lambda a, b: a / (1.0 + b * b), True),
    "maximum": (lambda a, b: torch.maximum(a, b), torch.maximum, True),
    "minimum": (lambda a, b: torch.minimum(a, b), torch.minimum, True),
    "lt": (lambda a, b: (a < b) * 1.0, lambda a, b: (a < b).to(a.dtype), True),
    "atan2": (lambda a, b: a.atan2(b), torch.atan2, False),
    # a zero base with exponents >= 1: torch's 0 for log(0) * 0^b
    "powf": (lambda a, b: a.abs().powf(b.abs() + 1.0), lambda a, b: torch.pow(a.abs(), b.abs() + 1.0),
             False),
}
TERNARY = {
    "ifelse": (lambda c, a, b: c.ifelse(a, b), lambda c, a, b: torch.where(c >= 0, a, b), True),
}

# reduction: grad modes to check (() = values only)
REDUCTIONS = {
    "sum": ("symbolic", "dual", "auto"),
    "logsumexp": ("symbolic", "dual"),
    "min": ("symbolic",),
    "max": ("symbolic",),
    "argmin": (),
    "argkmin": (),
    "min_argmin": (),
}


@st.composite
def trees(draw, depth):
    """(LazyTensor builder, torch builder, arithmetic only, text) of a scalar formula."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        kind, c = draw(st.sampled_from(["u", "x", "y"])), draw(st.integers(0, D - 1))
        lazy = {"u": lambda xi, yj: xi[c] - yj[c], "x": lambda xi, yj: xi[c],
                "y": lambda xi, yj: yj[c]}[kind]
        dense = {"u": lambda x, y: x[..., c] - y[..., c],
                 "x": lambda x, y: x[..., c].expand(x.shape[0], y.shape[1]),
                 "y": lambda x, y: y[..., c].expand(x.shape[0], y.shape[1])}[kind]
        return lazy, dense, True, f"{kind}{c}"
    arity = draw(st.sampled_from([1, 1, 2, 2, 3]))
    table = {1: UNARY, 2: BINARY, 3: TERNARY}[arity]
    name = draw(st.sampled_from(sorted(table)))
    op, twin, arithmetic = table[name]
    args = [draw(trees(depth - 1)) for _ in range(arity)]
    return (lambda xi, yj: op(*(a[0](xi, yj) for a in args)),
            lambda x, y: twin(*(a[1](x, y) for a in args)),
            arithmetic and all(a[2] for a in args),
            f"{name}({', '.join(a[3] for a in args)})")


def _data(rng, grid: bool):
    n, m = 23, 17
    if grid:  # a coarse grid; every y_j is some x_i: u = 0, ties, zeros
        x = rng.integers(-2, 3, size=(n, D)).astype(np.float64) / 2
        y = x[rng.integers(0, n, size=m)]
    else:
        x, y = rng.uniform(-2, 2, (n, D)), rng.uniform(-2, 2, (m, D))
    return torch.from_numpy(x), torch.from_numpy(y)


def _close(got, want, scale, what):
    finite = torch.isfinite(want)
    assert torch.equal(~torch.isfinite(got), ~finite), (
        f"{what}: non-finite at different places\n{got}\n{want}")
    err = (got - want).abs()[finite]
    tol = 1e-9 * (scale.expand_as(want)[finite] + 1.0)
    assert (err <= tol).all(), f"{what}: max error {err.max():.3g}\n{got}\n{want}"


def _reduce(name, F, mode):
    kw = {} if mode is None else {"grad_mode": mode}
    if name == "argkmin":
        return F.argKmin(2, dim=1)
    if name == "min_argmin":
        return F.min_argmin(dim=1)[1]
    return getattr(F, name)(dim=1, **kw)


def _check_values(name, out, dense, exact: bool):
    """Our reduction ``out`` of the dense (N, M) values against torch's (the values at the
    indices of an arg-reduction: ``exact`` when every position computes the same value)."""
    scale = dense.abs().nan_to_num(0, 0, 0).sum(1, keepdim=True)
    if name == "sum":
        _close(out, dense.sum(1, keepdim=True), scale, "sum")
    elif name == "logsumexp":
        _close(out, torch.logsumexp(dense, 1, keepdim=True), scale, "logsumexp")
    elif name in ("min", "max"):
        want = dense.amin(1, keepdim=True) if name == "min" else dense.amax(1, keepdim=True)
        _close(out, want, scale, name)
    else:  # indices: the values there are the smallest ones, in order
        k = out.shape[1]
        picked = torch.gather(dense, 1, out)
        # NaN sorted as +inf (nan_to_num would also turn +inf into the largest float)
        ordered = torch.sort(torch.where(dense.isnan(), float("inf"), dense), 1).values[:, :k]
        rows = ~dense.isnan().any(1)  # NaN orders last (np.sort): compared by value elsewhere
        if exact:
            assert torch.equal(picked[rows], ordered[rows]), f"{name}: not the smallest values"
        else:  # an ulp apart between positions (see the module docstring)
            torch.testing.assert_close(picked[rows], ordered[rows], rtol=1e-12, atol=1e-14)


def _tie_rows(name, dense):
    """Rows whose min (or max) is attained more than once: gradients there differ by rule."""
    if name not in ("min", "max"):
        return torch.zeros(dense.shape[0], dtype=torch.bool)
    best = dense.amin(1, keepdim=True) if name == "min" else dense.amax(1, keepdim=True)
    return (dense == best).sum(1) > 1


def _grads(loss, inputs):
    """d loss / d inputs (None where it does not depend on them)."""
    if not loss.requires_grad:  # the formula is constant (u0 < u0, step(u) * 0 ...)
        return [None] * len(inputs)
    return torch.autograd.grad(loss, inputs, allow_unused=True)


@given(tree=trees(3), reduction=st.sampled_from(sorted(REDUCTIONS)), data=st.data())
@settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_random_formulas_against_dense_torch(tree, reduction, data):
    lazy, dense_of, arithmetic, text = tree
    modes = REDUCTIONS[reduction]
    mode = data.draw(st.sampled_from(modes)) if modes else None
    seed = data.draw(st.integers(0, 2 ** 31))
    note(f"{reduction} of {text}, grad mode {mode}, seed {seed}")
    rng = np.random.default_rng(seed)
    w = torch.from_numpy(rng.standard_normal((23, 1)))
    for grid in (False, True):
        x, y = _data(rng, grid)
        xs, ys = x.clone().requires_grad_(mode is not None), y.clone().requires_grad_(mode is not None)
        # times ones indexed by i and j: every formula has N rows and M columns
        ones_i, ones_j = Vi(torch.ones(len(x), 1, dtype=x.dtype)), Vj(torch.ones(len(y), 1, dtype=x.dtype))
        out = _reduce(reduction, lazy(Vi(xs), Vj(ys)) * ones_i * ones_j, mode)
        xd, yd = x.clone().requires_grad_(), y.clone().requires_grad_()
        dense = dense_of(xd[:, None], yd[None])  # (N, M)
        _check_values(reduction, out.detach(), dense.detach(), arithmetic)
        if grid and arithmetic and reduction in ("argmin", "argkmin", "min_argmin"):
            # the tie rule, where every position computes the same value: the lowest index
            want = torch.sort(dense.detach(), dim=1, stable=True).indices[:, :out.shape[1]]
            rows = ~dense.detach().isnan().any(1)
            assert torch.equal(out[rows], want[rows]), f"ties: {out} {want}"
        if mode is None:
            continue
        keep = ~_tie_rows(reduction, dense.detach())  # rows left out, not weighted by 0 (0 * inf)
        got = _grads((out[keep] * w[keep]).sum(), [xs, ys])
        if reduction == "sum":
            reduced = dense.sum(1, keepdim=True)
        elif reduction == "logsumexp":
            reduced = torch.logsumexp(dense, 1, keepdim=True)
        else:  # the formula at the pair chosen (no tie in the rows kept): no 0 * inf from
            # the other pairs' infinite partials, which dense autograd would multiply by 0
            best = (dense.argmin if reduction == "min" else dense.argmax)(1).detach()
            reduced = dense_of(xd[:, None], yd[best][:, None])
        want = _grads((reduced[keep] * w[keep]).sum(), [xd, yd])
        for g, wt, v, name in zip(got, want, (x, y), "xy"):
            g = torch.zeros_like(v) if g is None else g
            wt = torch.zeros_like(v) if wt is None else wt
            _close(g, wt, wt.abs().nan_to_num(0, 0, 0).sum() / wt.numel() * 50, f"gradient in {name}")
