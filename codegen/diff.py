"""Symbolic differentiation of formulas: reverse mode (VJP) and forward mode (JVP), IR to IR.

``vjp(F, [x], g)`` is the formula ``(∂F/∂x)ᵀ g``: a new formula in the same variables plus
``g``, which a reduction turns into a gradient (see :mod:`lazytensor.autodiff.autograd`).

>>> from lazytensor.codegen import ir
>>> x = ir.var(0, 3, "i"); g = ir.var(1, 1, "i")
>>> F = ops.apply("sum", ops.apply("mul", x, x))
>>> ir.to_text(vjp(F, [x], g)[x])  # g x + g x: the product rule, both factors x
'add(mul(expand(Vi(1,1), 3), Vi(0,3)), mul(expand(Vi(1,1), 3), Vi(0,3)))'
"""

from __future__ import annotations

from . import ir, ops
from .simplify import simplify


def _depends(root: ir.Node, wrt: set) -> set:
    """ids of the nodes of ``root`` that depend on a variable in ``wrt``."""
    dep: set[int] = set()
    for node in ir.topo_order(root):
        if node in wrt or any(id(a) in dep for a in node.args):
            dep.add(id(node))
    return dep


def vjp(formula: ir.Node, wrt: list[ir.Node], g: ir.Node) -> dict:
    """Cotangents ``{x: (∂F/∂x)ᵀ g}`` for each variable ``x`` in ``wrt`` (simplified IR)."""
    if g.dim != formula.dim:
        raise ValueError(f"cotangent has dimension {g.dim}, formula has {formula.dim}")
    wrt_set = set(wrt)
    dep = _depends(formula, wrt_set)
    cot: dict[int, ir.Node] = {id(formula): g}
    for node in reversed(ir.topo_order(formula)):
        ct = cot.pop(id(node), None)
        if ct is None or node.op in ("var", "const"):
            if node in wrt_set and ct is not None:
                cot[id(node)] = ct  # keep for the result
            continue
        opdef = ops.get(node.op)
        if not opdef.differentiable or opdef.vjp is None:
            continue
        contributions = opdef.vjp(node, ct)
        for arg, c in zip(node.args, contributions):
            if c is None or id(arg) not in dep:
                continue
            if c.dim != arg.dim:
                raise AssertionError(f"VJP of {node.op} gave dimension {c.dim} for {arg.dim}")
            prev = cot.get(id(arg))
            cot[id(arg)] = c if prev is None else ops.apply("add", prev, c)
    out = {}
    for x in wrt:
        ct = cot.get(id(x))
        out[x] = simplify(ct) if ct is not None else ir.const([0.0] * x.dim)
    return out


def jvp(formula: ir.Node, tangents: dict) -> ir.Node:
    """The directional derivative ``Σ_x (∂F/∂x) t_x`` for tangents ``{x: t_x}`` (simplified)."""
    tan: dict[int, ir.Node] = {id(x): t for x, t in tangents.items()}
    for node in ir.topo_order(formula):
        if node.op in ("var", "const") or id(node) in tan:
            continue
        ts = [tan.get(id(a)) for a in node.args]
        if all(t is None for t in ts):
            continue
        opdef = ops.get(node.op)
        if not opdef.differentiable or opdef.jvp is None:
            continue
        t = opdef.jvp(node, ts)
        if t is not None:
            tan[id(node)] = t
    result = tan.get(id(formula))
    return simplify(result) if result is not None else ir.const([0.0] * formula.dim)
