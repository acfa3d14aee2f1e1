"""Radial kernel sums recognized in the IR (codegen/radial.py), as users write them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from lazytensor.codegen import ir, radial

from lazytensor import Pm, Vi, Vj


def _params(K):
    """index -> value of the formula's parameters, as the methods bind them."""
    return {k: np.atleast_1d(np.asarray(v.data, dtype=np.float64))
            for k, v in enumerate(K.variables) if v.cat == "p"}


def _points(rng, D, n=6):
    return rng.random((n, D)), rng.random((n + 1, D)), rng.random((n + 1, 2))


def _formulas(x, y, b, h):
    """name -> (LazyTensor, φ as a function of r = |x - y|, smooth at 0, bounded)."""
    r2 = Vi(x).sqdist(Vj(y))
    r = (Vi(x) - Vj(y)).norm2()
    return {
        "gaussian": ((-r2 / h ** 2).exp() * Vj(b), lambda r: np.exp(-r ** 2 / h ** 2), True),
        "gaussian_pow": ((-((Vi(x) - Vj(y)) ** 2).sum(-1) / Pm(np.array([h])) ** 2).exp(),
                         lambda r: np.exp(-r ** 2 / h ** 2), True),
        "gaussian_scaled": ((-(((Vi(x) - Vj(y)) / h) ** 2).sum(-1)).exp() * Vj(b),
                            lambda r: np.exp(-r ** 2 / h ** 2), True),
        "laplacian": ((-r / h).exp() * Vj(b), lambda r: np.exp(-r / h), False),
        "cauchy": (1 / (1 + r2 / h ** 2) * Vj(b), lambda r: 1 / (1 + r ** 2 / h ** 2), True),
        "imq": ((1 + r2 / h ** 2).rsqrt() * Vj(b), lambda r: 1 / np.sqrt(1 + r ** 2 / h ** 2),
                True),
        "matern32": ((1 + math.sqrt(3) * r / h) * (-math.sqrt(3) * r / h).exp() * Vj(b),
                     lambda r: (1 + math.sqrt(3) * r / h) * np.exp(-math.sqrt(3) * r / h), False),
        "matern52": ((1 + math.sqrt(5) * r / h + 5 * r2 / (3 * h ** 2))
                     * (-math.sqrt(5) * r / h).exp() * Vj(b),
                     lambda r: (1 + math.sqrt(5) * r / h + 5 * r ** 2 / (3 * h ** 2))
                     * np.exp(-math.sqrt(5) * r / h), False),
        "energy": (-r * Vj(b), lambda r: -r, False),
        "coulomb": (1 / r * Vj(b), lambda r: 1 / r, False),
        "coulomb_rsqrt": ((Vi(x) - Vj(y)).sqnorm2().rsqrt() * Vj(b), lambda r: 1 / r, False),
    }


@pytest.mark.parametrize("D", [1, 2, 3])
@pytest.mark.parametrize("name", ["gaussian", "gaussian_pow", "gaussian_scaled", "laplacian",
                                  "cauchy", "imq", "matern32", "matern52", "energy", "coulomb",
                                  "coulomb_rsqrt"])
def test_qualifying_kernels(rng, name, D):
    x, y, b = _points(rng, D)
    h = float(rng.uniform(0.1, 2.0))
    K, phi, smooth = _formulas(x, y, b, h)[name]
    found = radial.analyze(K.formula)
    assert isinstance(found, radial.RadialSum), found.reason
    assert found.D == D and found.x.cat == "i" and found.y.cat == "j"
    params = _params(K)
    r = rng.uniform(0.05, 3.0, 20)
    np.testing.assert_allclose(radial.profile_values(found.profile, r ** 2, params), phi(r),
                               rtol=1e-12)
    assert radial.smooth_at_zero(found.profile, params) is smooth
    if found.weight is not None:
        assert found.weight.cat == "j" and found.E == 2
    gauss = radial.gaussian(found.profile, params)
    if name.startswith("gaussian"):
        assert gauss is not None and gauss[0] == pytest.approx(1.0)
        assert gauss[1] == pytest.approx(-1 / h ** 2)
    else:
        assert gauss is None


def test_the_weight_may_be_a_formula_of_j_variables(rng):
    x, y, b = _points(rng, 3)
    K = (-Vi(x).sqdist(Vj(y))).exp() * Vj(b).exp() * 2.0
    found = radial.analyze(K.formula)
    assert isinstance(found, radial.RadialSum)
    assert {v.cat for v in ir.variables(found.weight)} == {"j"}
    params = _params(K)
    # the scalar 2.0 is folded into the profile
    assert radial.profile_values(found.profile, np.array([0.0]), params)[0] == pytest.approx(2.0)


def test_y_minus_x_and_a_vector_weight(rng):
    x, y, b = _points(rng, 2)
    K = (-(Vj(y) - Vi(x)).norm2()).exp() * Vj(rng.random((len(y), 3)))
    found = radial.analyze(K.formula)
    assert isinstance(found, radial.RadialSum) and found.E == 3
    assert not radial.smooth_at_zero(found.profile, _params(K))


@pytest.mark.parametrize("case, reason", [
    ("i_weight", "i-dependent weight"),
    ("non_radial", "not radial"),
    ("not_invariant", "not translation-invariant"),
    ("branch", "branch"),
    ("abs_3d", "not radial"),
    ("high_d", "D = 5"),
    ("vector_kernel", "vector-valued kernel"),
    ("two_points", "one i-variable and one j-variable"),
])
def test_non_qualifying(rng, case, reason):
    x, y, b = _points(rng, 3)
    a = rng.random((len(x), 1))
    r2 = Vi(x).sqdist(Vj(y))
    K = {
        "i_weight": (-r2).exp() * Vi(a),
        "non_radial": (-(Vi(x) - Vj(y)).sum(-1)).exp(),
        "not_invariant": (-(Vi(x) * Vj(y)).sum(-1)).exp(),
        "branch": (1 - r2).relu() * Vj(b),
        "abs_3d": (-(Vi(x) - Vj(y)).abs().sum(-1)).exp(),
        "high_d": (-Vi(rng.random((4, 5))).sqdist(Vj(rng.random((3, 5))))).exp(),
        "vector_kernel": (-r2).exp() * (Vi(x) - Vj(y)),
        "two_points": (-r2 - Vi(x).sqdist(Vj(b[:, :1].repeat(3, 1)))).exp(),
    }[case]
    found = radial.analyze(K.formula)
    assert isinstance(found, radial.NotRadial)
    assert reason in found.reason


def test_smoothness_reads_the_parameters():
    # 1 / sqrt(t + c): analytic at 0 unless c = 0
    phi = radial.ops.apply("rsqrt", radial.ops.apply("add", radial.T, ir.var(0, 1, "p")))
    assert radial.smooth_at_zero(phi, {0: np.array([0.5])})
    assert not radial.smooth_at_zero(phi, {0: np.array([0.0])})


def test_gaussian_fourier_transform_matches_quadrature():
    # ∫ exp(-z²/h²) exp(-i ω z) dz on a fine grid, D = 1
    h, omega = 0.3, 7.0
    z = np.linspace(-5, 5, 200001)
    numeric = np.trapezoid(np.exp(-z ** 2 / h ** 2) * np.cos(omega * z), z)
    assert radial.gaussian_fourier(1.0, -1 / h ** 2, omega ** 2, 1) == pytest.approx(numeric,
                                                                                    rel=1e-9)


@pytest.mark.parametrize("name", ["gaussian", "laplacian", "cauchy"])
def test_gradient_forms(rng, name):
    x, y, b = _points(rng, 3)
    g = rng.random((len(x), 2))
    h = 0.7
    K, phi, _ = _formulas(x, y, b, h)[name]
    G = K.grad(Vi(x), g)
    found = radial.analyze_gradient(G.formula)
    assert isinstance(found, radial.RadialGradient), found.reason
    assert found.D == 3 and found.E == 2 and found.u.cat == "i"
    # ψ = 2 φ'(t): compare with a centered difference of φ(sqrt(t))
    t = rng.uniform(0.1, 2.0, 10)
    dt = 1e-6
    dphi = (phi(np.sqrt(t + dt)) - phi(np.sqrt(t - dt))) / (2 * dt)
    np.testing.assert_allclose(radial.profile_values(found.profile, t, _params(G)), 2 * dphi,
                               rtol=1e-6)
    # the y-gradient (a reduction over i) is the same form with i and j exchanged
    Gy = K.grad(Vj(y), rng.random((len(x), 2)))
    assert isinstance(radial.analyze_gradient(ir.swap_ij(Gy.formula)), radial.RadialGradient)


def test_not_gradient_forms(rng):
    x, y, b = _points(rng, 3)
    K = (-Vi(x).sqdist(Vj(y))).exp() * (Vi(x) - Vj(y))
    assert isinstance(radial.analyze_gradient(K.formula), radial.NotRadial)
    K = (-Vi(x).sqdist(Vj(y))).exp() * (Vi(x) * Vj(y))  # not a difference
    assert isinstance(radial.analyze_gradient(K.formula), radial.NotRadial)
