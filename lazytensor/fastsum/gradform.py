"""Gradient forms to a tolerance: pykeops's ``K.grad(x, g).sum(dim=1, tol=...)`` in NumPy.

``Σ_j (x_i − y_j) ψ(|x_i − y_j|²) ⟨u_i, w_j⟩`` (:func:`lazytensor.codegen.radial.analyze_gradient`)
is the gradient in x of ``⟨u, Σ_j φ(|x_i − y_j|²) w_j⟩`` for ``ψ = 2φ'``. Contract, per row
and component d: ``|error| ≤ tol · sup_z |z_d ψ(|z|²)| · Σ_e |u_ie| Σ_j |w_je|`` (the torch
gradients' bound). Methods: brute force; truncation (the formula itself on the pairs of
grid cells closer than the radius beyond which ``r |ψ(r²)|`` is below the budget); for a
Gaussian ``ψ = A e^{αt}``, the spectral transform of ``∇φ`` with ``φ = A e^{αt} / 2α``
(:func:`lazytensor.fastsum.spectral.apply_gradient`). Other kernels: brute force or
truncation.

>>> import numpy as np
>>> from lazytensor import Vi, Vj
>>> x, b, g = np.random.rand(300, 2), np.random.rand(300, 1), np.random.rand(300, 1)
>>> K = (-Vi(x).sqdist(Vj(x)) * 20).exp() * Vj(b)
>>> G = K.grad(Vi(x), g)
>>> bool(np.abs(G.sum(dim=1, tol=1e-6) - G.sum(dim=1)).max() < 1e-6 * 2 * 20 * g.sum() * b.sum())
True
"""

from __future__ import annotations

import numpy as np

from ..codegen import ir, radial
from ..codegen.evaluate import evaluate
from ..core.binding import Variable, bind
from . import costs, near, spectral
from .choose import Choice, exact_cost, formula_units, near_cost
from .profile import Profile


class GradientProblem:
    """A gradient form bound to arrays (a reduction over j)."""

    def __init__(self, form, formula, variables, params, x, y, u, w, sig):
        self.kernel, self.formula, self.variables = form, formula, variables
        self.params, self.x, self.y, self.u, self.w = params, x, y, u, w
        self.library, self.dtype, self.N, self.M, self.E = sig.library, sig.dtype, sig.N, sig.M, form.E
        self.lo = np.minimum(x.min(0), y.min(0))
        self.hi = np.maximum(x.max(0), y.max(0))
        self.diameter = float(np.linalg.norm(self.hi - self.lo))
        self.D = x.shape[1]


def bind_gradient(formula, variables, axis):
    """A :class:`GradientProblem`, or the reason why not."""
    if axis == 0:
        formula = ir.swap_ij(formula)
        variables = [Variable(v.data, ir.swap_cat(v.cat), v.dim, v.label, v.io_dtype)
                     for v in variables]
    form = radial.analyze_gradient(formula)
    if isinstance(form, radial.NotRadial):
        return form.reason
    sig = bind(variables)
    if sig.batch:
        return f"batch dimensions {sig.batch}"
    if any(getattr(v.data, "requires_grad", False) for v in variables):
        return "a gradient of a gradient form is asked"
    data = [near._float64(v.data) for v in variables]
    data = [d.detach().cpu().numpy() if hasattr(d, "detach") else d for d in data]
    params = {k: np.atleast_1d(np.asarray(d, dtype=np.float64)).reshape(-1)
              for k, (d, v) in enumerate(zip(data, variables)) if v.cat == "p"}
    env = {k: (np.full(1, d) if isinstance(d, float) else d) for k, d in enumerate(data)}
    x, y = env[form.x.index], env[form.y.index]
    if len(x) == 0 or len(y) == 0:
        return "no points"
    u = np.broadcast_to(evaluate(form.u, env, like=x), (len(x), form.E))
    w = np.broadcast_to(evaluate(form.weight, env, like=y), (len(y), form.E))
    return GradientProblem(form, formula, variables, params, x, y, np.ascontiguousarray(u),
                           np.ascontiguousarray(w), sig)


def plan(formula, variables, axis, tol, force=None):
    """``(problem, profile, choice)`` for a gradient form, or None if it is not one."""
    p = bind_gradient(formula, variables, axis)
    if isinstance(p, str):
        return None
    prof = Profile(p.kernel.profile, p.params, p.diameter)
    r = prof.r
    vec = np.abs(r * prof.phi(r * r))  # |z_d ψ(|z|²)| along an axis
    if not np.isfinite(vec[1:]).all():
        return p, prof, Choice("exact", reason="the gradient form's kernel is unbounded")
    eta = tol * float(vec.max()) * (0.9 if p.dtype == "float32" else 1.0)
    est = {"exact": exact_cost(p.N, p.M, p.E, p.dtype, formula_units(p.formula))}
    options = {}
    env = np.maximum.accumulate(vec[::-1])[::-1]
    ok = env <= 0.9 * eta
    radius = float(r[int(np.argmax(ok))]) if ok.any() else float("inf")
    seconds, k = near_cost(p, radius, formula_units(p.formula))
    est["truncation"] = seconds + costs.CALL_S
    options["truncation"] = ({"radius": float(f"{radius:.4g}"), "cells": f"radius/{k}"},
                             float(env[int(np.argmax(ok))]) if ok.any() else float("inf"),
                             (radius, k))
    if prof.gaussian is not None:
        A, alpha = prof.gaussian
        far = spectral.gaussian_far(p.hi - p.lo, (p.hi + p.lo) / 2, abs(A / (2 * alpha)), alpha,
                                    float("inf"), eta)
        est["spectral"] = spectral.transform_cost(p.N, p.M, p.E, far.coef.modes, far.eps, True) \
            + costs.CALL_S
        far.sign = float(np.sign(A / (2 * alpha)))
        options["spectral"] = (far.describe(), float(far.grad_bound.max()), far)
    if force is not None:
        if force not in est or not np.isfinite(est[force]):
            raise ValueError(f"method={force!r} does not apply to this gradient form")
        method = force
    else:
        method = min(est, key=lambda m: (est[m], m != "exact"))
    if method == "exact":
        return p, prof, Choice("exact", estimates=est, reason="no method is estimated faster "
                               "than brute force for this gradient form")
    params, bound, payload = options[method]
    guarantee = (f"{bound / float(vec.max()):.3g} · sup|z ψ(|z|²)| · Σ_e |u_ie| Σ_j |w_je| per "
                 f"row and component (tol {tol:g})")
    return p, prof, Choice(method, params, bound, guarantee, est, "gradient form", payload)


def execute(p, choice, backend):
    """The (N, D) sums, float64, of the inputs' library."""
    if choice.method == "truncation":
        radius, k = choice.plan
        cells = near.neighbour_ranges(p.x, p.y, p.lo, radius, k)
        return near.ranged_sum(p.formula, p.variables, cells, backend)
    far = choice.plan
    far.pick_upsampling(p.N, p.M, p.E, True)
    out = far.sign * spectral.apply_gradient(far, p.x, p.y, p.w, p.u)
    if p.library == "torch":
        import torch

        device = next((v.data.device for v in p.variables if hasattr(v.data, "device")), "cpu")
        return torch.from_numpy(out).to(device)
    return out
