"""A Sum to a tolerance: bind, budget, choose, run; and :func:`explain`.

The budget per pair and unit weight is ``η = tol · sup|K|`` (90% of it for float32
outputs, whose rounding takes the rest), and ``tol · sup|∂K/∂x_d|`` for the gradients
when an input requires one. For a kernel unbounded at 0 it is
``η = tol · rms(s) / (2 Σ_j |w_j|)`` per channel, with ``rms(s)`` from the exact sums of 64
evenly spaced rows: then every row errs by at most ``η Σ_j |w_j|`` and the output's relative
ℓ2 error is about tol / 2. The choice (and what it computed: cells, Fourier coefficients)
is kept for the next call on the same points, so iterative solvers plan once.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict

import numpy as np

from .. import forks
from ..codegen import ir, ops
from ..core.binding import Variable, is_torch
from ..core.progress import logger
from ..engine import plans as engine
from . import gradform, near, spectral
from .choose import SMALL_S, Choice, choose, exact_cost, formula_units
from .problem import bind_problem
from .profile import Profile
from .settings import FLOAT32_MIN_TOL, FLOAT64_MIN_TOL, check_tol, forced_method
from .split import near_formula, near_variables

_PLANS: OrderedDict = OrderedDict()
_PLANS_SIZE = 4  # a plan holds float64 copies of the points, cells and coefficients
_lock = forks.lock()
_said: set = set()


def _once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        logger.info(message)


def finufft_available() -> bool:
    try:
        import finufft  # noqa: F401
    except ImportError:
        return False
    return True


def _stamp(a):
    if isinstance(a, (int, float)):
        return ("number", float(a))
    if is_torch(a):
        return ("torch", a.data_ptr(), a._version, tuple(a.shape), str(a.dtype), str(a.device))
    a = np.ascontiguousarray(a)
    return ("numpy", a.ctypes.data, a.shape, a.dtype.str, zlib.crc32(a.view(np.uint8)))


class Planned:
    """A problem, its profile and the method chosen for it (with what that computed)."""

    def __init__(self, problem, profile, choice: Choice, eta, eta_grad, kind: str = "sum"):
        self.problem, self.profile, self.choice = problem, profile, choice
        self.eta, self.eta_grad = eta, eta_grad
        self.kind = kind  # "sum", or "gradient" (lazytensor.fastsum.gradform)
        self.cells = None
        self.far = None


def plan(formula, variables: list, axis: int, tol: float) -> Planned:
    """The :class:`Planned` evaluation of ``Σ formula`` over ``axis`` to ``tol``."""
    tol = check_tol(tol)
    problem = bind_problem(formula, variables, axis)
    if isinstance(problem, str):
        found = gradform.plan(formula, variables, axis, tol, forced_method())
        if found is not None:
            p, prof, choice = found
            _check_dtype(p.dtype, tol)
            return Planned(p, prof, choice, 0.0, None, "gradient")
        return Planned(None, None, Choice("exact", reason=problem), 0.0, None)
    _check_dtype(problem.dtype, tol)
    small = exact_cost(problem.N, problem.M, problem.E, problem.dtype,
                       formula_units(problem.formula))
    if small < SMALL_S and forced_method() is None:  # before any planning
        return Planned(problem, None, Choice("exact", estimates={"exact": small}, reason=(
            f"N·M = {problem.N * problem.M:.3g} pairs: brute force is fastest")), 0.0, None)
    if tol < FLOAT64_MIN_TOL:
        return Planned(None, None, Choice("exact", reason=f"tol={tol:g} is below the "
                                          f"transforms' {FLOAT64_MIN_TOL:g}"), 0.0, None)
    key = _key(problem, tol) + (forced_method(),)
    with _lock:
        hit = _PLANS.get(key)
        if hit is not None:
            _PLANS.move_to_end(key)
            hit.problem = problem  # the same points: the new call's weights
            return hit
    planned = _plan(problem, tol)
    with _lock:
        _PLANS[key] = planned
        while len(_PLANS) > _PLANS_SIZE:
            _PLANS.popitem(last=False)
    return planned


def _check_dtype(dtype: str, tol: float) -> None:
    if dtype == "float32" and tol < FLOAT32_MIN_TOL:
        raise ValueError(f"tol={tol:g} is below what float32 results hold (their rounding is "
                         f"6e-8 of each value): ask tol >= {FLOAT32_MIN_TOL:g}, or pass float64 "
                         "arrays")


def _key(problem, tol):
    k = problem.kernel
    stamps = (_stamp(problem.array(k.x)), _stamp(problem.array(k.y)))
    params = tuple((i, tuple(v.tolist())) for i, v in sorted(problem.params.items()))
    grad = tuple(bool(getattr(v.data, "requires_grad", False)) for v in problem.variables)
    return (problem.formula, stamps, params, problem.dtype, problem.E, tol, grad)


def _plan(problem, tol: float) -> Planned:
    prof = Profile(problem.kernel.profile, problem.params, problem.diameter)
    if not prof.finite:
        return Planned(problem, prof, Choice("exact", reason="the kernel is not finite on the "
                                             "distances the points span"), 0.0, None)
    eta_grad = None
    if prof.bounded:
        eta = tol * prof.sup * (0.9 if problem.dtype == "float32" else 1.0)
        guarantee = "tol · sup|K| · Σ_j |w_j| per row"
        if problem.requires_grad:
            eta_grad = tol * prof.grad_sup
            if not np.isfinite(eta_grad):
                return Planned(problem, prof, Choice("exact", reason="gradients of a kernel "
                                                     "whose gradient is unbounded at 0"), 0.0, None)
    else:
        if problem.requires_grad:
            return Planned(problem, prof, Choice("exact", reason="gradients of a kernel "
                                                 "unbounded at 0"), 0.0, None)
        eta = _unbounded_budget(problem, tol)
        guarantee = "relative ℓ2 error tol of each channel"
        if not eta > 0:
            return Planned(problem, prof, Choice("exact", reason="the sums of the sampled "
                                                 "rows are 0"), 0.0, None)
    if prof.sup == 0:
        return Planned(problem, prof, Choice("exact", reason="the kernel is 0"), 0.0, None)
    choice = choose(problem, prof, tol, eta, eta_grad, guarantee,
                    spectral_ok=finufft_available(), force=forced_method())
    if not finufft_available() and choice.method == "truncation":
        _once("tol=: finufft is not installed (pip install 'lazytensor-kernels[fast]'): only "
              "exact sums and truncation are available")
    if choice.method != "exact" and prof.bounded:
        choice.guarantee = f"{choice.bound / prof.sup:.3g} · sup|K| · Σ_j |w_j| per row (tol {tol:g})"
    elif choice.method != "exact":
        choice.guarantee = f"relative ℓ2 error {tol:g} per channel (rows within {choice.bound:.3g} · Σ_j |w_j|)"
    return Planned(problem, prof, choice, eta, eta_grad)


def _unbounded_budget(problem, tol: float) -> float:
    rows = np.unique(np.linspace(0, problem.N - 1, min(64, problem.N)).astype(np.int64))
    s = _exact_rows(problem, rows)
    s = s.detach().cpu().numpy() if is_torch(s) else np.asarray(s)
    rms = np.sqrt(np.mean(s.astype(np.float64) ** 2, axis=0))
    sums = problem.weight_sums()
    return float(0.5 * tol * np.min(rms / np.maximum(sums, 1e-300)))


def _exact_rows(problem, rows):
    """The exact sums of the target rows ``rows`` (float64)."""
    moved = []
    for v in problem.variables:
        data = v.data
        if v.cat == "i" and not isinstance(data, (int, float)):
            data = near._take(near._float64(data), rows)
        else:
            data = near._float64(data)
        moved.append(Variable(data, v.cat, v.dim, v.label))
    if is_torch(moved[0].data) or any(is_torch(v.data) for v in moved):
        import torch

        with torch.no_grad():
            return engine.reduce(problem.formula, moved, "sum", 1, {}, "auto")
    return engine.reduce(problem.formula, moved, "sum", 1, {}, "auto")


def reduce(formula, variables: list, axis: int, opts: dict, backend: str, grad_mode, tol):
    """``Σ formula`` over ``axis`` to ``tol`` (the engine's reduce when exact is chosen)."""
    planned = plan(formula, variables, axis, tol)
    choice = planned.choice
    logger.debug("sum to tol=%g: %s", tol, choice)
    if choice.method == "exact":
        return engine.reduce(formula, variables, "sum", axis, opts, backend, grad_mode)
    if planned.kind == "gradient":
        out = gradform.execute(planned.problem, choice, backend)
    else:
        out = execute(planned, backend, grad_mode)
    p = planned.problem
    if p.library == "torch":
        return out.to(getattr(__import__("torch"), p.dtype))
    return np.ascontiguousarray(out, dtype=p.dtype)


def execute(planned: Planned, backend: str, grad_mode=None):
    """Run the chosen method: the (N, E) sums in float64, of the inputs' library."""
    p, choice = planned.problem, planned.choice
    if choice.method == "truncation":
        radius, k = choice.plan
        if planned.cells is None:
            planned.cells = near.neighbour_ranges(p.x, p.y, p.lo, radius, k)
        return near.ranged_sum(p.formula, p.variables, planned.cells, backend, grad_mode)
    if choice.method == "spectral":
        return far_sum(p, _far(planned, None, 0.8))
    mask, radius, k = choice.plan
    if planned.cells is None:
        planned.cells = near.neighbour_ranges(p.x, p.y, p.lo, radius, k)
    f = near_formula(p.formula, p.kernel.sqdist, len(p.variables), mask.p)
    near_part = near.ranged_sum(f, list(p.variables) + near_variables(mask), planned.cells,
                                backend, grad_mode)
    return near_part + far_sum(p, _far(planned, mask, 0.75))


def _far(planned: Planned, mask, share: float):
    if planned.far is None:
        p, prof = planned.problem, planned.profile
        L, center = p.hi - p.lo, (p.hi + p.lo) / 2
        if isinstance(planned.choice.plan, spectral.FarField):
            planned.far = planned.choice.plan
        else:
            planned.far = spectral.sampled_far(prof, L, center, planned.eta, planned.eta_grad,
                                               mask, share)
        if planned.far is None:
            raise RuntimeError("the far field's grid outgrew its bound; report this formula")
        planned.far.pick_upsampling(p.N, p.M, p.E, planned.eta_grad is not None)
        planned.choice.params.update(planned.far.describe())
    return planned.far


def far_sum(p, far):
    """The spectral sum of a problem's weights (through :class:`SpectralSum` in torch)."""
    w = p.weights()
    if p.library == "torch":
        from .autograd import SpectralSum

        x = near._float64(p.array(p.kernel.x))
        y = near._float64(p.array(p.kernel.y))
        return SpectralSum.apply(far, x, y, w)
    return spectral.apply(far, p.x, p.y, np.ascontiguousarray(w))


def explain(K, v, dim: int, tol) -> Choice:
    """The :class:`Choice` of ``K.sum(dim)`` (``K @ v`` with ``v``) to ``tol``."""
    if tol is None:
        raise ValueError("explain: give tol= (or call it under lazytensor.options(tol=...))")
    formula, variables = K.formula, list(K.variables)
    if v is not None:
        v = v if is_torch(v) else np.asarray(v)
        v2 = v.reshape(-1, 1) if v.ndim == 1 else v
        formula = ops.apply("mul", formula, ir.var(len(variables), v2.shape[1], "j"))
        variables.append(Variable(v2, "j", int(v2.shape[1])))
    axis = K._axis(dim, None, "explain")
    return plan(formula, variables, axis, tol).choice
