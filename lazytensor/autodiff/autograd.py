"""Autodiff: a thin ``torch.autograd.Function`` whose backward builds new reductions.

Gradient of a Sum reduction ``a_i = Σ_j F(x_i, y_j, p)`` with output gradient ``g_i``:
``∂/∂x_i = Σ_j (∂F/∂x_i)ᵀ g_i`` (a reduction over j), ``∂/∂y_j = Σ_i (∂F/∂y_j)ᵀ g_i`` (over
i), ``∂/∂p = Σ_i Σ_j (∂F/∂p)ᵀ g_i``. All i-side gradients share one kernel, all j-side
gradients another. LogSumExp and the softmax-weighted sum are Sum reductions of a
formula that uses the saved forward result (treated as one more i-variable; each
reduction's ``vjp_formula``). Min/Max/K-min reductions differentiate through the saved
indices: the formula is re-evaluated in torch at the selected pairs only (O(N·K)
memory). Backward calls the same Function again, so gradients of any order work.

The symbolic part of a backward (the VJP formulas, their calls, the form their kernels
take, :func:`lazytensor.codegen.linearize.plan_gradient_sum`, with the tuning of the
call's backend) is a :class:`VjpFormulas`,
worked out once per call and set of inputs that need a gradient (:func:`vjp_formulas`) and
kept in the call's memo: a repeated backward runs no differentiation.

The Function is written in the ``setup_context`` style with ``vmap`` and ``jvp`` rules
(:mod:`lazytensor.autodiff.transforms`), so torch.func transforms and forward-mode AD compose with it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..backends.cpu import backward as twosided
from ..backends.cpu.backward import add_row_terms
from ..codegen import diff, ir, ops, reductions
from ..codegen.arraymath import torch_namespace
from ..codegen.compositions import concat
from ..codegen.evaluate import evaluate
from ..codegen.linearize import GradientForm, plan_gradient_sum
from ..core import backend
from ..core.call import ReductionCall, execute
from .transforms import gathered_values, reduction_jvp, vmap_rule

_is_wrapped = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)


class KernelReduction(torch.autograd.Function):
    """``outputs = reduction(call)(*tensors)``, differentiable to any order."""

    @classmethod
    def apply(cls, *args):
        # torch's Function.apply binds the arguments to forward's signature with inspect
        # (~70 us a call, as much as a small reduction) when setup_context is defined.
        # forward has no defaults to bind: outside torch.func transforms (and without
        # tensors left over from one) the C entry point takes the arguments as they are.
        if _is_wrapped is None or torch._C._are_functorch_transforms_active() or any(
                _is_wrapped(a) for a in args[2:]):
            return super().apply(*args)
        return _C_APPLY(*args)

    @staticmethod
    def forward(call: ReductionCall, ranges, *tensors):
        return tuple(execute(call, list(tensors), ranges))

    @staticmethod
    def setup_context(ctx, inputs, output):
        call, ranges, tensors = inputs[0], inputs[1], inputs[2:]
        ctx.call, ctx.ranges = call, ranges
        ctx.n_in = len(tensors)
        ctx.save_for_backward(*tensors, *output)
        ctx.save_for_forward(*tensors, *output)
        for o, spec in zip(output, call.outputs()):
            if spec.kind == "index":
                ctx.mark_non_differentiable(o)

    @staticmethod
    def vmap(info, in_dims, call: ReductionCall, ranges, *tensors):
        # the same ranges in every element of the vmapped dimension (a batch dimension)
        return vmap_rule(lambda c, *t: KernelReduction.apply(c, ranges, *t), info,
                         (in_dims[0], *in_dims[2:]), call, *tensors)

    @staticmethod
    def jvp(ctx, _call_tangent, _ranges_tangent, *tangents):
        saved = ctx.saved_tensors
        inputs, outs = list(saved[: ctx.n_in]), list(saved[ctx.n_in:])
        ranges = ctx.ranges  # the JVP sums run over the same pairs
        return tuple(reduction_jvp(lambda c, *t: KernelReduction.apply(c, ranges, *t),
                                   ctx.call, inputs, outs, list(tangents)))

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        inputs, outs = list(saved[: ctx.n_in]), list(saved[ctx.n_in:])
        needs = ctx.needs_input_grad[2:]
        return (None, None, *reduction_vjp(ctx.call, inputs, outs, list(grads), needs,
                                           ctx.ranges))


# The C entry point that torch's Function.apply ends in (bound to KernelReduction).
_C_APPLY = super(torch.autograd.Function, KernelReduction).apply


@dataclass(frozen=True)
class SideGradient:
    """The gradients of the inputs ``slots`` of one side (i-variables and parameters: a
    Sum over j; j-variables: over i), as one Sum of their concatenated cotangents;
    ``normalized``: one more component, the sum of the softmax weights, divides them."""

    slots: tuple
    call: ReductionCall  # the Sum the kernel runs (after the gradient plan)
    plan: GradientForm | None  # None on a backend without tuning (NumPy): the formula as it is
    normalized: bool = False
    shift: tuple | None = None  # (argument slot, max_sumshiftexp call): see _shifted


@dataclass(frozen=True)
class VjpFormulas:
    sides: tuple  # of SideGradient


def vjp_formulas(call: ReductionCall, needs: tuple, aux: bool) -> VjpFormulas:
    """The symbolic part of the backward of ``call`` (a reduction whose ``gradient`` is
    "sum") for the inputs with ``needs[k]``; ``aux``: the auxiliary outputs have a
    cotangent too. Worked out once per (call, needs, aux)."""
    key = ("vjp", needs, aux)
    plan = call.memo.get(key)
    if plan is None:
        plan = call.memo[key] = _vjp_plan(call, needs, aux)
    return plan


def _vjp_plan(call: ReductionCall, needs: tuple, aux: bool) -> VjpFormulas:
    red = reductions.get(call.reduction)
    n_in = len(call.cats)
    saved = red.outputs(call.formula.dim, call.opts_dict)[: red.vjp_saves]
    saved_vars = [ir.var(n_in + q, o.dim, "i") for q, o in enumerate(saved)]
    G = red.vjp_formula(call.formula, saved_vars, aux)
    cats = list(call.cats) + ["i"] * len(saved) + ["i"]
    dims = list(call.dims) + [o.dim for o in saved] + [G.dim]
    g_var = ir.var(len(cats) - 1, G.dim, "i")
    wanted = [k for k in range(n_in) if needs[k]]
    xs = {k: ir.var(k, call.dims[k], call.cats[k]) for k in wanted}
    sum_opts = tuple((k, v) for k, v in call.opts if k in reductions.get("sum").options)
    sides = []
    for side, axis in ((("i", "p"), 1), (("j",), 0)):
        ks = tuple(k for k in wanted if call.cats[k] in side)
        if not ks:
            continue
        # i-side gradients of softmax-weighted reductions are normalized by the weights'
        # own sum (Reduction.normalizer), whose limit at +inf they follow; the j-side sums
        # over i the weights of rows it cannot normalize: plain exp(f - lse) there.
        weight = red.normalizer(call.formula, saved_vars) if axis == 1 else None
        G = red.vjp_formula(call.formula, saved_vars, aux, limits=weight is not None)
        cot = diff.vjp(G, [xs[k] for k in ks], g_var)
        parts = [cot[xs[k]] for k in ks] + ([weight] if weight is not None else [])
        formula, side_dims, shift = concat(parts), dims, None
        if axis == 0 and red.lse_output is not None:
            formula, side_dims, shift = _shifted(call, formula, dims, n_in + red.lse_output)
        sub = call.with_formula(formula, cats, side_dims, "sum", sum_opts, axis=axis)
        tuning = backend.get(sub.backend).tuning
        if tuning is None:  # the reference backend: the formula as it is (shift included)
            sides.append(SideGradient(ks, sub, None, weight is not None, shift))
            continue
        plan = plan_gradient_sum(sub.formula, len(sub.cats), tuning)
        run = dataclasses.replace(sub, formula=plan.split.G if plan.split else plan.formula,
                                  cats=sub.cats + ("j",) * len(plan.hoisted),
                                  dims=sub.dims + tuple(n.dim for n in plan.hoisted))
        sides.append(SideGradient(ks, run, plan, weight is not None, shift))
    return VjpFormulas(tuple(sides))


def _shifted(call: ReductionCall, formula: ir.Node, dims: list, slot: int) -> tuple:
    """j-side weights exp(f - lse) as exp(f - m) / s, from the row maximum m and
    s = Σ_j exp(f - m) of a ``max_sumshiftexp`` pass: the float32 lse cannot hold f - lse
    where it is below f's ulp (f ~ -7e4, f - lse ~ -1e-3: a weight of 1 for 0.9988),
    whereas f - m is exact near the maximum. ``(formula, dims, (slot, call))``, the
    saved lse's slot holding (m, log s); unchanged where the lse is used otherwise."""
    lse = ir.var(slot, 1, "i")
    ms = ir.var(slot, 2, "i")
    m, logs = (ops.apply("slice", ms, params=(q, 1)) for q in (0, 1))
    scale = ops.apply("exp", ops.apply("neg", logs))

    def fn(node, args):
        if node.op == "softmax_weight" and node.args[1] is lse:
            # exp(f - m) / s with the limit at +inf: a row whose maximum is +inf weighs each
            # of its s terms at +inf 1/s, as the forward does (s counts them)
            return ops.apply("mul", ops.apply("softmax_weight", args[0], m, params=(True,)),
                             scale)
        return node if args == node.args else ir.make(node.op, args, node.params, node.dim)

    shifted = ir.rebuild(formula, fn)
    if lse in ir.variables(shifted):
        return formula, dims, None
    F = call.formula
    f = F if F.dim == 1 else ops.apply("slice", F, params=(0, 1))
    new_dims = list(dims)
    new_dims[slot] = 2
    return shifted, new_dims, (slot, call.with_formula(f, call.cats, call.dims,
                                                       "max_sumshiftexp", ()))


def reduction_vjp(call, inputs, outs, grads, needs, ranges=None, apply=None) -> list:
    """Gradients of ``call``'s inputs for the output cotangents ``grads`` (``ranges``: the
    forward's block-sparse pattern; the j-side sum runs on its transpose). ``apply(call,
    ranges, *tensors)`` runs the gradient reductions (default ``KernelReduction.apply``;
    :mod:`lazytensor.integrations.torch_library` passes its op)."""
    red = reductions.get(call.reduction)
    if not any(needs):
        return [None] * len(inputs)
    if red.gradient == "gather":
        return _gather_vjp(call, inputs, outs, grads[0], needs)
    if red.gradient != "sum":
        red.vjp_formula(call.formula, [], False)  # raises: no gradient
    aux = any(gr is not None for gr in grads[red.user_outputs:])
    plan = vjp_formulas(call, tuple(bool(n) for n in needs), aux)
    g = grads[0]
    if aux:
        g0 = g if g is not None else torch.zeros_like(outs[0])
        g = torch.cat([g0, *grads[red.user_outputs:]], dim=-1)
    if g is None:
        return [None] * len(inputs)
    args = [*inputs, *outs[: red.vjp_saves], g]
    result = [None] * len(inputs)
    totals = None
    # the two-sided kernel and NumPy row terms run real CPU arrays: not under the custom op
    # (torch.compile, export, fake and meta tensors), whose runner is ``apply``
    if apply is None and len(plan.sides) == 2 and twosided.applies(call, args, ranges):
        totals = twosided.two_sided_totals(call, plan, args)  # both sides in one kernel
    for n, side in enumerate(plan.sides):
        side_ranges = ranges
        if ranges is not None and call.cats[side.slots[0]] == "j":
            side_ranges = ranges.t()
        side_args = args
        if side.shift is not None:
            # the row pass (max, Σ exp) runs over the forward's pairs: its ranges as given
            slot, ms_call = side.shift
            detached = [a.detach() for a in inputs]
            ms = execute(ms_call, detached, ranges) if apply is None else \
                apply(ms_call, ranges, *detached)
            m, s = ms[0].split(1, dim=-1)
            # log s's value, lse's derivative (m is a constant shift)
            logs = torch.log(s) + _derivative_of(args[slot])
            side_args = [*args[:slot], torch.cat([m, logs], dim=-1), *args[slot + 1:]]
        total = totals[n] if totals else _side_sum(side, side_args, side_ranges, apply)
        if side.normalized:  # Σ_j e C / Σ_j e; no term at all (M = 0): the plain sum, 0
            weights = total[..., -1:]
            total = total[..., :-1] / torch.where(weights == 0, torch.ones_like(weights), weights)
        offset = 0
        for k in side.slots:
            d = call.dims[k]
            part = total[..., offset: offset + d]
            offset += d
            if call.cats[k] == "p":
                part = part.sum(dim=-2)
            result[k] = unbroadcast(part, inputs[k].shape)
    return result


def _derivative_of(t):
    """0 with ``t``'s derivative; 0 and no derivative where ``t`` is infinite (a row whose
    log-sum-exp is +inf: ``t - t.detach()`` would be inf - inf = NaN there)."""
    return torch.where(torch.isfinite(t.detach()), t - t.detach(), torch.zeros_like(t))


def _side_sum(side: SideGradient, args: list, ranges=None, apply=None):
    """``Σ`` of the side's cotangent formula: the hoisted values in torch, the kernel, then
    the row terms ``s(i, j) L(i)`` multiplied by ``L(i)`` after the sum. ``apply`` runs
    the reduction (default: :class:`KernelReduction`, with the row terms in NumPy when no
    graph is built)."""
    call, plan = side.call, side.plan
    plain = apply is None
    apply = apply or KernelReduction.apply
    if plan is None:
        return apply(call, ranges, *args)[0]
    args = list(args)
    xp = torch_namespace()
    if plan.hoisted:
        arrays = {k: a for k, (a, cat) in enumerate(zip(args, call.cats)) if cat == "j"}
        args += [evaluate(node, arrays, xp) for node in plan.hoisted]
    (G,) = apply(call, ranges, *args)
    split = plan.split
    if split is None:
        return G
    if plain and _plain_backward(G, args):
        return add_row_terms(split, G, args, call.cats)
    out = G[..., : split.dim]
    arrays = {}
    for k, (a, cat) in enumerate(zip(args, call.cats)):
        if cat == "i":
            arrays[k] = a
        elif cat == "p":
            arrays[k] = a.unsqueeze(-2)  # (*batch, 1, D) against (*batch, N, D)
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


def _plain_backward(G, args: list) -> bool:
    """A backward that builds no graph, on CPU tensors outside torch.func transforms:
    its row terms can be added in NumPy. On a busy machine each parallel torch operation
    waits for a scheduler slice (tens of ms for a few small operations, measured)."""
    return (not torch.is_grad_enabled() and G.device.type == "cpu"
            and G.dtype in (torch.float32, torch.float64)
            and not torch._C._are_functorch_transforms_active()
            and (_is_wrapped is None or not any(_is_wrapped(a) for a in args)))


def unbroadcast(grad, shape):
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
    wanted = [k for k in range(len(inputs)) if needs[k]]

    def picked(*xs):
        arrays = list(inputs)
        for k, x in zip(wanted, xs):
            arrays[k] = x
        return gathered_values(call, call.formula, arrays, call.cats, outs[1])

    result = [None] * len(inputs)
    for k, gr in zip(wanted, _pullback(picked, [inputs[k] for k in wanted], g)):
        result[k] = gr
    return result


def _pullback(fn, xs: list, g) -> tuple:
    """The cotangent ``g`` of ``fn(*xs)`` pulled back to each of ``xs`` (zeros where
    ``fn`` does not depend on one), itself differentiable in a backward that builds a
    graph (``create_graph``).

    Inside torch.func transforms (a batched ``g`` under jacrev), ``torch.func.vjp``;
    outside them, ``torch.autograd.grad``: torch.func imports torch._dynamo on its first
    call (seconds), and with it torch.distributed.nn, whose functions hold the default
    process group as the default value of their ``group`` argument. Imported after
    ``init_process_group``, that keeps the group alive after ``destroy_process_group``:
    its gloo threads then run into the interpreter's teardown, and the process can abort
    as it exits (``terminate called without an active exception``).
    """
    if torch._C._are_functorch_transforms_active():
        _, pullback = torch.func.vjp(fn, *xs)
        return pullback(g)
    create = torch.is_grad_enabled()  # a backward with create_graph=True
    with torch.enable_grad():
        # a node of its own for each x (one tensor can be two variables), on the graph of
        # x where a second derivative flows through it
        leaves = [x.view_as(x) if create and x.requires_grad else x.detach().requires_grad_()
                  for x in xs]
        out = fn(*leaves)
        grads = (torch.autograd.grad(out, leaves, g, create_graph=create, allow_unused=True)
                 if out.requires_grad else [None] * len(xs))
    return tuple(torch.zeros_like(x) if gr is None else gr for x, gr in zip(xs, grads))
