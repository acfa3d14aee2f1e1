"""Every registered op, generated from the registry: CPU kernels against the reference.

Each op has an entry in ``CASES``: a formula using it on an i-variable ``x`` and a
j-variable ``y``, and the domains its inputs are drawn from (valid inputs; branchy and
discontinuous ops on grids of dyadic numbers, so that sums such as ``x + y`` are exact in
float32 too and every threshold is hit exactly and from both sides).
``test_every_registered_op_has_a_case`` fails when an op is registered without a case.

To keep compilation cheap, all the op formulas are concatenated into one vector formula
(one kernel per dtype and reduction axis); each op is then checked on its own components.
If that combined kernel fails to build, each op is compiled alone so the culprit shows.

The reference itself is checked against independent dense torch computations
(``test_reference_against_torch``), and every op's VJP and JVP against finite differences.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np
import pytest
from lazytensor.codegen import diff, ir, ops
from lazytensor.codegen.compilers import CompileError, cpu_compiler
from lazytensor.codegen.elementwise import ELEMENTWISE
from lazytensor.codegen.evaluate import evaluate

from lazytensor.core.binding import Variable
from lazytensor.engine import plans as engine

A = ops.apply
C = ir.const

# ------------------------------------------------------------------ input domains


@dataclass(frozen=True)
class Dom:
    """Uniform on [lo, hi] (or ±[lo, hi] if ``away``), or a grid of step ``grid``; plus specials."""

    lo: float
    hi: float
    specials: tuple = ()
    grid: float = 0.0
    away: bool = False

    def sample(self, rng, shape, continuous=False):
        if self.grid and not continuous:
            n = round((self.hi - self.lo) / self.grid)
            a = self.lo + self.grid * rng.integers(0, n + 1, size=shape)
        else:
            a = rng.uniform(self.lo, self.hi, size=shape)
        if self.away:
            a = a * rng.choice([-1.0, 1.0], size=shape)
        flat = a.reshape(-1, shape[-1])
        for r, s in enumerate(self.specials):
            flat[r % flat.shape[0], :] = s
        return flat.reshape(shape)


def U(lo, hi, *specials):
    return Dom(lo, hi, specials)


def G(lo, hi, step=0.25):
    """A grid: sums and differences of two samples are exact in float32."""
    return Dom(lo, hi, grid=step)


def Away(lo, hi):
    return Dom(lo, hi, away=True)


@dataclass(frozen=True)
class Case:
    build: object  # (x, y) -> IR node
    x: Dom
    y: Dom
    dx: int = 2
    dy: int = 1
    rtol32: float = 1e-5


def unary(name, lo, hi, *specials, rtol32=1e-5):
    """``name(x_i + y_j)`` with ``x_i + y_j`` in [lo, hi]."""
    d = U(lo / 2, hi / 2, *[s / 2 for s in specials])
    return Case(lambda x, y: A(name, A("add", x, y)), d, d, rtol32=rtol32)


def exact_unary(name, lo=-3.0, hi=3.0, step=0.25):
    """``name(x_i + y_j)`` on a grid: the sum is exact, integer and half thresholds are hit."""
    return Case(lambda x, y: A(name, A("add", x, y)), G(lo, hi, step), G(lo, hi, step))


def exact_binary(name):
    return Case(lambda x, y: A(name, x, y), G(-2, 2), G(-2, 2))


def branch(name):
    """``name(x_i - y_j)``: exact sign (zero exactly when x == y, which the grid makes common)."""
    return Case(lambda x, y: A(name, A("sub", x, y)), G(-2, 2), G(-2, 2))


POW_EXPONENTS = (0.0, 1.0, 2.0, 3.0, 5.0, -1.0, -2.0, -3.0, 0.5, -0.5, 1.5, -1.5, 1.7, -2.3)


def _build_pow(x, y):
    a = A("add", x, y)  # in (0.2, 3)
    parts = [A("pow", a, params=(p,)) for p in POW_EXPONENTS]
    parts += [A("pow", A("neg", a), params=(p,)) for p in (2.0, 3.0, -1.0, -2.0)]
    return _concat(parts)


# fmt: off
CASES: dict[str, Case] = {
    # arithmetic
    "add": Case(lambda x, y: A("add", x, y), U(-2, 2), U(-2, 2)),
    "sub": Case(lambda x, y: A("sub", x, y), U(-2, 2), U(-2, 2), dx=1, dy=2),
    "mul": Case(lambda x, y: A("mul", x, y), U(-2, 2), U(-2, 2)),
    "div": Case(lambda x, y: A("div", x, y), U(-2, 2), Away(0.5, 2)),
    "neg": Case(lambda x, y: A("neg", A("mul", x, y)), U(-2, 2), U(-2, 2)),
    "pow": Case(_build_pow, U(0.1, 1.5), U(0.1, 1.5), rtol32=2e-5),
    "square": unary("square", -3, 3),
    "inv": Case(lambda x, y: A("inv", A("mul", x, y)), Away(0.5, 2), Away(0.5, 2)),
    "rsqrt": unary("rsqrt", 0, 6, 0.0),
    "powf": Case(lambda x, y: _concat([A("powf", A("add", x, C(0.25)), y),
                                       A("powf", A("sub", C(-0.25), x), A("round", A("mul", y, C(4.0))))]),
                 U(0.1, 1.5), U(-1.5, 1.5)),
    # branches, comparisons, rounding
    "ifelse": Case(lambda x, y: A("ifelse", A("sub", x, y), A("mul", x, y), A("add", x, y)),
                   G(-2, 2), G(-2, 2)),
    "step": branch("step"),
    "sign": branch("sign"),
    "relu": branch("relu"),
    "abs": branch("abs"),
    "min2": exact_binary("min2"),
    "max2": Case(lambda x, y: A("max2", x, y), G(-2, 2), G(-2, 2), dx=1, dy=2),
    "clamp": Case(lambda x, y: _concat([A("clamp", x, y, A("add", y, C(0.5))),
                                        A("clamp", A("mul", x, y), C(-0.375), C(0.5))]),
                  G(-2, 2, 0.125), G(-2, 2, 0.125)),
    "floor": exact_unary("floor"),
    "ceil": exact_unary("ceil"),
    "round": exact_unary("round"),
    **{name: exact_binary(name) for name in ("eq", "ne", "lt", "gt", "le", "ge")},
    # transcendental
    "exp": unary("exp", -4, 4),
    "log": unary("log", 0.1, 6),
    "sqrt": unary("sqrt", 0, 6, 0.0),
    "sin": unary("sin", -6, 6),
    "cos": unary("cos", -6, 6),
    "tan": unary("tan", -1.3, 1.3),
    "sinh": unary("sinh", -4, 4),
    "cosh": unary("cosh", -4, 4),
    "tanh": unary("tanh", -4, 4),
    "asin": unary("asin", -0.95, 0.95),
    "acos": unary("acos", -0.95, 0.95),
    "atan": unary("atan", -5, 5),
    "asinh": unary("asinh", -5, 5),
    "acosh": unary("acosh", 1.1, 6),
    "atanh": unary("atanh", -0.9, 0.9),
    "erf": unary("erf", -3, 3),
    "erfc": unary("erfc", -2, 4),
    "log1p": unary("log1p", -0.8, 5),
    "expm1": unary("expm1", -3, 3),
    "atan2": Case(lambda x, y: A("atan2", x, y), U(-2, 2, 0.0), U(-2, 2, 0.0)),
    "sigmoid": unary("sigmoid", -10, 10),
    "softplus": unary("softplus", -30, 30),
    "logsigmoid": unary("logsigmoid", -30, 30),
    "xlogx": unary("xlogx", 0, 4, 0.0),
    "sinxdivx": unary("sinxdivx", -8, 8, 0.0),
    # exp(x - y), f = x rounded first; with the limit 1 at x = y = +inf (not hit here)
    "softmax_weight": Case(lambda x, y: A("softmax_weight", x, y, params=(True,)), U(-4, 2),
                           U(-2, 2), dx=1, dy=1),
    # vector structure
    "sum": Case(lambda x, y: A("sum", A("mul", x, y)), U(-2, 2), U(-2, 2), dx=3, dy=3),
    "expand": Case(lambda x, y: A("expand", A("mul", x, y), params=(3,)), U(-2, 2), U(-2, 2),
                   dx=1, dy=1),
    **{name: Case(lambda x, y, _n=name: A(_n, A("sub", x, y)), G(-1, 1), G(-1, 1), dx=4, dy=4)
       for name in ("vmin", "vmax", "vargmin", "vargmax")},
    "slice": Case(lambda x, y: A("slice", A("mul", x, y), params=(1, 2)), U(-2, 2), U(-2, 2),
                  dx=4, dy=1),
    "pad": Case(lambda x, y: A("pad", A("mul", x, y), params=(1, 5)), U(-2, 2), U(-2, 2)),
    "concat": Case(lambda x, y: A("concat", A("exp", x), A("mul", x, y)), U(-2, 2), U(-2, 2)),
    "one_hot": Case(lambda x, y: A("one_hot", A("add", x, y), params=(5,)),
                    G(-1.5, 3.5, 0.5), G(-1.5, 3.5, 0.5), dx=1, dy=1),
    "matvec": Case(lambda x, y: A("matvec", x, y), U(-2, 2), U(-2, 2), dx=6, dy=3),
    "vecmat": Case(lambda x, y: A("vecmat", x, y), U(-2, 2), U(-2, 2), dx=2, dy=6),
    "tensorprod": Case(lambda x, y: A("tensorprod", x, y), U(-2, 2), U(-2, 2), dx=2, dy=3),
    "matmul": Case(lambda x, y: A("matmul", x, y, params=(3,)), U(-2, 2), U(-2, 2), dx=6, dy=12),
    "gather": Case(lambda x, y: A("gather", A("mul", x, y), params=((2, 0, 0, 1),)),
                   U(-2, 2), U(-2, 2), dx=3, dy=3),
    "scatter": Case(lambda x, y: A("scatter", A("mul", x, y), params=((3, 0, 3), 5)),
                    U(-2, 2), U(-2, 2), dx=3, dy=3),
}
# fmt: on

N, M = 23, 37
needs_cxx = pytest.mark.skipif(not cpu_compiler().available, reason="no C++ compiler")
RTOL64 = 1e-11


def _concat(parts):
    """Balanced concatenation (a chain would copy O(n^2) components)."""
    if len(parts) == 1:
        return parts[0]
    h = len(parts) // 2
    return A("concat", _concat(parts[:h]), _concat(parts[h:]))


def _builtin_ops():
    """Registered ops, less those users define at run time (``lazytensor.api.custom``)."""
    return {n for n, d in ops.REGISTRY.items() if not d.user}


def test_every_registered_op_has_a_case():
    builtin = _builtin_ops()
    missing = sorted(builtin - set(CASES))
    stale = sorted(set(CASES) - builtin)
    assert not missing, f"ops registered without a test case in tests/test_ops.py: {missing}"
    assert not stale, f"test cases for ops that are not registered: {stale}"
    assert set(ELEMENTWISE) & builtin <= set(CASES)


def test_each_case_uses_its_op_and_both_indices():
    for name, case in CASES.items():
        x, y = ir.var(0, case.dx, "i"), ir.var(1, case.dy, "j")
        f = case.build(x, y)
        assert name in set(ir.iter_ops(f)), name
        assert {v.cat for v in ir.variables(f)} == {"i", "j"}, name


# ------------------------------------------------------------------ data and evaluation


@functools.cache
def _seed():
    return int.from_bytes(os.urandom(4), "little")


@functools.cache
def _data():
    """float64 data per op, (x (N, dx), y (M, dy)), from one seed per test session."""
    rng = np.random.default_rng(_seed())
    out = {}
    for name in sorted(CASES):
        c = CASES[name]
        out[name] = (c.x.sample(rng, (N, c.dx)), c.y.sample(rng, (M, c.dy)))
    return out


def _formula_and_vars(names, dtype):
    """The concatenated formula of ``names`` and its variables (x_k, y_k per op)."""
    data = _data()
    parts, variables, slices, start = [], [], {}, 0
    for k, name in enumerate(names):
        c = CASES[name]
        x, y = ir.var(2 * k, c.dx, "i"), ir.var(2 * k + 1, c.dy, "j")
        f = c.build(x, y)
        parts.append(f)
        xd, yd = data[name]
        variables += [Variable(xd.astype(dtype), "i", c.dx), Variable(yd.astype(dtype), "j", c.dy)]
        slices[name] = slice(start, start + f.dim)
        start += f.dim
    return _concat(parts), variables, slices


def _as64(variables):
    return [Variable(np.asarray(v.data, dtype=np.float64), v.cat, v.dim) for v in variables]


@functools.cache
def _results(dtype, axis):
    """{op: (cpu, reference, scale)} for all ops, from one combined kernel when it builds."""
    names = sorted(CASES)
    try:
        groups = [names]
        f, variables, slices = _formula_and_vars(names, dtype)
        cpu = engine.reduce(f, variables, "sum", axis, {}, "cpu")
    except CompileError:
        groups = [[n] for n in names]  # find the op that does not compile
    out = {}
    for group in groups:
        f, variables, slices = _formula_and_vars(group, dtype)
        try:
            if len(groups) > 1:
                cpu = engine.reduce(f, variables, "sum", axis, {}, "cpu")
        except CompileError as e:
            out[group[0]] = e
            continue
        v64 = _as64(variables)
        ref = engine.reduce(f, v64, "sum", axis, {}, "numpy")
        scale = engine.reduce(A("abs", f), v64, "sum", axis, {}, "numpy")
        for name in group:
            s = slices[name]
            out[name] = (cpu[:, s], ref[:, s], scale[:, s])
    return out


@needs_cxx
@pytest.mark.parametrize("axis", [1, 0], ids=["sum_j", "sum_i"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_op_cpu_matches_reference(name, dtype, axis):
    result = _results(dtype, axis)[name]
    if isinstance(result, Exception):
        raise result
    cpu, ref, scale = result
    assert cpu.dtype == np.dtype(dtype)
    assert cpu.shape == (N if axis == 1 else M, ref.shape[1])
    assert np.all(np.isfinite(ref)), f"{name}: the case's domain gives non-finite values"
    rtol = CASES[name].rtol32 if dtype == "float32" else RTOL64
    err = np.abs(cpu.astype(np.float64) - ref)
    bound = rtol * scale + 1e-30
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), (
        f"{name} ({dtype}, seed {_seed()}): cpu {cpu[worst]!r} vs reference {ref[worst]!r} "
        f"at {worst}, error {err[worst]:.3g} > {bound[worst]:.3g}"
    )


# ------------------------------------------------------------------ the reference itself


def _torch_cases():
    import torch

    def t_round(a):
        return torch.sign(a) * torch.floor(torch.abs(a) + 0.5)

    # fmt: off
    return {
        # name: (formula on (x, y), torch function of dense (N, M, d) x and y, x dom, y dom, dx, dy)
        "gauss": (lambda x, y: A("exp", A("neg", A("sum", A("square", A("sub", x, y))))),
                  lambda x, y: torch.exp(-((x - y) ** 2).sum(-1, keepdim=True)), U(-1, 1), U(-1, 1), 3, 3),
        "log_atan2": (lambda x, y: A("mul", A("log", A("add", x, y)), A("atan2", x, y)),
                      lambda x, y: torch.log(x + y) * torch.atan2(x, y), U(0.1, 2), U(0.1, 2), 2, 2),
        "softplus": (lambda x, y: A("softplus", A("mul", x, y)),
                     lambda x, y: torch.logaddexp(torch.zeros_like(x), x * y), U(-6, 6), U(-6, 6), 2, 1),
        "logsigmoid_erf": (lambda x, y: A("add", A("logsigmoid", A("mul", x, y)), A("erf", A("sub", x, y))),
                           lambda x, y: torch.nn.functional.logsigmoid(x * y) + torch.erf(x - y),
                           U(-4, 4), U(-4, 4), 2, 1),
        "matvec": (lambda x, y: A("matvec", x, y),
                   lambda x, y: (x.reshape(*x.shape[:-1], 2, 3) @ y[..., None])[..., 0], U(-1, 1), U(-1, 1), 6, 3),
        "vecmat": (lambda x, y: A("vecmat", x, y),
                   lambda x, y: (x[..., None, :] @ y.reshape(*y.shape[:-1], 2, 3))[..., 0, :], U(-1, 1), U(-1, 1), 2, 6),
        "tensorprod": (lambda x, y: A("tensorprod", x, y),
                       lambda x, y: (x[..., :, None] * y[..., None, :]).flatten(-2), U(-1, 1), U(-1, 1), 2, 3),
        "matmul": (lambda x, y: A("matmul", x, y, params=(3,)),
                   lambda x, y: (x.unflatten(-1, (2, 3)) @ y.unflatten(-1, (3, 4))).flatten(-2),
                   U(-1, 1), U(-1, 1), 6, 12),
        "round_floor": (lambda x, y: A("concat", A("round", A("add", x, y)), A("floor", A("sub", x, y))),
                        lambda x, y: torch.cat([t_round(x + y), torch.floor(x - y)], -1), G(-2, 2), G(-2, 2), 1, 1),
        "vargmin_vmax": (lambda x, y: A("concat", A("vargmin", A("sub", x, y)), A("vmax", A("mul", x, y))),
                         lambda x, y: torch.cat([torch.argmin(x - y, -1, keepdim=True).double(),
                                                 torch.amax(x * y, -1, keepdim=True)], -1),
                         U(-1, 1), U(-1, 1), 4, 4),
        "one_hot": (lambda x, y: A("one_hot", A("add", x, y), params=(4,)),
                    lambda x, y: torch.nn.functional.one_hot(
                        t_round(x + y)[..., 0].clamp(-1, 4).long() + 1, 6)[..., 1:5].double(),
                    G(-1, 3, 0.5), G(-1, 2, 0.5), 1, 1),
        "slice_pad": (lambda x, y: A("pad", A("slice", A("mul", x, y), params=(1, 2)), params=(2, 5)),
                      lambda x, y: torch.nn.functional.pad((x * y)[..., 1:3], (2, 1)), U(-1, 1), U(-1, 1), 4, 1),
        "comparisons": (lambda x, y: _concat([A(n, x, y) for n in ("lt", "le", "eq", "ne", "gt", "ge")]),
                        lambda x, y: torch.cat([(x < y), (x <= y), (x == y), (x != y), (x > y), (x >= y)], -1).double(),
                        G(-1, 1, 0.5), G(-1, 1, 0.5), 1, 1),
        "clamp_ifelse": (lambda x, y: A("add", A("clamp", x, C(-0.5), y), A("ifelse", A("sub", x, y), x, y)),
                         lambda x, y: torch.where(x < -0.5, -0.5, torch.where(x > y, y, x))
                         + torch.where(x - y >= 0, x, y),
                         G(-1, 1), G(-1, 1), 1, 1),
    }
    # fmt: on


@pytest.mark.parametrize(
    "name",
    sorted(
        [
            "gauss",
            "log_atan2",
            "softplus",
            "logsigmoid_erf",
            "matvec",
            "vecmat",
            "tensorprod",
            "matmul",
            "round_floor",
            "vargmin_vmax",
            "one_hot",
            "slice_pad",
            "comparisons",
            "clamp_ifelse",
        ]
    ),
)
def test_reference_against_torch(name, rng):
    """The engine's reference (sum over j) against a dense torch computation in float64."""
    import torch

    build, tfun, xd, yd, dx, dy = _torch_cases()[name]
    x = xd.sample(rng, (9, dx))
    y = yd.sample(rng, (11, dy))
    f = build(ir.var(0, dx, "i"), ir.var(1, dy, "j"))
    ref = engine.reduce(f, [Variable(x, "i", dx), Variable(y, "j", dy)], "sum", 1, {}, "numpy")
    dense = tfun(
        torch.from_numpy(x)[:, None, :].expand(9, 11, dx),
        torch.from_numpy(y)[None, :, :].expand(9, 11, dy),
    )
    np.testing.assert_allclose(ref, dense.sum(1).numpy(), rtol=1e-12, atol=1e-12)


def test_reference_pow_and_specials_against_numpy():
    """Edge values the reference must get right: pow of negatives, xlogx(0), sinxdivx(0)..."""
    a = np.array([[-2.0], [-0.5], [0.0], [0.5], [3.0]])
    p3 = A("pow", ir.var(0, 1, "i"), params=(3.0,))
    np.testing.assert_array_equal(evaluate(p3, {0: a}), a**3)
    pm2 = A("pow", ir.var(0, 1, "i"), params=(-2.0,))
    np.testing.assert_allclose(evaluate(pm2, {0: a[[0, 1, 3, 4]]}), a[[0, 1, 3, 4]] ** -2.0)
    z = np.array([[0.0], [1.0]])
    np.testing.assert_array_equal(evaluate(A("xlogx", ir.var(0, 1, "i")), {0: z}), [[0.0], [0.0]])
    np.testing.assert_allclose(
        evaluate(A("sinxdivx", ir.var(0, 1, "i")), {0: z}), [[1.0], [np.sin(1.0)]]
    )
    h = np.array([[-2.5], [-0.5], [0.5], [1.5], [2.5]])
    np.testing.assert_array_equal(
        evaluate(A("round", ir.var(0, 1, "i")), {0: h}), [[-3.0], [-1.0], [1.0], [2.0], [3.0]]
    )
    s = np.array([[-1.0], [0.0], [2.0]])
    np.testing.assert_array_equal(
        evaluate(A("step", ir.var(0, 1, "i")), {0: s}), [[0.0], [1.0], [1.0]]
    )
    np.testing.assert_array_equal(
        evaluate(A("relu", ir.var(0, 1, "i")), {0: s}), [[0.0], [0.0], [2.0]]
    )
    inf = np.array([[-np.inf], [np.inf], [np.nan]])
    for name, want in (
        ("relu", [0.0, np.inf, np.nan]),
        ("step", [0.0, 1.0, np.nan]),
        ("softplus", [0.0, np.inf, np.nan]),
        ("logsigmoid", [-np.inf, 0.0, np.nan]),
        ("sigmoid", [0.0, 1.0, np.nan]),
        ("sign", [-1.0, 1.0, np.nan]),
    ):
        np.testing.assert_array_equal(
            evaluate(A(name, ir.var(0, 1, "i")), {0: inf})[:, 0], want, err_msg=name
        )
    big = np.array([[-800.0], [800.0]])
    np.testing.assert_allclose(
        evaluate(A("softplus", ir.var(0, 1, "i")), {0: big}), [[0.0], [800.0]]
    )
    np.testing.assert_allclose(
        evaluate(A("logsigmoid", ir.var(0, 1, "i")), {0: big}), [[-800.0], [0.0]]
    )


# ------------------------------------------------------------------ derivatives of every op


def _fd_check(f, wrt, env, rng, what):
    """vjp and jvp of ``f`` against central finite differences (float64, dense)."""
    fval = evaluate(f, env)
    shape = np.broadcast_shapes(*[env[k].shape[:-1] for k in env]) + (f.dim,)
    g = rng.standard_normal(shape)
    gvar = ir.var(99, f.dim, "i")
    cots = diff.vjp(f, wrt, gvar)
    h = 1e-6
    for v in wrt:
        base = env[v.index]
        t = rng.standard_normal(base.shape)
        ep, em = dict(env), dict(env)
        ep[v.index], em[v.index] = base + h * t, base - h * t
        fp, fm = evaluate(f, ep), evaluate(f, em)
        num = np.sum((fp - fm) * g) / (2 * h)
        cot = np.broadcast_to(evaluate(cots[v], {**env, 99: g}), shape[:-1] + (v.dim,))
        sym = np.sum(cot * t)
        scale = np.sum(np.abs(cot * t)) + np.sum(np.abs(fp - fm) * np.abs(g)) / (2 * h) + 1e-8
        assert abs(sym - num) <= 1e-5 * scale, f"{what}: VJP d/d{v.cat} {sym} vs FD {num}"
        tv = ir.var(98, v.dim, v.cat)
        jv = diff.jvp(f, {v: tv})
        assert jv.dim == f.dim
        jsym = np.broadcast_to(
            evaluate(jv, {**env, 98: t}), fval.shape if fval.ndim == 3 else shape
        )
        jnum = (fp - fm) / (2 * h)
        np.testing.assert_allclose(
            jsym,
            np.broadcast_to(jnum, jsym.shape),
            rtol=1e-5,
            atol=1e-5 * (np.abs(jnum).max() + 1e-3),
            err_msg=f"{what}: JVP d/d{v.cat}",
        )
    assert np.all(np.isfinite(fval))


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_derivatives_match_finite_differences(name, rng):
    """VJP and JVP of each op (inside its case formula) against finite differences.

    Inputs are drawn from the continuous version of each domain, where kinks and jumps
    have probability zero (non-differentiable ops then have derivative 0 almost everywhere).
    """
    c = CASES[name]
    x, y = ir.var(0, c.dx, "i"), ir.var(1, c.dy, "j")
    f = c.build(x, y)
    env = {
        0: c.x.sample(rng, (3, 1, c.dx), continuous=True),
        1: c.y.sample(rng, (1, 4, c.dy), continuous=True),
    }
    if c.x.specials or c.y.specials:  # no derivative at the special values (xlogx at 0...)
        env = {0: np.abs(env[0]) + 0.05, 1: np.abs(env[1]) + 0.05}
    _fd_check(f, [x, y], env, rng, name)


# ------------------------------------------------------------------ NaN and infinities

SPECIAL_OPS = (
    "relu",
    "abs",
    "sign",
    "step",
    "min2",
    "max2",
    "clamp",
    "floor",
    "ceil",
    "round",
    "exp",
    "sqrt",
    "softplus",
    "logsigmoid",
    "sigmoid",
    "xlogx",
    "sinxdivx",
    "tanh",
    "eq",
    "ne",
    "lt",
    "ge",
    "ifelse",
    "vmin",
    "vmax",
    "vargmin",
    "vargmax",
    "one_hot",
    "pow",
    "atan2",
    "erf",
    "atan",
    "rsqrt",
    "powf",
)


def _special_formula(x, y):
    return _concat(_special_parts(x, y))


def _special_parts(x, y):
    """One component (or a few) per op, each fed by x_i, which holds NaN and infinities."""
    a = A("slice", x, params=(0, 1))
    b = y
    parts = []
    for name in SPECIAL_OPS:
        if name in ("min2", "max2", "eq", "ne", "lt", "ge", "atan2", "powf"):
            parts.append(A(name, a, b))
        elif name == "clamp":
            parts.append(A("clamp", a, A("neg", A("abs", b)), A("abs", b)))
        elif name == "ifelse":
            parts.append(A("ifelse", a, b, A("neg", b)))
        elif name in ("vmin", "vmax", "vargmin", "vargmax"):
            parts.append(A(name, A("mul", x, b)))
        elif name == "one_hot":
            parts.append(A("one_hot", a, params=(3,)))
        elif name == "pow":
            parts.append(A("pow", a, params=(2.0,)))
        else:
            parts.append(A("mul", A(name, a), A("add", b, C(2.0))))
    return parts


@needs_cxx
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_nan_and_infinities_follow_the_reference(dtype, rng):
    """Rows of x holding NaN, +inf, -inf (alone or mixed with finite components): the CPU
    kernel has the reference's NaN/inf pattern and values (the reference follows NumPy)."""
    specials = [np.nan, np.inf, -np.inf, 0.0, 1.0, -1.0]
    x = rng.uniform(-1, 1, (3 * len(specials), 3))
    for r, s in enumerate(specials):
        x[r, 0] = s  # the scalar ops' input
        x[len(specials) + r, 1] = s  # a vector component only
        x[2 * len(specials) + r, :] = s
    y = rng.uniform(0.25, 1, (7, 1))
    f = _special_formula(ir.var(0, 3, "i"), ir.var(1, 1, "j"))
    variables = [Variable(x.astype(dtype), "i", 3), Variable(y.astype(dtype), "j", 1)]
    cpu = engine.reduce(f, variables, "sum", 1, {}, "cpu")
    ref = engine.reduce(f, _as64(variables), "sum", 1, {}, "numpy")
    assert cpu.shape == ref.shape == (x.shape[0], f.dim)
    k = 0
    for name, part in zip(SPECIAL_OPS, _special_parts(ir.var(0, 3, "i"), ir.var(1, 1, "j"))):
        s = slice(k, k + part.dim)
        k += part.dim
        np.testing.assert_allclose(
            cpu[:, s],
            ref[:, s],
            rtol=1e-5 if dtype == "float32" else 1e-12,
            atol=1e-6,
            equal_nan=True,
            err_msg=f"{name} ({dtype})",
        )
