"""The cost model: which method evaluates a sum to its tolerance the fastest.

:func:`choose` estimates the seconds of every method that applies (:mod:`.costs` holds the
machine's constants) and takes the cheapest; the estimate reads N, M, E, D, the kernel's
decay (the truncation radius), smoothness at 0 (spectral or split), the box and the
points' spread (pairs per cell, counted on a subsample of the targets), and tol. It is
deterministic: the same inputs give the same choice. Exact is the choice when the
formula does not qualify (the reason is kept), when D > 3, and whenever N·M is small
enough that nothing else can win.

A :class:`Choice` says the method, its parameters, its bound (per pair and unit weight,
and relative to ``sup|K|``: the tolerance it guarantees) and the estimates of the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..codegen import ir
from . import costs, near, spectral
from .split import Mask, near_formula

SMALL_S = 0.05  # an exact sum estimated below this is not worth planning anything else


@dataclass(eq=False)
class Choice:
    """``method`` ("exact", "truncation", "spectral", "split"), its ``params``, ``bound``:
    the guaranteed error per pair and unit weight (``guarantee``: the same over
    ``sup|K|``, or the relative ℓ2 error for a kernel unbounded at 0), ``estimates``:
    seconds per method, ``reason``: why exact, or what decided."""

    method: str
    params: dict = field(default_factory=dict)
    bound: float = 0.0
    guarantee: str = "exact"
    estimates: dict = field(default_factory=dict)
    reason: str = ""
    plan: object = None  # what execution needs (cells, far field, mask)

    def __str__(self) -> str:
        est = ", ".join(f"{k} {_seconds(v)}" for k, v in self.estimates.items())
        params = ", ".join(f"{k}={v}" for k, v in self.params.items())
        text = f"{self.method}" + (f" ({params})" if params else "")
        text += f"; bound: {self.guarantee}"
        if est:
            text += f"; estimated: {est}"
        if self.reason:
            text += f"; {self.reason}"
        return text


def _seconds(s: float) -> str:
    return "-" if not math.isfinite(s) else f"{s:.3g} s"


# ops whose cost per pair is a few multiplications' (the rest count one per component)
_HEAVY = frozenset("exp log sqrt rsqrt div inv pow powf erf erfc sin cos tanh atan".split())
_GAUSSIAN_UNITS = 17.0  # exp(-|x - y|² / h²) b_j in D = 3, the calibration's formula


def formula_units(formula) -> float:
    """The work per pair of a formula relative to the calibration's Gaussian."""
    units = sum((4 if n.op in _HEAVY else 1) * n.dim for n in ir.topo_order(formula)
                if n.op not in ("var", "const"))
    return max(units / _GAUSSIAN_UNITS, 0.5)


def exact_cost(N: int, M: int, E: int, dtype: str, units: float = 1.0) -> float:
    return N * M * costs.PAIR_S.get(dtype, costs.PAIR_S["float64"]) * units


def _pairs(problem, radius: float, k: int):
    """Pairs and work items of the cells of side radius/k, counted between at most 5,000
    targets and 50,000 sources (every n-th point: deterministic), scaled."""
    x, y = problem.x, problem.y
    xs, ys = x[::max(1, len(x) // 5000)], y[::max(1, len(y) // 50000)]
    pairs, items = near.count_pairs(xs, ys, problem.lo, radius, k)
    return pairs * (len(x) / len(xs)) * (len(y) / len(ys)), items * len(x) / len(xs)


def near_cost(problem, radius: float, units: float):
    """``(seconds, k)`` of the pairs closer than ``radius`` (cells of side radius / k) for
    a formula of ``units`` (:func:`formula_units`)."""
    if not radius < problem.diameter:
        return float("inf"), 1
    best = (float("inf"), 1)
    for k in (1, 2):
        pairs, items = _pairs(problem, radius, k)
        s = (pairs * costs.RANGED_PAIR_S * units + items * costs.BLOCK_S
             + (problem.N + problem.M) * costs.SORT_S)
        best = min(best, (s, k))
    return best


def truncation(problem, prof, eta, eta_grad):
    """The truncation radius (tail below 90% of the budget), its cost and bound."""
    radius = prof.radius(0.9 * eta)
    if eta_grad is not None:
        g = prof._grad_values
        env = np.maximum.accumulate(g[::-1])[::-1]
        ok = env <= 0.9 * eta_grad
        radius = max(radius, float(prof.r[int(np.argmax(ok))]) if ok.any() else float("inf"))
    seconds, k = near_cost(problem, radius, formula_units(problem.formula))
    return seconds + costs.CALL_S, {"radius": float(f"{radius:.4g}"), "cells": f"radius/{k}"}, \
        prof.tail(radius), (radius, k)


def spectral_cost(problem, prof, eta, eta_grad):
    """The spectral method for a kernel smooth and bounded at 0 (None otherwise)."""
    if not (prof.smooth and prof.bounded):
        return None
    L, center = problem.hi - problem.lo, (problem.hi + problem.lo) / 2
    if prof.gaussian is not None:
        far = spectral.gaussian_far(L, center, *prof.gaussian, eta, eta_grad)
        seconds, far.upsampfac = spectral.best_upsampling(
            problem.N, problem.M, problem.E, far.coef.modes, far.eps, eta_grad is not None)
        return seconds + costs.CALL_S, far.describe(), far.bound, far
    setup = spectral.window_for(prof, L, eta, None)
    if setup is None:
        return None
    return _sampled_estimate(problem, setup, eta, eta_grad, 0.8, None)


def _sampled_estimate(problem, setup, eta, eta_grad, share, mask):
    from .coefficients import grid_size, modes_for

    kernel, P, cutoff, periodic = setup
    n_f = grid_size(cutoff, P, problem.D)
    if n_f is None:
        return None
    modes = modes_for(cutoff, P)
    eps = share * eta / (2 * spectral.C_NUFFT * 2 * max(prof_sup(kernel), 1e-300))
    seconds, up = spectral.best_upsampling(problem.N, problem.M, problem.E, modes, eps,
                                           eta_grad is not None)
    seconds += (n_f // 2 + 1) ** problem.D * costs.SAMPLE_S + costs.CALL_S
    return seconds, {"modes": modes, "eps": float(f"{eps:.3g}"), "upsampfac": up}, eta, \
        ("sampled", mask)


def prof_sup(kernel) -> float:
    r = kernel.profile.r
    v = np.abs(kernel.radial(r * r))
    v = v[np.isfinite(v)]
    return float(v.max()) if v.size else 0.0


def split_cost(problem, prof, eta, eta_grad, tol, beat=float("inf")):
    """The best near/far split over a few mask widths σ (None if none fits, or none
    is estimated below ``beat``): the far field's estimate first, the near pairs counted
    only for the widths whose far field alone is below the best so far."""
    p = 4 if tol >= 1e-5 else 6  # (one near kernel per formula and tolerance class)
    L = problem.hi - problem.lo
    best = None
    for k in range(6, 23):  # σ from diam / 8 to diam / 2048, by factors of √2
        sigma = problem.diameter / 2 ** (k / 2)
        mask = Mask(sigma, p)
        radius = mask.reach(prof, 0.05 * eta, None if eta_grad is None else 0.05 * eta_grad)
        if not radius < problem.diameter:
            continue
        setup = spectral.window_for(prof, L, eta, mask)
        if setup is None:
            continue
        far = _sampled_estimate(problem, setup, eta, eta_grad, 0.75, mask)
        if far is None or far[0] >= min(beat, best[0] if best else beat):
            continue
        units = formula_units(near_formula(problem.formula, problem.kernel.sqdist,
                                           len(problem.variables), p))
        near_s, cells_k = near_cost(problem, radius, units)
        seconds = near_s + far[0]
        if best is None or seconds < best[0]:
            params = {"sigma": float(f"{sigma:.4g}"), "p": p, "radius": float(f"{radius:.4g}"),
                      **far[1]}
            best = (seconds, params, eta, (mask, radius, cells_k))
    return best


def choose(problem, prof, tol: float, eta: float, eta_grad, guarantee: str,
           spectral_ok: bool = True, force: str | None = None) -> Choice:
    """The cheapest method for ``problem`` to ``eta`` per pair (``eta_grad`` for the
    gradients when asked); without finufft (``spectral_ok`` False), exact or truncation;
    ``force``: that method, or ValueError if it does not apply."""
    est = {"exact": exact_cost(problem.N, problem.M, problem.E, problem.dtype,
                               formula_units(problem.formula))}
    if force is not None:
        return _forced(problem, prof, tol, eta, eta_grad, guarantee, spectral_ok, force, est)
    if est["exact"] < SMALL_S:
        return Choice("exact", estimates=est, guarantee="exact",
                      reason=f"N·M = {problem.N * problem.M:.3g} pairs: brute force is fastest")
    options = {}
    t = truncation(problem, prof, eta, eta_grad)
    est["truncation"] = t[0]
    options["truncation"] = t
    s = spectral_cost(problem, prof, eta, eta_grad) if spectral_ok else None
    est["spectral"] = s[0] if s else float("inf")
    if s:
        options["spectral"] = s
    # a kernel smooth at 0 needs no split unless its spectrum is too wide for one grid
    wanted = spectral_ok and (not (prof.smooth and prof.bounded) or s is None)
    sp = split_cost(problem, prof, eta, eta_grad, tol, min(est.values())) if wanted else None
    est["split"] = sp[0] if sp else float("inf")
    if sp:
        options["split"] = sp
    method = min(est, key=lambda k: (est[k], k != "exact"))
    if method == "exact":
        return Choice("exact", estimates=est, guarantee="exact",
                      reason="no method is estimated faster than brute force")
    seconds, params, bound, plan = options[method]
    return Choice(method, params, bound, guarantee, est, "", plan)


def _forced(problem, prof, tol, eta, eta_grad, guarantee, spectral_ok, force, est) -> Choice:
    if force == "exact":
        return Choice("exact", estimates=est, reason="method='exact' was asked")
    if force != "truncation" and not spectral_ok:
        raise ValueError(f"method={force!r} needs finufft (pip install 'lazytensor-kernels[fast]')")
    found = {"truncation": lambda: truncation(problem, prof, eta, eta_grad),
             "spectral": lambda: spectral_cost(problem, prof, eta, eta_grad),
             "split": lambda: split_cost(problem, prof, eta, eta_grad, tol)}[force]()
    if found is None or not np.isfinite(found[0]):
        raise ValueError(f"method={force!r} does not apply to this sum (the spectral method "
                         "needs a kernel smooth and bounded at 0; truncation, a kernel that "
                         "falls below the budget within the points' box)")
    seconds, params, bound, plan = found
    est[force] = seconds
    return Choice(force, params, bound, guarantee, est, f"method={force!r} was asked", plan)
