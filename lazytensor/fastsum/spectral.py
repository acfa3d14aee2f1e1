"""The spectral method: ``s_i = Σ_m c_m e^{iω_m·x_i} Σ_j w_j e^{−iω_m·y_j}`` by two NUFFTs.

A :class:`FarField` holds the Fourier coefficients ``c_m`` of a periodized kernel
(:mod:`.coefficients`), finufft's precision ``eps`` and the error bound per pair and unit
weight, the sum of three terms:

- periodization: the Gaussian's images (closed form), or for a sampled kernel the box
  window's deviation from 1 on the differences, its images and the kernel's tail beyond
  the window (:class:`lazytensor.fastsum.split.Window`);
- truncation: the weight of the dropped modes, ``Σ_{m dropped} |c_m|`` (with the aliased
  outer shell of a sampled grid);
- transforms: ``C_NUFFT · 2 · eps · Σ_m |c_m|``: a type-1 NUFFT errs by at most
  ``C_NUFFT · eps · Σ_j |w_j|`` on each mode and a type-2 by ``C_NUFFT · eps · Σ_m |G_m|``
  at each point; :data:`C_NUFFT` is the largest ratio of finufft's error per unit
  strength to its ``eps`` we measured (single sources and single modes, D = 1 and 3,
  eps from 1e-3 to 1e-12: at most 14).

The gradient with respect to the targets is the same transform of ``i ω_{m,d} c_m``
(derivative in Fourier space), bounded the same way with ``|ω_{m,d} c_m|``.

>>> import numpy as np
>>> from lazytensor.fastsum import coefficients
>>> rng = np.random.default_rng(0); x, y, w = rng.random((50, 2)), rng.random((60, 2)), rng.random((60, 1))
>>> c = coefficients.gaussian(1.0, -25.0, np.ones(2), 1e-9, 1e-9)
>>> far = FarField(c, 1e-10, np.full(2, 0.5), 0.0)
>>> exact = np.exp(-25 * ((x[:, None] - y[None]) ** 2).sum(-1)) @ w
>>> bool(np.abs(apply(far, x, y, w) - exact).max() < 1e-8)
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import coefficients
from .split import Mask, Window

C_NUFFT = 20.0
MIN_EPS = 1e-14  # finufft's double precision floor (it refuses below 1e-15)
UPSAMPLING = (2.0, 1.25)  # finufft's grids: 2 K_d (narrower spreading) or 1.25 K_d points


@dataclass(eq=False)
class FarField:
    """Coefficients, the transforms' ``eps``, the box's ``center``, the error bound per
    pair and unit weight of the value (``bound``) and of each gradient component
    (``grad_bound``, None when no gradient was asked)."""

    coef: coefficients.Coefficients
    eps: float
    center: np.ndarray
    bound: float
    grad_bound: np.ndarray | None = None
    terms: dict | None = None
    upsampfac: float = 2.0

    def describe(self) -> dict:
        c = self.coef
        return {"modes": c.modes, "period": tuple(round(float(p), 4) for p in c.period),
                "eps": float(f"{self.eps:.3g}"), "upsampfac": self.upsampfac,
                "coefficients": c.kind}

    def pick_upsampling(self, N: int, M: int, E: int, grad: bool) -> FarField:
        """The cheaper of finufft's two grids for these sizes (the one that fits)."""
        self.upsampfac = best_upsampling(N, M, E, self.coef.modes, self.eps, grad)[1]
        return self


def choose_eps(coef: coefficients.Coefficients, budget: float, grad_budget=None) -> float:
    """The largest finufft ``eps`` whose error ``C_NUFFT · 2 · eps · Σ|c|`` fits ``budget``
    (and the gradients' ``Σ |ω_d c|`` in ``grad_budget``)."""
    eps = budget / (2 * C_NUFFT * max(coef.abs_sum, 1e-300))
    if grad_budget is not None:
        for d in range(len(coef.modes)):
            eps = min(eps, grad_budget / (2 * C_NUFFT * max(coef.grad_abs_sum(d), 1e-300)))
    return min(eps, 1e-2)


def gaussian_far(L, center, A: float, alpha: float, eta: float, eta_grad=None) -> FarField:
    """The Gaussian ``A exp(α t)`` to ``eta`` per pair (images 5%, modes 10%, transforms
    80% of it), and its gradient to ``eta_grad`` when given."""
    g = None if eta_grad is None else 0.1 * eta_grad
    coef = coefficients.gaussian(A, alpha, L, 0.05 * min(eta, eta_grad or eta), 0.1 * eta, g)
    eps = choose_eps(coef, 0.8 * eta, None if eta_grad is None else 0.8 * eta_grad)
    return _finish(coef, eps, center, coef.images, 0.0, eta_grad is not None)


def _finish(coef, eps, center, periodic: float, periodic_grad: float, grad: bool) -> FarField:
    transforms = 2 * C_NUFFT * eps * coef.abs_sum
    bound = periodic + coef.truncation + transforms
    grad_bound = None
    if grad:
        grad_bound = np.array([periodic_grad + coef.grad_truncation[d]
                               + 2 * C_NUFFT * eps * coef.grad_abs_sum(d)
                               for d in range(len(coef.modes))])
    terms = {"periodization": periodic, "truncation": coef.truncation, "transforms": transforms}
    return FarField(coef, eps, np.asarray(center, dtype=np.float64), bound, grad_bound, terms)


class SampledKernel:
    """``φ(t) m(t) W(z)``: a profile (times a mask for a split), windowed, as
    :func:`lazytensor.fastsum.coefficients.sampled` samples it."""

    def __init__(self, profile, mask: Mask | None, window: Window):
        self.profile, self.mask, self.window = profile, mask, window

    def radial(self, t) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        v = self.profile.phi(t)
        if self.mask is not None:
            with np.errstate(all="ignore"):
                v = v * self.mask.values(t)
            v = np.where(t == 0, 0.0, v)  # m(0) = 0 where φ(0) is not finite
        return v

    def __call__(self, *z):
        t = sum(zd * zd for zd in z)
        out = self.radial(t.ravel()).reshape(t.shape)
        for d, zd in enumerate(z):
            out = out * self.window.factor(zd, d)
        return out


def sampled_far(profile, L, center, eta: float, eta_grad=None, mask: Mask | None = None,
                share: float = 0.8) -> FarField | None:
    """A sampled kernel's far field (``φ m`` for a split, else ``φ``) to ``eta`` per pair:
    window 5%, modes 10%, transforms ``share``; None when its grid would exceed
    :data:`lazytensor.fastsum.coefficients.MAX_GRID`."""
    setup = window_for(profile, L, eta, mask)
    if setup is None:
        return None
    kernel, P, cutoff, periodic = setup
    D = len(L)
    n_f = coefficients.grid_size(cutoff, P, D)
    g = None if eta_grad is None else 0.1 * eta_grad
    while n_f is not None:
        coef = coefficients.sampled(kernel, P, n_f, 0.1 * eta, g,
                                    "split far field" if mask is not None else "sampled")
        if coef is not None:
            break
        n_f = coefficients._nice(int(n_f * 1.5))
        n_f = n_f if (n_f // 2 + 1) ** D <= coefficients.MAX_GRID else None
    if n_f is None:
        return None
    eps = choose_eps(coef, share * eta, None if eta_grad is None else share * eta_grad)
    w = kernel.window
    periodic_grad = periodic * 4 * w.beta / min(w.delta)
    return _finish(coef, eps, center, periodic, periodic_grad, eta_grad is not None)


def window_for(profile, L, eta: float, mask: Mask | None):
    """``(kernel, period, estimated cutoff frequency, periodization bound)`` of the best
    window for this far kernel (its width δ among four, by the estimated number of
    modes), or None if none fits."""
    L = np.maximum(np.asarray(L, dtype=np.float64), 1e-9 * max(float(np.max(L)), 1e-300))
    D = len(L)
    probe = SampledKernel(profile, mask, Window((1.0,) * D, (1.0,) * D, 1.0))
    r = profile.r
    far = np.abs(probe.radial(r * r))
    far = far[np.isfinite(far)]
    sup = float(far.max()) if far.size else 0.0
    if not sup > 0:
        return None
    reach = profile.radius(0.02 * eta)
    a = tuple(float(min(Ld, reach)) for Ld in L)
    leak = 0.03 * eta / (3 * D * sup)
    from scipy.special import erfcinv

    beta = float(erfcinv(min(2 * leak, 1.0)))
    tail = profile.tail(min(a)) if min(a) < float(np.min(L)) else 0.0
    best = None
    for f in (0.25, 0.5, 1.0, 2.0):
        delta = tuple(f * max(a) for _ in range(D))
        window = Window(a, delta, beta)
        P = window.period(L)
        kernel = SampledKernel(profile, mask, window)
        cutoff = _cutoff_1d(kernel, float(P.max()), 0.1 * 0.1 * eta / D)
        if cutoff is None:
            continue
        modes = math.prod(coefficients.modes_for(cutoff, P))
        periodic = sup * (D * window.leak + window.image_bound(L, P)) + tail
        if best is None or modes < best[0]:
            best = (modes, (kernel, P, cutoff, periodic))
    return None if best is None else best[1]


def _cutoff_1d(kernel: SampledKernel, P: float, eta: float) -> float | None:
    """The frequency beyond which the kernel's 1D section ``g(u, 0, ...)`` has less than
    ``eta`` of Fourier mass (its series of period P), from a fine grid."""
    n = 1 << 14
    while n <= 1 << 21:
        u = (np.arange(n) - n // 2) * (P / n)
        f = kernel.radial(u * u) * kernel.window.factor(u, 0)
        c = np.abs(np.fft.rfft(np.fft.ifftshift(f))) / n
        c[1:] *= 2
        tail = np.cumsum(c[::-1])[::-1]
        if tail[int(0.9 * len(c))] <= 0.1 * eta:
            k = int(np.argmax(tail <= eta))
            return 2 * np.pi * max(k, 1) / P
        n <<= 2
    return None


def _finufft():
    try:
        import finufft
    except ImportError as e:
        raise ImportError("the spectral method needs finufft (pip install "
                          "'lazytensor-kernels[fast]')") from e
    return finufft


SMALL_TRANSFORM = 2e7  # points × w^D below which one thread is faster than OpenMP's team


def _threads(far: FarField, n_points: int) -> dict:
    """One thread for small transforms (a team's start and barriers cost more than they
    save, the more so on a loaded machine), finufft's default otherwise."""
    w = spread_width(far.eps, far.upsampfac)
    return {"nthreads": 1} if n_points * w ** len(far.coef.modes) < SMALL_TRANSFORM else {}


def _scaled(points: np.ndarray, far: FarField) -> list:
    s = 2 * np.pi / far.coef.period
    return [np.ascontiguousarray((points[:, d] - far.center[d]) * s[d]) for d in
            range(points.shape[1])]


def _type1(far: FarField, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    D = y.shape[1]
    f = getattr(_finufft(), f"nufft{D}d1")
    c = np.ascontiguousarray(w.T, dtype=np.complex128)
    return f(*_scaled(y, far), c, far.coef.modes, eps=max(far.eps, MIN_EPS), isign=-1,
             upsampfac=far.upsampfac, **_threads(far, len(y) * c.shape[0]))


def _type2(far: FarField, x: np.ndarray, modes: np.ndarray) -> np.ndarray:
    D = x.shape[1]
    f = getattr(_finufft(), f"nufft{D}d2")
    return f(*_scaled(x, far), np.ascontiguousarray(modes), eps=max(far.eps, MIN_EPS), isign=1,
             upsampfac=far.upsampfac, **_threads(far, len(x) * modes.shape[0]))


def apply(far: FarField, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``Σ_j g̃(x_i − y_j) w_j`` (N, E) for float64 points x (N, D), y (M, D), weights (M, E)."""
    F = _type1(far, y, w)  # (E, *modes)
    out = _type2(far, x, F * far.coef.values)
    return np.ascontiguousarray(out.real.reshape(w.shape[1], -1).T)


def apply_gradient(far: FarField, x, y, w, g) -> np.ndarray:
    """``Σ_e g_ie Σ_j ∇g̃(x_i − y_j) w_je`` (N, D): the gradient in the targets of
    ``⟨g, s⟩``, each component by the transform of ``i ω_{m,d} c_m``."""
    D, E = x.shape[1], w.shape[1]
    F = _type1(far, y, w) * far.coef.values
    F = F.reshape(E, *far.coef.modes)
    stack = []
    for d in range(D):
        shape = [1] * (D + 1)
        shape[d + 1] = -1
        stack.append(1j * far.coef.omega(d).reshape(shape) * F)
    out = _type2(far, x, np.concatenate(stack, 0)).real.reshape(D, E, -1)
    return np.einsum("den,ne->nd", out, np.asarray(g, dtype=np.float64))


def spread_width(eps: float, upsampfac: float) -> int:
    """finufft's kernel width: ``⌈ln(10/eps) / (π sqrt(1 − 1/σ))⌉``, at most 16."""
    return min(16, math.ceil(math.log(10 / max(eps, MIN_EPS))
                             / (math.pi * math.sqrt(1 - 1 / upsampfac))))


def best_upsampling(N, M, E, modes, eps, grad=False) -> tuple:
    """``(seconds, upsampfac)``: the cheaper grid whose points fit
    :data:`lazytensor.fastsum.coefficients.MAX_MODES` (1.25 only for eps ≥ 1e-9, where
    its widths suffice); ``(inf, 2.0)`` when neither fits."""
    best = (float("inf"), 2.0)
    for up in UPSAMPLING:
        if up < 2 and eps < 1e-9:
            continue
        if math.prod(math.ceil(up * k) for k in modes) > coefficients.MAX_MODES:
            continue
        best = min(best, (transform_cost(N, M, E, modes, eps, grad, up), up))
    return best


def transform_cost(N: int, M: int, E: int, modes: tuple, eps: float, grad: bool = False,
                   upsampfac: float = 2.0) -> float:
    """Seconds of the two transforms (three kinds of terms: each point's setup; its
    spreading/interpolation over ``w^D`` grid points (:func:`spread_width`); the FFTs of
    the upsampled grid), on this machine's scale (:mod:`.costs`)."""
    from .costs import FFT_S, NUFFT_POINT_S, SPREAD_S

    D = len(modes)
    w = spread_width(eps, upsampfac)
    grid = math.prod(math.ceil(upsampfac * k) for k in modes)
    transforms = E * (1 + (D if grad else 0))
    points = (M + N) * NUFFT_POINT_S * (2 if grad else 1)
    spread = (M * E + N * transforms) * w ** D * SPREAD_S
    fft = (E + transforms) * grid * math.log2(max(grid, 2)) * FFT_S
    return points + spread + fft
