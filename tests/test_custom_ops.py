"""User-defined elementwise ops: forward (compiled, reference, Genred strings) against NumPy
float64, gradients against torch autograd, and the checks on names and expressions.

Op names are global to the process: each test defines its own.
"""

import numpy as np
import pytest
import sympy
import torch
from lazytensor.codegen import arraymath, ops

import lazytensor
from lazytensor import Genred, Vi, Vj, elementwise


def _softplus2_np(u):
    return np.logaddexp(0, 2 * u)


def test_forward_lazytensor_and_genred_string(rng):
    f = elementwise("t_softplus2", lambda u: sympy.log(1 + sympy.exp(2 * u)))
    x, y = rng.normal(size=(30, 2)), rng.normal(size=(20, 2))
    expected = _softplus2_np(x[:, None] - y[None]).sum(1)
    np.testing.assert_allclose(f(Vi(x) - Vj(y)).sum(1), expected, rtol=1e-12)
    # The string builds the same IR, hence the same kernel.
    g = Genred("t_softplus2(x - y)", ["x = Vi(2)", "y = Vj(2)"], axis=1)
    np.testing.assert_allclose(g(x, y), expected, rtol=1e-12)
    np.testing.assert_allclose(g(x, y, backend="numpy"), expected, rtol=1e-12)
    # On arrays: the op's reference, NumPy and torch.
    np.testing.assert_allclose(f(x), _softplus2_np(x), rtol=1e-12)
    np.testing.assert_allclose(f(torch.tensor(x)).numpy(), _softplus2_np(x), rtol=1e-12)
    # Defining it again with the same expression gives the same op.
    assert elementwise("t_softplus2", lambda u: sympy.log(1 + sympy.exp(2 * u))) is f


def test_forward_float32(rng):
    f = elementwise("t_gauss", lambda u: sympy.exp(-u**2 / 2) * sympy.cos(3 * u))
    x, y = rng.normal(size=(40, 1)).astype(np.float32), rng.normal(size=(25, 1)).astype(np.float32)
    u = x.astype(np.float64)[:, None] - y.astype(np.float64)[None]
    out = f(Vi(x) - Vj(y)).sum(0)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, (np.exp(-u**2 / 2) * np.cos(3 * u)).sum(0), rtol=2e-5, atol=1e-5)


def test_gradient_matches_torch_autograd(rng):
    f = elementwise("t_bump", lambda u: u * sympy.atan(u) - sympy.log(1 + u**2) / 2)
    x = torch.tensor(rng.normal(size=(15, 3)), requires_grad=True)
    y = torch.tensor(rng.normal(size=(12, 3)), requires_grad=True)
    b = torch.tensor(rng.normal(size=(12, 1)))
    out = (f((Vi(x) - Vj(y)).sqnorm2()) * Vj(b)).sum(1)
    w = torch.tensor(rng.normal(size=(15, 1)))
    gx, gy = torch.autograd.grad(out, [x, y], w)

    xd, yd = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    u = ((xd[:, None] - yd[None]) ** 2).sum(-1, keepdim=True)
    ref = ((u * torch.atan(u) - torch.log1p(u**2) / 2) * b[None]).sum(1)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-12)
    for got, want in zip((gx, gy), torch.autograd.grad(ref, [xd, yd], w)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)


def test_two_argument_op_and_its_gradient(rng):
    hyp = elementwise("t_hypot", lambda a, b: sympy.sqrt(a**2 + b**2 + 1))
    x = torch.tensor(rng.normal(size=(10, 2)), requires_grad=True)
    y = torch.tensor(rng.normal(size=(8, 2)), requires_grad=True)
    out = hyp(Vi(x), Vj(y)).sum(1)
    ref_x, ref_y = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    ref = torch.sqrt(ref_x[:, None] ** 2 + ref_y[None] ** 2 + 1).sum(1)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-12)
    got = torch.autograd.grad(out.sum(), [x, y])
    want = torch.autograd.grad(ref.sum(), [ref_x, ref_y])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-10)


def test_branchy_expressions_reference_and_kernel(rng):
    """Piecewise / Max / Mod: the reference once failed on arrays, and C's fmod truncates."""
    pw = elementwise("t_piecewise", lambda u: sympy.Piecewise((u, u > 0), (u**2 / 3, True)))
    mx = elementwise("t_hinge2", lambda u: sympy.Max(u, 0) ** 2)
    md = elementwise("t_mod", lambda u: sympy.Mod(u, sympy.Rational(3, 2)))
    u = rng.uniform(-3, 3, size=(50, 1))
    refs = {pw: np.where(u > 0, u, u**2 / 3), mx: np.maximum(u, 0) ** 2, md: np.mod(u, 1.5)}
    for f, expected in refs.items():
        np.testing.assert_allclose(f(u), expected, rtol=1e-12, atol=1e-12)
        op = ops.get(f.name)
        got = op.ref(arraymath.torch_namespace(), [torch.tensor(u)], f.params).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    lazy = Vi(u) - Vj(np.zeros((1, 1)))
    out = pw(lazy).concat(mx(lazy)).concat(md(lazy)).sum(1)  # one kernel for the three
    np.testing.assert_allclose(out, np.concatenate(list(refs.values()), 1), rtol=1e-12, atol=1e-12)


def test_gradient_of_piecewise_op(rng):
    pw = elementwise("t_piecewise2", lambda u: sympy.Piecewise((sympy.sin(u), u > 0), (u**3, True)))
    x = torch.tensor(rng.uniform(-2, 2, size=(20, 1)), requires_grad=True)
    y = torch.zeros(3, 1, dtype=torch.float64)
    (gx,) = torch.autograd.grad(pw(Vi(x) - Vj(y)).sum(1).sum(), [x])
    xd = x.detach()
    np.testing.assert_allclose(gx.numpy(), 3 * torch.where(xd > 0, torch.cos(xd), 3 * xd**2).numpy(),
                               rtol=1e-12)


def test_name_and_expression_checks():
    assert elementwise("exp", sympy.exp)(0.0) == 1.0  # identical to the built-in: allowed
    elementwise("t_once", lambda u: u**3)
    with pytest.raises(ValueError, match="already defined"):
        elementwise("t_once", lambda u: u**5)
    with pytest.raises(ValueError, match="built-in op"):
        elementwise("exp", lambda u: sympy.exp(2 * u))
    with pytest.raises(ValueError, match="built-in op"):
        elementwise("sum", lambda u: u)
    with pytest.raises(ValueError, match="formula function"):
        elementwise("Exp", sympy.exp)
    for bad in ("1abc", "a-b", "x y", "", "_hidden", "lambda", "é"):
        with pytest.raises(ValueError, match="name|cannot be used"):
            elementwise(bad, sympy.exp)
    with pytest.raises(ValueError, match="not its arguments"):
        elementwise("t_stray", lambda u: u * sympy.Symbol("t"))
    with pytest.raises(ValueError, match="real sympy expression"):
        elementwise("t_complex", lambda u: sympy.I * u)
    with pytest.raises(ValueError, match="no C translation"):
        elementwise("t_bessel", lambda u: sympy.besselj(0, u))


def test_definition_hash_is_part_of_the_ir_key():
    """Two processes giving one name different expressions must not share a cached kernel."""
    a = elementwise("t_keyed_a", lambda u: u**2 + 1)
    b = elementwise("t_keyed_b", lambda u: u**2 + 2)
    assert a.params and a.params != b.params
    x = np.ones((2, 1))
    assert a(Vi(x)).formula.params == a.params


def test_op_without_ir_derivative_runs_forward_and_refuses_gradients(rng):
    from scipy import special

    gamma = elementwise("t_gamma", lambda u: sympy.gamma(u))
    x = rng.uniform(1, 3, size=(6, 1))
    y = rng.uniform(0, 0.5, size=(4, 1))
    np.testing.assert_allclose(gamma(Vi(x) - Vj(y)).sum(1), special.gamma(x[:, None] - y[None]).sum(1),
                               rtol=1e-10)
    xt = torch.tensor(x, requires_grad=True)
    with pytest.raises(NotImplementedError, match="no derivative"):
        gamma(Vi(xt) - Vj(torch.tensor(y))).sum(1).sum().backward()


def test_exported_from_package():
    assert lazytensor.elementwise is elementwise


# ------------------------------------------------------------------ what reaches the printer
_K = sympy.Symbol("k", integer=True)
_T = sympy.Symbol("t", real=True)
_BAD_NAME = sympy.Symbol('q\n#include "/etc/passwd"\n', real=True)

EXACT_LITERALS = {  # expression -> its value at u, in float64
    "u*10**20": (lambda u: u * 10**20, lambda u: u * 1e20),
    "u*2**64": (lambda u: u * 2**64, lambda u: u * 2.0**64),
    "u*(2**64+1)": (lambda u: u * (2**64 + 1), lambda u: u * float(2**64 + 1)),
    "u-3**50": (lambda u: u - 3**50, lambda u: u - float(3**50)),
    "u*10**300": (lambda u: u * 10**300, lambda u: u * 1e300),
    "u*10**30/7": (lambda u: u * sympy.Rational(10**30, 7), lambda u: u * (10**30 / 7)),
    "u/(3*2**80)": (lambda u: u / (3 * 2**80), lambda u: u / (3 * 2.0**80)),
    "u*EulerGamma": (lambda u: u * sympy.EulerGamma, lambda u: u * 0.5772156649015329),
    "u*Catalan": (lambda u: u + sympy.Catalan, lambda u: u + 0.915965594177219),
    "u*GoldenRatio": (lambda u: u * sympy.GoldenRatio, lambda u: u * 1.618033988749895),
    "Sum(u**k)": (lambda u: sympy.Sum(u**_K / sympy.factorial(_K), (_K, 0, 6)),
                  lambda u: sum(u**k / np.prod(np.arange(1, k + 1)) for k in range(7))),
    "Subs": (lambda u: sympy.Subs(sympy.sin(_T), _T, u), np.sin),
    "Derivative": (lambda u: sympy.Derivative(sympy.sin(u) * u, u), lambda u: np.cos(u) * u + np.sin(u)),
    "Product": (lambda u: sympy.Product(u + _K, (_K, 1, 3)), lambda u: (u + 1) * (u + 2) * (u + 3)),
}


@pytest.mark.parametrize("case", sorted(EXACT_LITERALS))
def test_literals_and_constants_compile_to_their_value(rng, case):
    """Large integers were C integer literals (u*10**20 gave 1.16e19 u, u*2**64 gave 0);
    EulerGamma and unevaluated Sum/Subs failed to compile."""
    make, value = EXACT_LITERALS[case]
    name = "t_lit_" + "".join(ch if ch.isalnum() else "_" for ch in case)
    f = elementwise(name, make)
    x, y = rng.uniform(0.5, 1.5, size=(7, 1)), np.zeros((1, 1))
    want = value(x)
    np.testing.assert_allclose(f(Vi(x) - Vj(y)).sum(1), want, rtol=1e-14, atol=0)
    got32 = f(Vi(x.astype(np.float32)) - Vj(y.astype(np.float32))).sum(1)
    with np.errstate(over="ignore"):  # u*10**300 is inf in float32, as it should be
        want32 = want.astype(np.float32)
    np.testing.assert_allclose(got32, want32, rtol=3e-6, atol=0)
    np.testing.assert_allclose(f(x), want, rtol=1e-14, atol=0)  # the reference agrees


REFUSED = {
    "integer beyond float64": (lambda u: u * 10**400, "outside the float64 range"),
    "rational underflowing": (lambda u: u * sympy.Rational(1, 10**400), "outside the float64 range"),
    "float beyond float64": (lambda u: u * sympy.Float("1e400"), "outside the float64 range"),
    "newline and #include in a bound name": (
        lambda u: sympy.Subs(u * _BAD_NAME, _BAD_NAME, 2), "not an identifier"),
    "newline in a summation index": (
        lambda u: sympy.Sum(u ** sympy.Symbol("k\n#define u 0", integer=True),
                            (sympy.Symbol("k\n#define u 0", integer=True), 0, 2)),
        "not an identifier"),
    "#include in a function name": (lambda u: sympy.Function('f\n#include "x"')(u), "not an identifier"),
    "undefined function": (lambda u: sympy.Function("g")(u), "undefined function"),
    "function without C": (lambda u: sympy.besselj(0, u), "no C translation"),
    "Integral": (lambda u: sympy.Integral(u * _K, (_K, 0, 1)), "no C translation for Integral"),
    "long Sum": (lambda u: sympy.Sum(sympy.sin(_K * u), (_K, 0, 10**6)), "at most 256 terms"),
    "infinite Sum": (lambda u: sympy.Sum(u**_K / sympy.factorial(_K), (_K, 0, sympy.oo)),
                     "integer bounds"),
    "complex infinity": (lambda u: u + sympy.zoo, "not a real number|real sympy expression"),
    "polygamma": (lambda u: sympy.polygamma(1, u), "no C translation"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_expressions_without_an_exact_c_translation_are_refused_at_definition(case):
    make, message = REFUSED[case]
    name = "t_bad_" + "".join(ch if ch.isalnum() else "_" for ch in case)
    with pytest.raises(ValueError, match=message) as info:
        elementwise(name, make)
    assert name in str(info.value)
    with pytest.raises(ValueError, match="Unknown|unknown|not"):
        Genred(f"{name}(x)", ["x = Vi(1)"], axis=1)  # nothing was registered
    assert elementwise(name, lambda u: u + 1)(1.0) == 2.0  # the name is still free


def test_printed_text_is_checked_before_it_enters_a_kernel():
    from lazytensor.codegen import sympy_bridge

    for bad in ('a0 + "x"', "a0 // comment", "a0; system(1)", "a0\n#include <x>", "a0[1]",
                "evil(a0)", "a0 /* x */"):
        with pytest.raises(ValueError, match="not an expression of known names"):
            sympy_bridge.check_c_text(bad)
    assert sympy_bridge.check_c_text("fmaxf(1, a0) + M_PI*expf(-a0)") == "fmaxf(1, a0) + M_PI*expf(-a0)"


@pytest.mark.parametrize("seed", range(3))
def test_random_large_literals_print_as_the_nearest_double(seed):
    """Integers and fractions of any size up to the float64 range: the literal's decimal
    text rounds (as the compiler rounds it) to the correctly rounded double."""
    from fractions import Fraction

    from lazytensor.codegen import sympy_bridge

    gen = np.random.default_rng(seed)
    for _ in range(300):
        p = int(gen.integers(1, 10**9)) * 10 ** int(gen.integers(0, 290)) + int(gen.integers(0, 10**6))
        q = int(gen.integers(1, 10**6)) ** int(gen.integers(1, 4))
        for value in (sympy.Integer(p), sympy.Rational(-p, q)):
            text = sympy_bridge.literal_text(value)
            assert float(text) == float(Fraction(int(value.p), int(value.q))), (value, text)
