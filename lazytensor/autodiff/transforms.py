"""torch.func transforms of reductions: the batching (vmap) and forward-mode (jvp) rules.

:class:`~lazytensor.autodiff.autograd.KernelReduction` is an ``autograd.Function`` in the
``setup_context`` style, so that ``torch.func.grad``, ``vjp``, ``jacrev``, ``jvp``,
``jacfwd``, ``hessian`` and ``vmap`` (and ``torch.autograd.forward_ad``) compose with it:

- :func:`vmap_rule`: a vmapped dimension becomes one more (leading) batch dimension of the
  call, so a ``vmap`` over B runs one kernel on ``(B, *batch)``, not B kernels. Inputs
  without the vmapped dimension broadcast along it (size 1), as any batch dimension.
- :func:`reduction_jvp`: the output tangents. A reduction whose gradient is a Sum of
  ``G = vjp_formula(F, saved)`` (Sum, the log-sum-exp family) has the Jacobian
  ``∂out_i/∂v = Σ_j ∂G_ij/∂v`` (the saved outputs held fixed), so its JVP is the Sum of the
  directional derivative of ``G`` along the tangents (the tangents enter the kernel as
  variables of their inputs' kinds). Min/Max/K-min values take the directional derivative
  of ``F`` at the selected pairs (through the indices, O(N·K)); indices have no tangent.

:func:`gathered_values` (a formula at the pairs a selection picked) serves the
gradients of the selections in both modes. Each tangent and batched call is itself a call
of ``KernelReduction``: transforms nest
(``hessian = jacfwd(jacrev(f))``) and differentiate to any order. The calls are worked out
once per call (kept in its ``memo``).

>>> import torch
>>> from lazytensor import Vi, Vj
>>> x, y = torch.randn(5, 3, 2, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
>>> f = lambda x: (-Vi(x).sqdist(Vj(y))).exp().sum(dim=1)
>>> out = torch.func.vmap(f)(x)                 # one kernel call, batch (5,)
>>> dense = (-((x[:, :, None] - y) ** 2).sum(-1)).exp().sum(-1, keepdim=True)
>>> bool(torch.allclose(out, dense))
True
"""

from __future__ import annotations

import dataclasses

import torch

from ..codegen import diff, ir, reductions
from ..codegen.arraymath import torch_namespace
from ..codegen.evaluate import evaluate
from ..core.call import ReductionCall


def batched_call(call: ReductionCall, size: int) -> ReductionCall:
    """``call`` with one more leading batch dimension of ``size``."""
    key = ("vmap", size)
    batched = call.memo.get(key)
    if batched is None:
        batched = call.memo[key] = dataclasses.replace(call, batch=(size, *call.batch))
    return batched


def vmap_rule(apply, info, in_dims, call: ReductionCall, *tensors):
    """The batching rule of ``KernelReduction`` (whose ``apply`` runs the batched call):
    the vmapped dimension (``in_dims``, one per argument, None where absent) moves in
    front of the batch dimensions of each input, and the outputs carry it in front
    (``out_dims`` 0)."""
    size = info.batch_size
    nb = len(call.batch)
    moved = []
    for x, dim, cat in zip(tensors, in_dims[1:], call.cats):
        rank = 1 if cat == "p" else 2  # the (D,) or (rows, D) axes after the batch axes
        if dim is None:
            own = x.dim() - rank
            moved.append(x.reshape((1,) * (nb + 1 - own) + tuple(x.shape)))
        else:
            x = x.movedim(dim, 0)
            own = x.dim() - 1 - rank
            moved.append(x.reshape((size,) + (1,) * (nb - own) + tuple(x.shape[1:])))
    outs = apply(batched_call(call, size), *moved)
    return outs, (0,) * len(outs)


def reduction_jvp(apply, call: ReductionCall, inputs: list, outs: list, tangents: list) -> list:
    """The tangents of ``call``'s outputs for the input tangents ``tangents`` (None: zero);
    ``apply`` runs a call (``KernelReduction.apply``, so that tangents differentiate)."""
    red = reductions.get(call.reduction)
    specs = call.outputs()
    slots = tuple(k for k, t in enumerate(tangents) if t is not None)
    if not slots or all(s.kind == "index" for s in specs):
        return [None] * len(specs)
    tangent_args = [tangents[k] for k in slots]
    if red.gradient == "gather":
        T = _tangent_formula(call, call.formula, slots, len(call.cats))
        if T.op == "const":
            return [torch.zeros_like(outs[0]), None]
        cats = call.cats + tuple(call.cats[k] for k in slots)
        value = gathered_values(call, T, [*inputs, *tangent_args], cats, outs[1])
        return [value, None]
    jcall = jvp_call(call, slots)
    if jcall is None:  # the formula does not depend on the inputs with a tangent
        return [torch.zeros_like(o) for o in outs]
    (total,) = apply(jcall, *inputs, *outs[: red.vjp_saves], *tangent_args)
    result, offset = [], 0
    for spec in specs:
        result.append(total[..., offset: offset + spec.dim])
        offset += spec.dim
    return result


def jvp_call(call: ReductionCall, slots: tuple) -> ReductionCall | None:
    """The Sum whose result is the tangent of every output of ``call`` (a reduction whose
    gradient is "sum") along tangents of the inputs ``slots``; its arguments are the
    inputs, the saved outputs and the tangents. None when that tangent is zero."""
    key = ("jvp", slots)
    if key not in call.memo:
        call.memo[key] = _jvp_call(call, slots)
    return call.memo[key]


def _jvp_call(call: ReductionCall, slots: tuple) -> ReductionCall | None:
    red = reductions.get(call.reduction)
    if red.gradient != "sum":
        red.vjp_formula(call.formula, [], False)  # raises: no derivative
    n_in = len(call.cats)
    saved = call.outputs()[: red.vjp_saves]
    saved_vars = [ir.var(n_in + q, o.dim, "i") for q, o in enumerate(saved)]
    aux = len(call.outputs()) > red.user_outputs
    G = red.vjp_formula(call.formula, saved_vars, aux)
    T = _tangent_formula(call, G, slots, n_in + len(saved))
    if T.op == "const":
        return None
    cats = call.cats + ("i",) * len(saved) + tuple(call.cats[k] for k in slots)
    dims = call.dims + tuple(o.dim for o in saved) + tuple(call.dims[k] for k in slots)
    sum_opts = tuple((k, v) for k, v in call.opts if k in reductions.get("sum").options)
    return call.with_formula(T, cats, dims, "sum", sum_opts, axis=1)


def _tangent_formula(call: ReductionCall, formula: ir.Node, slots: tuple, first: int):
    """The directional derivative of ``formula`` along the variables numbered from
    ``first`` on, one per input in ``slots`` (same category and dimension)."""
    tangents = {ir.var(k, call.dims[k], call.cats[k]): ir.var(first + q, call.dims[k],
                                                               call.cats[k])
                for q, k in enumerate(slots)}
    return diff.jvp(formula, tangents)


def gathered_values(call, formula, arrays, cats, idx):
    """``formula`` (of ``call.formula``'s dimension, on ``arrays`` of categories ``cats``)
    evaluated in torch at the pairs selected by the indices ``idx`` (*batch, N, K*F),
    component by component as the selection's layout [K][F]; 0 where no pair was
    selected. O(N·K) memory."""
    F = call.formula.dim
    KF = idx.shape[-1]
    batch = tuple(call.batch)
    nb = len(batch)
    valid = idx >= 0
    safe = idx.clamp(min=0)
    env = {}
    used = {v.index for v in ir.variables(formula)}
    for k, (x, cat) in enumerate(zip(arrays, cats)):
        if k not in used:
            continue
        xb = x.reshape((1,) * (nb - (x.dim() - (1 if cat == "p" else 2))) + tuple(x.shape))
        if cat == "i":
            env[k] = xb[..., :, None, :]
        elif cat == "p":
            env[k] = xb[..., None, None, :]
        else:
            full = xb.expand(*batch, call.M, x.shape[-1])
            flat = full.reshape(-1, call.M, x.shape[-1])
            gi = safe.reshape(flat.shape[0], -1)[..., None].expand(-1, -1, x.shape[-1])
            env[k] = torch.gather(flat, 1, gi).reshape(*batch, call.N, KF, x.shape[-1])
    values = evaluate(formula, env, torch_namespace())
    values = values.expand(*batch, call.N, KF, F)
    comp = (torch.arange(KF, device=idx.device) % F).expand(*batch, call.N, KF)
    picked = torch.gather(values, -1, comp[..., None])[..., 0]
    return torch.where(valid, picked, torch.zeros_like(picked))


__all__ = ["batched_call", "gathered_values", "jvp_call", "reduction_jvp", "vmap_rule"]
