"""The numbers of a radial kernel on the distances a problem spans.

A :class:`Profile` samples ``|φ(r²)|`` and ``|∂K/∂x_d| ≤ 2 r |φ'(r²)|`` on ``0 ≤ r ≤ R``
(R: the diameter of the points' box) at 4,353 distances (uniform, and geometric towards
0), and reads from them ``sup|K|``, ``sup|∇K|``, whether the kernel is bounded near 0, and
the tail envelope ``sup_{r' ≥ r} |φ(r'²)|``, from which the truncation and split radii
follow. Smoothness at 0 and the Gaussian form come from the IR
(:mod:`lazytensor.codegen.radial`).

>>> from lazytensor.codegen import ops, radial
>>> phi = ops.apply("exp", ops.apply("neg", radial.T))        # exp(-r²)
>>> p = Profile(phi, {}, diameter=4.0)
>>> (p.smooth, p.bounded, round(p.sup, 6), p.gaussian)
(True, True, 1.0, (1.0, -1.0))
>>> round(p.radius(1e-6), 3)                                 # exp(-r²) < 1e-6 beyond 3.717
3.718
"""

from __future__ import annotations

import functools

import numpy as np

from ..codegen import radial


class Profile:
    """A radial kernel's profile ``φ`` (IR in ``radial.T``) with its parameters' values."""

    def __init__(self, profile, params: dict, diameter: float):
        self.ir, self.params = profile, params
        self.diameter = max(float(diameter), 1e-300)
        self.smooth = radial.smooth_at_zero(profile, params)
        self.gaussian = radial.gaussian(profile, params)
        R = self.diameter
        self.r = np.unique(np.concatenate([np.geomspace(1e-9 * R, 1e-2 * R, 256),
                                           np.linspace(0.0, R, 4097)]))
        values = np.abs(self.phi(self.r ** 2))
        self.finite = bool(np.isfinite(values[1:]).all())
        values = np.where(np.isfinite(values), values, np.inf)
        near0 = values[1:40]  # r from 1e-9 R to about 1e-6 R
        self.bounded = bool(np.isfinite(values[1:]).all() and near0.max() <= 2 * near0[-1] + 1e-300)
        self.sup = float(values[1:].max()) if self.bounded else float("inf")
        if self.bounded and np.isfinite(values[0]):
            self.sup = max(self.sup, float(values[0]))
        self._tail = np.maximum.accumulate(values[::-1])[::-1]

    def phi(self, t) -> np.ndarray:
        """``φ(t)`` on an array of squared distances."""
        return radial.profile_values(self.ir, t, self.params)

    @functools.cached_property
    def _dphi_ir(self):
        return radial.derivative(self.ir)

    def dphi(self, t) -> np.ndarray:
        """``φ'(t)``."""
        return radial.profile_values(self._dphi_ir, t, self.params)

    @functools.cached_property
    def _grad_values(self) -> np.ndarray:
        g = np.abs(2 * self.r * self.dphi(self.r ** 2))
        return np.where(np.isfinite(g), g, np.inf)

    @property
    def grad_sup(self) -> float:
        """``sup |∂K/∂x_d|`` over the box (``2 r |φ'(r²)|`` along an axis; inf if unbounded)."""
        g = self._grad_values[1:]
        near0 = g[:39]
        if not np.isfinite(g).all() or near0.max() > 2 * near0[-1] + 1e-300:
            return float("inf")
        return float(g.max())

    def tail(self, r: float) -> float:
        """``sup |φ(r'²)|`` over ``r ≤ r' ≤`` the diameter (0 beyond it)."""
        if r > self.diameter:
            return 0.0
        k = max(int(np.searchsorted(self.r, r, side="right")) - 1, 0)
        return float(self._tail[k])

    def radius(self, eta: float) -> float:
        """The smallest sampled r beyond which ``|φ| ≤ eta`` up to the diameter; past the
        diameter (``> diameter``) when the kernel does not fall below ``eta`` in the box."""
        below = self._tail <= eta
        if not below.any():
            return float("inf") if self.diameter <= 0 else self.diameter * 1.0000001
        k = int(np.argmax(below))
        return float(self.r[k]) if k == 0 else float(self.r[k])
