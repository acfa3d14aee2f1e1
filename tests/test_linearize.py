"""codegen.linearize: the weighted-sum form of wide formulas equals the formula (with the
CPU backend's tuning, as its kernels plan them)."""

from __future__ import annotations

import numpy as np
import pytest
from lazytensor.codegen import diff, ir, ops
from lazytensor.codegen.cpu import TUNING
from lazytensor.codegen.evaluate import evaluate
from lazytensor.codegen.linearize import linearize


def _a(name, *args, params=()):
    return ops.apply(name, *args, params=params)


def _gauss(x, y, s=None):
    d2 = _a("sum", _a("square", _a("sub", x, y)))
    if s is not None:
        d2 = _a("div", d2, s)
    return _a("exp", _a("neg", d2))


def _recombine(lin, arrays, N, M):
    """Σ_t coef s_t L_t placed at the offsets, plus the direct components, as an (N, M, E) array."""
    S = evaluate(lin.narrow, arrays)
    S = np.broadcast_to(S, (N, M, lin.narrow.dim))
    out = np.zeros((N, M, lin.dim))
    for t in lin.row_terms + lin.col_terms:
        L = np.broadcast_to(evaluate(t.factor, arrays), (N, M, t.dim)) if t.factor.op != "const" \
            else np.broadcast_to(np.asarray(t.factor.params), (N, M, t.dim))
        out[..., t.offset:t.offset + t.dim] += t.coef * S[..., t.weight:t.weight + 1] * L
    for comp, off in lin.direct:
        out[..., off] += S[..., comp]
    return out


def _check(formula, variables, rng, expect_cols=None):
    N, M = 5, 7
    arrays = {}
    for v in variables:
        shape = {"i": (N, 1, v.dim), "j": (1, M, v.dim), "p": (v.dim,)}[v.cat]
        arrays[v.index] = rng.standard_normal(shape) * 0.5 + (1.5 if v.cat == "p" else 0)
    lin = linearize(formula, TUNING)
    assert lin is not None
    want = np.broadcast_to(evaluate(formula, arrays), (N, M, formula.dim))
    np.testing.assert_allclose(_recombine(lin, arrays, N, M), want, rtol=1e-12, atol=1e-12)
    assert lin.narrow.dim < formula.dim
    if expect_cols is not None:
        assert len(lin.col_terms) == expect_cols
    return lin


def test_kernel_times_wide_vector(rng):
    x, y, v = ir.var(0, 3, "i"), ir.var(1, 3, "j"), ir.var(2, 64, "j")
    lin = _check(_a("mul", _gauss(x, y), v), [x, y, v], rng, expect_cols=1)
    assert lin.narrow.dim == 1
    lin = _check(_a("mul", v, _a("expand", _gauss(x, y), params=(64,))), [x, y, v], rng, 1)
    assert lin.narrow.dim == 1


@pytest.mark.parametrize("D", [20, 64])
def test_gaussian_gradients_both_sides(D, rng):
    x, y, b, s = ir.var(0, D, "i"), ir.var(1, D, "j"), ir.var(2, 1, "j"), ir.var(3, 1, "p")
    g = ir.var(4, 1, "i")
    F = _a("mul", _gauss(x, y, s), b)
    cot = diff.vjp(F, [x, y, s, b], g)
    i_side = _a("concat", cot[x], cot[s])
    lin = _check(i_side, [x, y, b, s, g], rng, expect_cols=1)
    assert lin.narrow.dim <= 3 and len(lin.row_terms) == 1
    j_side = _a("concat", cot[y], cot[b])
    _check(ir.swap_ij(j_side), [ir.var(0, D, "j"), ir.var(1, D, "i"), ir.var(2, 1, "i"), s,
                                ir.var(4, 1, "j")], rng, expect_cols=1)


def test_combinations_and_constants(rng):
    x, y, w = ir.var(0, 20, "i"), ir.var(1, 20, "j"), ir.var(2, 20, "j")
    k = _gauss(x, y)
    F = _a("sub", _a("mul", k, _a("add", _a("sub", x, y), _a("neg", w))), _a("div", y, _a("sum", y)))
    _check(F, [x, y, w], rng, expect_cols=2)  # y's two weights are summed into one
    _check(_a("add", _a("mul", ir.const(2.0), y), _a("expand", k, params=(20,))), [x, y], rng, 1)
    _check(_a("concat", _a("mul", k, y), _a("sum", x)), [x, y], rng, 1)


def test_not_linear_or_not_worth_it():
    x, y = ir.var(0, 32, "i"), ir.var(1, 32, "j")
    assert linearize(_a("mul", x, y), TUNING) is None  # elementwise product of i and j vectors
    assert linearize(_a("exp", y), TUNING) is None
    assert linearize(_a("mul", _gauss(x, y), x), TUNING) is None  # no j-variable factor: nothing to gain
    small = ir.var(2, 8, "j")
    assert linearize(_a("mul", _gauss(x, y), small), TUNING) is None  # narrow already
    many = _a("mul", _gauss(x, y), y)
    for k in range(16):  # 1 weight + 16 scalars: more than the pair loop should carry
        many = _a("concat", many, _a("sin", _a("mul", ir.const(float(k + 1)), _a("sum", y))))
    assert linearize(many, TUNING) is None
    assert linearize(many, TUNING, max_narrow=17) is not None
