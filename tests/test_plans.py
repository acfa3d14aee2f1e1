"""Staged calls: a repeated call (forward and backward) does no symbolic work.

The first call of a reduction prepares a plan (binding, i↔j swap, tangent and VJP
formulas, kernels); every later call with arrays of the same kinds only runs it. A
profiler counts the Python calls made into the symbolic modules (differentiation,
simplification, linearization, the CPU plan, rendering, sympy) during the second
forward+backward: there must be none. The plan cache is bounded and evicts the least
recently used plan.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lazytensor.codegen.compilers import cpu_compiler

from lazytensor import Pm, Vi, Vj
from lazytensor.engine import plans as engine

pytestmark = pytest.mark.skipif(not cpu_compiler().available, reason="no C++ compiler")

CODEGEN = Path(__file__).resolve().parents[1] / "codegen"
SYMBOLIC = [CODEGEN / f for f in ("diff.py", "simplify.py", "linearize.py", "sympy_bridge.py",
                                  "render_c.py", "parse.py")]
SYMBOLIC += list((CODEGEN / "cpu").glob("*.py"))
SYMBOLIC = {str(p) for p in SYMBOLIC}
# elementwise.py also holds the ops' references (evaluated in torch by some gradients)
ELEMENTWISE = str(CODEGEN / "elementwise.py")
ELEMENTWISE_SYMBOLIC = {"partial_derivatives", "_sympy_partials", "_sympy_derivative_exprs",
                        "_sympy_c_text", "_c_text", "emit", "_vjp_from_partials",
                        "_jvp_from_partials", "define"}


class CallCounter:
    """Counts Python calls into the symbolic modules (and sympy), and into ``watch``."""

    def __init__(self, watch: str):
        self.symbolic: list = []
        self.watched = 0
        self.watch = watch

    def __call__(self, frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if (code.co_filename in SYMBOLIC or "/sympy/" in code.co_filename
                or code.co_filename == ELEMENTWISE and code.co_name in ELEMENTWISE_SYMBOLIC):
            self.symbolic.append(f"{Path(code.co_filename).name}:{code.co_name}")
        if code.co_name == self.watch:
            self.watched += 1

    def __enter__(self):
        sys.setprofile(self)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)


def _twice(step):
    """Run ``step`` twice; the calls of the second run into the symbolic modules."""
    step()
    with CallCounter("reduction_vjp") as counter:
        step()
    assert counter.watched > 0, "the profiler did not see the backward"
    return counter.symbolic


def _leaves(rng, n, m, d, e=1, dtype=torch.float64):
    x = torch.from_numpy(rng.standard_normal((n, d))).to(dtype).requires_grad_()
    y = torch.from_numpy(rng.standard_normal((m, d))).to(dtype).requires_grad_()
    b = torch.from_numpy(rng.standard_normal((m, e))).to(dtype).requires_grad_()
    return x, y, b


@pytest.mark.parametrize("mode", ["auto", "symbolic"])
def test_second_gaussian_forward_backward_does_no_symbolic_work(mode, rng):
    x, y, b = _leaves(rng, 40, 30, 3)
    s = torch.tensor([0.7], dtype=torch.float64, requires_grad=True)

    def step():
        K = (-Vi(x).sqdist(Vj(y)) / Pm(s * s)).exp()
        (K.__matmul__(b, grad_mode=mode) ** 2).sum().backward()

    assert _twice(step) == []


@pytest.mark.parametrize("reduction", ["logsumexp", "sumsoftmaxweight", "min", "argkmin"])
def test_second_call_of_other_reductions_does_no_symbolic_work(reduction, rng):
    x, y, v = _leaves(rng, 30, 50, 3, e=20)

    def step():
        F = (Vi(x) | Vj(y)) - Vi(x).sqdist(Vj(y))
        if reduction == "logsumexp":
            out = F.logsumexp(dim=1)
        elif reduction == "sumsoftmaxweight":
            out = F.sumsoftmaxweight(Vj(v), dim=1)
        elif reduction == "min":
            out = F.min(dim=1)
        else:
            out = F.argKmin(3, dim=1).double() + F.sum(dim=1)
        out.square().sum().backward()

    assert _twice(step) == []


def test_second_wide_attention_gradient_does_no_symbolic_work(rng):
    """Softmax attention in dimension 64: the gradient plan hoists values and splits rows."""
    q, k, v = _leaves(rng, 30, 40, 64, e=64, dtype=torch.float32)

    def step():
        out = (Vi(q) | Vj(k)).sumsoftmaxweight(Vj(v), dim=1)
        (out * out).sum().backward()

    assert _twice(step) == []


def test_second_double_backward_does_no_symbolic_work(rng):
    x, y, b = _leaves(rng, 20, 25, 2)

    def step():
        a = (-Vi(x).sqdist(Vj(y))).exp() @ b
        (gx,) = torch.autograd.grad(a.square().sum(), [x], create_graph=True)
        gx.square().sum().backward()

    assert _twice(step) == []


def test_results_of_a_warm_plan_follow_the_new_data(rng):
    x, y, b = (rng.standard_normal(s) for s in ((30, 2), (40, 2), (40, 1)))
    for _ in range(3):
        x, b = x + 1, b * 2
        got = ((-Vi(x).sqdist(Vj(y))).exp() @ b)
        want = np.exp(-((x[:, None] - y[None]) ** 2).sum(-1)) @ b
        np.testing.assert_allclose(got, want, rtol=1e-10)


def test_a_plan_prepared_with_grad_is_not_used_without(rng):
    x, y, b = _leaves(rng, 20, 20, 2)
    K = (-Vi(x).sqdist(Vj(y))).exp()
    with_grad = K @ b
    with torch.no_grad():
        without = K @ b
    assert with_grad.requires_grad and not without.requires_grad
    torch.testing.assert_close(with_grad.detach(), without)


def test_the_plan_cache_is_bounded_and_evicts_the_least_recently_used(monkeypatch, rng):
    cache = engine.PlanCache(3)
    monkeypatch.setattr(engine, "_plans", cache)
    y = Vj(rng.standard_normal((5, 2)))
    xs = [Vi(rng.standard_normal((n, 2))) for n in (2, 3, 4, 5)]
    keys = []
    for x in xs[:3]:
        (x * y).sum(dim=1)
        keys.append(next(reversed(cache._plans)))
    (xs[0] * y).sum(dim=1)  # the first plan is used again: now the most recent
    (xs[3] * y).sum(dim=1)  # a fourth plan evicts the least recently used: the second
    assert len(cache) == 3
    assert keys[0] in cache._plans and keys[1] not in cache._plans and keys[2] in cache._plans
