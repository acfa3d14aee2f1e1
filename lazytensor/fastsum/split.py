"""The near/far split of a kernel, and the window that makes a far kernel periodic.

Split (Ewald's idea, for kernels not smooth at 0): ``φ = φ (1 − m) + φ m`` with the mask

    m(t) = P(p + 1, t / σ²) = 1 − e^{−u} Σ_{k ≤ p} u^k / k!,   u = t / σ²,  t = |x − y|²,

the regularized lower incomplete gamma function: an entire function of t (so smooth in
x − y), ``m(t) = O(t^{p+1})`` at 0 and ``1 − m`` a Gaussian times a polynomial. The near
part ``φ (1 − m)`` is a formula of its own (:func:`near_formula`: the sum's formula times
``1 − m``, whose ``1/σ²`` is a parameter so that its kernel compiles once per p), summed
exactly over the pairs closer than the radius beyond which ``|φ| (1 − m)`` is below the
budget (:meth:`Mask.reach`); the far part ``φ m`` is smooth but for a residue of order
``r^{2p+3}`` of the kernel's own non-smoothness, so its Fourier coefficients decay fast.
With the same σ, a larger p pushes the near radius out and the far frequencies down.

Window: a far kernel is made periodic by the box window ``W(z) = Π_d w(z_d)``,
``w(u) = (erf(β_w (2(u + a)/δ + 1)) − erf(β_w (2(u − a)/δ − 1))) / 2``: within
``½ erfc(β_w)`` of 1 on ``|u| ≤ a`` and of 0 beyond ``a + δ``.

>>> import numpy as np
>>> m = Mask(sigma=0.1, p=3)
>>> [round(float(v), 6) for v in m.values(np.array([0.0, 0.01, 1.0]))]
[0.0, 0.018988, 1.0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import erf, erfc, gammainc, gammaincc

from ..codegen import ir, ops
from ..core.binding import Variable


@dataclass(frozen=True)
class Mask:
    """The mask ``m = P(p + 1, t / sigma²)``."""

    sigma: float
    p: int

    def values(self, t) -> np.ndarray:
        return gammainc(self.p + 1, np.asarray(t) / self.sigma ** 2)

    def near_values(self, t) -> np.ndarray:
        """``1 − m(t)``, without cancellation."""
        return gammaincc(self.p + 1, np.asarray(t) / self.sigma ** 2)

    def derivative(self, t) -> np.ndarray:
        """``dm/dt = u^p e^{−u} / (p! σ²)``."""
        u = np.asarray(t) / self.sigma ** 2
        return u ** self.p * np.exp(-u) / (math.factorial(self.p) * self.sigma ** 2)

    def reach(self, profile, budget: float, grad_budget: float | None = None) -> float:
        """The smallest sampled r beyond which ``|φ| (1 − m) ≤ budget`` (and the gradient
        of the near part, ``2r |φ' (1 − m) − φ m'|``, within ``grad_budget``)."""
        r = profile.r
        t = r * r
        q = self.near_values(t)
        with np.errstate(all="ignore"):
            near = np.abs(profile.phi(t)) * q
            ok = near <= budget
            if grad_budget is not None:
                g = 2 * r * np.abs(profile.dphi(t) * q - profile.phi(t) * self.derivative(t))
                ok &= g <= grad_budget
        ok = np.where(np.isfinite(near), ok, False)
        # the last sample that fails, and the next one
        bad = np.flatnonzero(~ok)
        if len(bad) == 0:
            return float(r[0])
        k = bad[-1] + 1
        return float(r[k]) if k < len(r) else float("inf")


def near_formula(formula: ir.Node, sqdist: ir.Node, n_variables: int, p: int) -> ir.Node:
    """``formula · e^{−v} Σ_{k ≤ p} v^k / k!`` (= ``formula · (1 − m)``), ``v = a t`` with
    ``a = 1/σ²`` the parameter of index ``n_variables`` (:func:`near_variables`)."""
    v = ops.apply("mul", ir.var(n_variables, 1, "p"), sqdist)
    poly = ir.const(1.0)
    for k in range(p, 0, -1):  # Horner: 1 + v (1 + v/2 (1 + v/3 (...)))
        poly = ops.apply("add", ir.const(1.0), ops.apply("mul", ops.apply(
            "mul", v, ir.const(1.0 / k)), poly))
    return ops.apply("mul", formula, ops.apply("mul", ops.apply("exp", ops.apply("neg", v)),
                                               poly))


def near_variables(mask: Mask) -> list:
    """The parameter of :func:`near_formula` for ``mask``."""
    return [Variable(1.0 / mask.sigma ** 2, "p", 1)]


@dataclass(frozen=True)
class Window:
    """The box window: 1 on ``|z_d| ≤ a_d``, 0 beyond ``a_d + delta_d`` (per dimension)."""

    a: tuple
    delta: tuple
    beta: float

    @property
    def leak(self) -> float:
        """How far from 1 (inside) or 0 (outside) one factor ``w`` may be."""
        return float(erfc(self.beta) / 2)

    def factor(self, u, d: int) -> np.ndarray:
        a, dl, b = self.a[d], self.delta[d], self.beta
        return 0.5 * (erf(b * (2 * (u + a) / dl + 1)) - erf(b * (2 * (u - a) / dl - 1)))

    def period(self, L) -> np.ndarray:
        """The smallest period per dimension that keeps every image of the windowed kernel
        off the differences ``|z_d| ≤ L_d`` and the kernel's support within one period."""
        a, dl = np.asarray(self.a), np.asarray(self.delta)
        return np.maximum(np.asarray(L) + a + dl, 2 * (a + dl))

    def image_bound(self, L, P) -> float:
        """``Π_d (1 + 2 Σ_k w(k P_d − L_d)) − 1``: the images' weight at a difference in the
        box (each image lies beyond ``a_d + δ_d`` in some dimension)."""
        total = 1.0
        for d in range(len(self.a)):
            side = sum(float(self.factor(k * P[d] - L[d], d)) for k in range(1, 4))
            total *= 1 + 2 * side
        return total - 1
