"""Autodiff: a thin ``torch.autograd.Function`` whose backward builds new reductions.

Gradient of a Sum reduction ``a_i = Σ_j F(x_i, y_j, p)`` with output gradient ``g_i``:
``∂/∂x_i = Σ_j (∂F/∂x_i)ᵀ g_i`` (a reduction over j), ``∂/∂y_j = Σ_i (∂F/∂y_j)ᵀ g_i`` (over
i), ``∂/∂p = Σ_i Σ_j (∂F/∂p)ᵀ g_i``. All i-side gradients share one kernel, all j-side
gradients another. LogSumExp and the softmax-weighted sum are Sum reductions of a
formula that uses the saved forward result (treated as one more i-variable):
``d lse_i = Σ_j exp(F_ij - lse_i) dF_ij``. Min/Max/K-min reductions differentiate through
the saved indices: the formula is re-evaluated in torch at the selected pairs only
(O(N·K) memory). Backward calls the same Function again, so gradients of any order work.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from .codegen import diff, ir, linearize, reductions
from .codegen.arraymath import torch_namespace
from .codegen.compositions import concat
from .codegen.evaluate import evaluate
from .engine import ReductionCall, execute


class KernelReduction(torch.autograd.Function):
    """``outputs = reduction(call)(*tensors)``, differentiable to any order."""

    @staticmethod
    def forward(ctx, call: ReductionCall, *tensors):
        outs = execute(call, list(tensors))
        ctx.call = call
        ctx.n_in = len(tensors)
        ctx.save_for_backward(*tensors, *outs)
        for o, spec in zip(outs, call.outputs()):
            if spec.kind == "index":
                ctx.mark_non_differentiable(o)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        inputs, outs = list(saved[: ctx.n_in]), list(saved[ctx.n_in:])
        needs = ctx.needs_input_grad[1:]
        return (None, *reduction_vjp(ctx.call, inputs, outs, list(grads), needs))


def apply_with_grad(call: ReductionCall, arrays: list, grad_mode: str | None = None) -> list:
    """Run ``call`` through the autograd Function (min-type reductions also keep indices).

    Sum and LogSumExp whose differentiated i-variables/parameters are small use the fused
    (dual-number) forward of :mod:`lazytensor.mixed` unless ``grad_mode="symbolic"``.
    """
    from . import mixed

    mode = grad_mode or mixed.default_grad_mode()
    if mode not in mixed.GRAD_MODES:
        raise ValueError(f"grad_mode must be one of {mixed.GRAD_MODES}, got {mode!r}")
    ks = mixed.dual_slots(call, arrays, mode)
    if ks:
        return [mixed.FusedReduction.apply(call, tuple(ks), *arrays)]
    variant = reductions.get(call.reduction).arg_variant
    if variant is not None:
        full = call.with_formula(call.formula, call.cats, call.dims, variant, call.opts)
        return list(KernelReduction.apply(full, *arrays))[:1]
    return list(KernelReduction.apply(call, *arrays))


def reduction_vjp(call, inputs, outs, grads, needs) -> list:
    red = reductions.get(call.reduction)
    if not any(needs):
        return [None] * len(inputs)
    if red.gradient == "gather":
        return _gather_vjp(call, inputs, outs, grads[0], needs)
    g = grads[0]
    saved = outs[: red.vjp_saves]
    saved_vars = [ir.var(len(inputs) + q, o.shape[-1], "i") for q, o in enumerate(saved)]
    aux = red.gradient == "sum" and any(gr is not None for gr in grads[red.user_outputs:])
    G = red.vjp_formula(call.formula, saved_vars, aux)
    if aux:
        g0 = g if g is not None else torch.zeros_like(outs[0])
        g = torch.cat([g0, *grads[red.user_outputs:]], dim=-1)
    return _sum_vjp(call, G, inputs, saved, g, needs)


def _sum_vjp(call, G, inputs, extra, g, needs) -> list:
    """Gradients of ``Σ_j G`` with cotangent ``g`` for the inputs that need them."""
    if g is None:
        return [None] * len(inputs)
    cats = list(call.cats) + ["i"] * len(extra)
    dims = list(call.dims) + [e.shape[-1] for e in extra]
    g_var = ir.var(len(cats), G.dim, "i")
    cats.append("i")
    dims.append(G.dim)
    wanted = [k for k in range(len(inputs)) if needs[k]]
    xs = {k: ir.var(k, call.dims[k], call.cats[k]) for k in wanted}
    cot = diff.vjp(G, list(xs.values()), g_var)
    args = [*inputs, *extra, g]
    result = [None] * len(inputs)
    for side, axis in ((("i", "p"), 1), (("j",), 0)):
        ks = [k for k in wanted if call.cats[k] in side]
        if not ks:
            continue
        formula = concat([cot[xs[k]] for k in ks])
        sub = call.with_formula(formula, cats, dims, "sum", _sum_opts(call), axis=axis)
        total = sum_split_rows(sub, args)
        offset = 0
        for k in ks:
            d = call.dims[k]
            part = total[..., offset: offset + d]
            offset += d
            if call.cats[k] == "p":
                part = part.sum(dim=-2)
            result[k] = _unbroadcast(part, inputs[k].shape)
    return result


def sum_split_rows(call: ReductionCall, args: list):
    """``Σ_j`` of ``call``'s formula, with its row terms ``s(i, j) L(i)`` (gradients of
    kernels in high dimension: ``c_ij (x_i - y_j)``) multiplied by ``L(i)`` after the sum,
    so that the kernel runs weighted sums of j-vectors (:mod:`codegen.linearize`)."""
    if call.backend == "numpy":
        return KernelReduction.apply(call, *args)[0]
    formula, hoisted, split = _wide_plan(call.formula, call.cats)
    args = list(args)
    if hoisted:
        arrays = {k: a for k, (a, cat) in enumerate(zip(args, call.cats)) if cat == "j"}
        xp = torch_namespace()
        args += [evaluate(node, arrays, xp) for node in hoisted]
    call = dataclasses.replace(call, formula=formula, cats=call.cats + ("j",) * len(hoisted),
                               dims=call.dims + tuple(n.dim for n in hoisted))
    if split is None:
        return KernelReduction.apply(call, *args)[0]
    (G,) = KernelReduction.apply(dataclasses.replace(call, formula=split.G), *args)
    out = G[..., : split.dim]
    arrays = {}
    for k, (a, cat) in enumerate(zip(args, call.cats)):
        if cat == "i":
            arrays[k] = a
        elif cat == "p":
            arrays[k] = a.unsqueeze(-2)  # (*batch, 1, D) against (*batch, N, D)
    xp = torch_namespace()
    pieces = {}
    for t in split.terms:
        L = evaluate(t.factor, arrays, xp) if t.factor.op != "const" else \
            G.new_tensor(list(t.factor.params))
        term = (t.coef * G[..., t.weight: t.weight + 1]) * L
        prev = pieces.get(t.offset)
        pieces[t.offset] = term if prev is None else prev + term
    parts, pos = [], 0
    for off in sorted(pieces):
        term = pieces[off]
        parts += [out[..., pos:off], out[..., off: off + term.shape[-1]] + term]
        pos = off + term.shape[-1]
    parts.append(out[..., pos:])
    return torch.cat(parts, -1)


_HOIST_MIN_INPUT = 17  # hoist j-only values that read vectors at least this wide


@functools.lru_cache(maxsize=512)
def _wide_plan(formula: ir.Node, cats: tuple):
    """(formula, hoisted nodes, row split) of a gradient formula: structural, so worked
    out once per formula and not on every backward call.

    Narrow values of the reduced side alone that read wide vectors of several
    j-variables (``⟨g_j, out_j⟩`` in the i-side gradient of a softmax-weighted sum) are
    computed once per j in torch and passed as more j-variables (numbered after
    ``cats``): in the pair loop they would cost a wide loop per pair. (The CPU plan
    hoists values of one j-variable itself.) Then the row terms are split off
    (:func:`codegen.linearize.split_rows`), or None."""
    from .codegen.cpu_plan import distribute_dots

    # ⟨g_j, v_i - out_j⟩ = ⟨g_j, v_i⟩ - ⟨g_j, out_j⟩: the second term is such a value
    formula = distribute_dots(formula)
    info: dict = {}  # node -> (reads only j-variables, widest vector read, variables read)
    for n in ir.topo_order(formula):
        if n.op == "var":
            info[n] = (n.cat == "j", n.dim, frozenset((n.index,)))
        elif n.op == "const":
            info[n] = (True, 0, frozenset())
        else:
            parts = [info[a] for a in n.args]
            info[n] = (all(p[0] for p in parts), max(p[1] for p in parts),
                       frozenset().union(*(p[2] for p in parts)))
    hoisted: dict = {}  # the topmost such values, in a fixed order
    stack, seen = [formula], set()
    while stack:
        n = stack.pop()
        if n in seen or n.op in ("var", "const"):
            continue
        seen.add(n)
        only_j, widest, used = info[n]
        if only_j and n.dim <= 16 and widest >= _HOIST_MIN_INPUT and len(used) >= 2:
            hoisted[n] = None
            continue
        stack.extend(n.args)
    if hoisted:
        formula = ir.substitute(formula, {n: ir.var(len(cats) + k, n.dim, "j")
                                          for k, n in enumerate(hoisted)})
    return formula, tuple(hoisted), linearize.split_rows(formula)


def _sum_opts(call) -> tuple:
    return tuple((k, v) for k, v in call.opts if k in ("sum_scheme", "dtype_acc"))


def _unbroadcast(grad, shape):
    """Sum ``grad`` over the batch dimensions along which the input was broadcast."""
    shape = tuple(shape)
    while grad.dim() > len(shape):
        grad = grad.sum(dim=0)
    for axis, s in enumerate(shape):
        if s == 1 and grad.shape[axis] != 1:
            grad = grad.sum(dim=axis, keepdim=True)
    return grad.reshape(shape)


def _gather_vjp(call, inputs, outs, g, needs) -> list:
    """Gradients of min/max/K-min values through their saved indices (no N×M work)."""
    if g is None:
        return [None] * len(inputs)
    idx = outs[1]  # (*batch, N, K*F), layout [K][F]
    F = call.formula.dim
    KF = idx.shape[-1]
    batch = tuple(call.batch)
    nb = len(batch)
    valid = idx >= 0
    safe = idx.clamp(min=0)
    with torch.enable_grad():
        env = {}
        used = {v.index for v in ir.variables(call.formula)}
        for k, (x, cat) in enumerate(zip(inputs, call.cats)):
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
        values = evaluate(call.formula, env, torch_namespace())
        values = values.expand(*batch, call.N, KF, F)
        comp = (torch.arange(KF, device=idx.device) % F).expand(*batch, call.N, KF)
        picked = torch.gather(values, -1, comp[..., None])[..., 0]
        picked = torch.where(valid, picked, torch.zeros_like(picked))
        wanted = [k for k in range(len(inputs)) if needs[k]]
        if picked.requires_grad:
            grads = torch.autograd.grad(picked, [inputs[k] for k in wanted], g,
                                        create_graph=torch.is_grad_enabled(), allow_unused=True)
        else:  # the selected values do not depend on the inputs (comparisons, floor, ...)
            grads = [None] * len(wanted)
    result = [None] * len(inputs)
    for k, gr in zip(wanted, grads):
        result[k] = gr if gr is not None else torch.zeros_like(inputs[k])
    return result
