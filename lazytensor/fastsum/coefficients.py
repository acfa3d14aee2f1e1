"""Fourier coefficients of a periodized kernel, and how many of them a tolerance needs.

A kernel ``g`` of period ``P_d`` per dimension is ``Σ_m c_m exp(i ω_m · z)``,
``ω_m = 2π m / P``; keeping the modes ``|ω_{m,d}| ≤ ω_c`` (``K_d = 2⌊ω_c P_d / 2π⌋ + 1``
per dimension) errs by at most ``Σ_{m dropped} |c_m|`` at every z, and the gradient's
component d by ``Σ_{m dropped} |ω_{m,d} c_m|``: :func:`choose_cutoff` takes the smallest
``ω_c`` whose tails fit the budgets.

- :func:`gaussian`: ``A exp(α|z|²)`` periodized with ``P_d = L_d + R`` (its images lie
  beyond R, where they sum below the budget: a bound in closed form), coefficients
  ``A Π_d sqrt(π/−α)/P_d exp(ω_{m,d}² / 4α)``, analytic and separable.
- :func:`sampled`: any kernel given as a function of z on the grid of ``n_f`` points per
  dimension over one period, through the FFT; the coefficients beyond the grid's
  frequencies are estimated by the mass of its outermost shell (the grid is refined
  while that mass is not small against the budget).

>>> c = gaussian(1.0, -1 / 0.2 ** 2, np.array([1.0, 1.0]), 1e-7, 1e-7)
>>> c.modes, bool(c.truncation <= 1e-7), bool(c.images <= 1e-7)
((23, 23), True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MAX_GRID = 2 ** 24  # samples of a sampled kernel's octant (D = 3: 256³)
MAX_MODES = 2 ** 26  # points of the transforms' upsampled grid: 1 GB complex


@dataclass(eq=False)
class Coefficients:
    """``values`` (real, shape ``modes``, centered: index k is mode ``k - (K-1)/2``) of a
    kernel of period ``period``; ``truncation``/``grad_truncation`` (per d): the dropped
    modes' weight; ``images``: the bound on the periodization error (Gaussian); ``kind``:
    how they were computed."""

    period: np.ndarray
    modes: tuple
    values: np.ndarray
    truncation: float
    grad_truncation: np.ndarray
    images: float = 0.0
    kind: str = ""

    @property
    def abs_sum(self) -> float:
        return float(np.abs(self.values).sum())

    def omega(self, d: int) -> np.ndarray:
        K = self.modes[d]
        return 2 * np.pi * (np.arange(K) - (K - 1) // 2) / self.period[d]

    def grad_abs_sum(self, d: int) -> float:
        """``Σ |ω_{m,d} c_m|`` over the kept modes."""
        shape = [1] * len(self.modes)
        shape[d] = -1
        return float(np.abs(self.values * self.omega(d).reshape(shape)).sum())


def modes_for(cutoff: float, period) -> tuple:
    """``K_d = 2⌊ω_c P_d / 2π⌋ + 1``."""
    return tuple(int(2 * math.floor(cutoff * p / (2 * math.pi) + 1e-9) + 1) for p in period)


def gaussian(A: float, alpha: float, L, eta_images: float, eta_trunc: float,
             eta_grad: float | None = None) -> Coefficients:
    """Coefficients of ``A exp(α|z|²)`` for differences ``|z_d| ≤ L_d``: images below
    ``eta_images``, dropped modes below ``eta_trunc`` (and ``eta_grad`` for each gradient
    component when given)."""
    L = np.maximum(np.asarray(L, dtype=np.float64), 1e-12)
    D = len(L)
    R = math.sqrt(math.log(max(2 * D * abs(A) / eta_images, 2.0)) / -alpha)
    while True:
        P = L + R
        images = abs(A) * _gaussian_images(alpha, L, P, grad=eta_grad is not None)
        if images <= eta_images:
            break
        R *= 1.05
    c1, w1 = [], []
    for d in range(D):
        m = np.arange(-_gaussian_extent(alpha, P[d]), _gaussian_extent(alpha, P[d]) + 1)
        omega = 2 * np.pi * m / P[d]
        c1.append(math.sqrt(math.pi / -alpha) / P[d] * np.exp(omega ** 2 / (4 * alpha)))
        w1.append(omega)

    def tails(cutoff):
        keep = [np.abs(w) <= cutoff + 1e-12 for w in w1]
        full = [c.sum() for c in c1]
        kept = [c[k].sum() for c, k in zip(c1, keep)]
        value = abs(A) * (math.prod(full) - math.prod(kept))
        grad = []
        for d in range(D):
            g_full = (np.abs(w1[d]) * c1[d]).sum()
            g_kept = (np.abs(w1[d][keep[d]]) * c1[d][keep[d]]).sum()
            rest_full = math.prod(full[:d] + full[d + 1:])
            rest_kept = math.prod(kept[:d] + kept[d + 1:])
            grad.append(abs(A) * (g_full * rest_full - g_kept * rest_kept))
        return value, np.array(grad)

    candidates = np.unique(np.concatenate([np.abs(w) for w in w1]))
    cutoff = choose_cutoff(candidates, tails, eta_trunc, eta_grad)
    value, grad = tails(cutoff)
    modes = modes_for(cutoff, P)
    parts = [c[np.abs(w) <= cutoff + 1e-12] for c, w in zip(c1, w1)]
    values = A * _outer(parts)
    assert values.shape == modes, (values.shape, modes)
    return Coefficients(P, modes, values, max(value, 0.0), np.maximum(grad, 0.0), images,
                        "Gaussian, analytic")


def _gaussian_extent(alpha: float, P: float) -> int:
    """The largest |m| whose coefficient is above 1e-300 of the first one."""
    return int(math.ceil(P / (2 * math.pi) * math.sqrt(-4 * alpha * 690.0))) + 1


def _gaussian_images(alpha: float, L, P, grad: bool) -> float:
    """``Π_d (1 + τ_d) − 1`` with ``τ_d = 2 Σ_k exp(α (k P_d − L_d)²)`` (times ``2|α| (P + L)``
    for the gradient's images, which carry the factor ``2|α| |z_d + n P_d|``)."""
    total = 1.0
    for Ld, Pd in zip(L, P):
        k = np.arange(1, 6)
        total *= 1 + 2 * float(np.exp(alpha * (k * Pd - Ld) ** 2).sum())
    bound = total - 1
    if grad:
        bound *= max(1.0, 2 * -alpha * float(np.max(P + L)) * 2)
    return bound


def _outer(parts):
    out = parts[0]
    for p in parts[1:]:
        out = np.multiply.outer(out, p)
    return out


def choose_cutoff(candidates, tails, eta_trunc, eta_grad=None) -> float:
    """The smallest of the sorted ``candidates`` whose ``tails(cutoff) = (value, grad)``
    fit ``eta_trunc`` (and ``eta_grad``, per component); bisection on the monotone tails."""
    def fits(c):
        value, grad = tails(c)
        return value <= eta_trunc and (eta_grad is None or bool(np.all(grad <= eta_grad)))

    lo, hi = 0, len(candidates) - 1
    if not fits(candidates[hi]):
        raise ValueError("the kernel's Fourier coefficients do not fall below the budget on "
                         "this grid")
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(candidates[mid]):
            hi = mid
        else:
            lo = mid + 1
    return float(candidates[lo])


def sampled(kernel, period, n_f: int, eta_trunc: float, eta_grad: float | None = None,
            kind: str = "sampled") -> Coefficients | None:
    """Coefficients of an even kernel (even in each coordinate) of period ``period``, from
    its samples on ``n_f`` points per dimension: ``kernel(z_0, ..., z_{D-1})`` is called on
    the grid of one octant, ``0 ≤ z_d ≤ P_d / 2`` (``n_f/2 + 1`` points each), and a
    DCT-I gives the coefficients (the FFT of the whole period, 2^D times cheaper). None
    when the grid is too coarse: its outermost shell holds more than a tenth of the
    budget."""
    from scipy import fft

    P = np.asarray(period, dtype=np.float64)
    D = len(P)
    half = n_f // 2
    axes = [np.arange(half + 1) * (P[d] / n_f) for d in range(D)]
    g = kernel(*np.meshgrid(*axes, indexing="ij", sparse=True))
    c = fft.dctn(np.broadcast_to(g, (half + 1,) * D), type=1, workers=-1) / n_f ** D
    del g
    k = np.arange(half + 1)
    omega = [2 * np.pi * k / P[d] for d in range(D)]
    # each octant mode stands for 2^(its nonzero indices) modes; the Nyquist index, alone
    mult1 = np.where((k == 0) | (k == half), 1.0, 2.0)
    candidates = np.unique(np.concatenate(omega))
    level, mult = None, None
    for d in range(D):
        shape = [1] * D
        shape[d] = -1
        lev_d = np.searchsorted(candidates, omega[d] - 1e-12).astype(np.int32).reshape(shape)
        level = lev_d if level is None else np.maximum(level, lev_d)
        mult = mult1.reshape(shape) if mult is None else mult * mult1.reshape(shape)
    level = np.broadcast_to(level, c.shape).ravel()
    weight = np.abs(c) * mult
    nlev = len(candidates)
    mass = np.bincount(level, weights=weight.ravel(), minlength=nlev)
    gmass = []
    for d in range(D):
        shape = [1] * D
        shape[d] = -1
        gmass.append(np.bincount(level, weights=(weight * omega[d].reshape(shape)).ravel(),
                                 minlength=nlev))
    # the outermost shell: frequencies above 90% of the grid's largest
    outer = candidates >= 0.9 * np.pi * n_f / P.max()
    if mass[outer].sum() > 0.1 * eta_trunc or (
            eta_grad is not None and any(gm[outer].sum() > 0.1 * eta_grad for gm in gmass)):
        return None
    tail_mass = np.cumsum(mass[::-1])[::-1]
    tail_g = [np.cumsum(gm[::-1])[::-1] for gm in gmass]

    def tails(cutoff):
        j = int(np.searchsorted(candidates, cutoff + 1e-12, side="right"))
        if j >= nlev:
            return 0.0, np.zeros(D)
        return float(tail_mass[j]), np.array([float(t[j]) for t in tail_g])

    cutoff = choose_cutoff(candidates[~outer], tails, eta_trunc, eta_grad)
    value, grad = tails(cutoff)
    modes = modes_for(cutoff, P)
    # the kept block, mirrored: index j of a K-mode axis is mode j - (K - 1)/2
    index = [np.abs(np.arange(K) - (K - 1) // 2) for K in modes]
    values = np.ascontiguousarray(c[np.ix_(*index)])
    # the outer shell's mass twice: once dropped, once aliased onto the kept modes
    alias = 2 * mass[outer].sum()
    grad = grad + 2 * np.array([gm[outer].sum() for gm in gmass])
    return Coefficients(P, modes, values, value + alias, grad, 0.0,
                        f"{kind}, DCT of {half + 1}^{D} samples")


def grid_size(cutoff: float, period, D: int) -> int | None:
    """An even FFT-friendly ``n_f`` whose grid reaches 1.5 × ``cutoff`` in every dimension,
    or None beyond :data:`MAX_GRID` samples."""
    need = 2 * int(math.ceil(1.5 * cutoff * float(np.max(period)) / (2 * math.pi))) + 8
    n = _nice(max(need, 16))
    if (n // 2 + 1) ** D > MAX_GRID or math.prod(
            math.ceil(1.25 * k) for k in modes_for(cutoff, period)) > MAX_MODES:
        return None
    return n


def _nice(n: int) -> int:
    """The smallest 2^a 3^b 5^c >= n, even."""
    best = 1 << (n - 1).bit_length()
    p3 = 1
    while p3 < 2 * n:
        p5 = p3
        while p5 < 2 * n:
            k = p5
            while k < n:
                k *= 2
            if k % 2 == 0 and k < best:
                best = k
            p5 *= 5
        p3 *= 3
    return best
