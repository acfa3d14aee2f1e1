"""Tangent formulas of a fused (dual) forward, in the form that costs least per pair.

Dual mode sums ``concat(F, ∂F/∂v_1, ..., ∂F/∂v_k)`` over j, one tangent per component of
each dual input (:mod:`lazytensor.autodiff.dual`). Taken as they come out of the JVP rules, the
tangents of a basis direction ``e_c`` carry the one-hot vector through the whole formula
(``Σ_k (x - y)_k [0,1,0]_k``: a product and a sum over the vector for one component), and
repeat products the forward already formed. :func:`fused_tangents` returns instead:

- **basis derivatives**: one-hot constants become ``pad``\\ s of a scalar, pushed through
  sums, products and negations, so that ``∂|x - y|²/∂x_c`` is ``(x - y)_c + (x - y)_c``;
- **scales**: a constant factor of a whole tangent (``-2`` above) is not evaluated per pair:
  the reductions dual mode fuses are linear in the tangents, so the factor multiplies
  the reduced value afterwards;
- **one column per distinct tangent**: tangents equal up to their scale are summed once
  (``∂u/∂x_c`` for ``u = Σ_k x_k - y_k`` is the same for every c);
- **shared products**: a tangent that is a product of factors reuses the largest product
  of the forward formula among them (``b · e^{-d} · (x - y)_c`` is ``F · (x - y)_c``);
- **shared components**: ``x_c - y_c`` is read as component c of the forward's ``x - y``.

Products are re-associated, so a tangent can differ from its unshared form by a few ulps.

>>> from lazytensor.codegen import ir, ops
>>> x, y = ir.var(0, 3, "i"), ir.var(1, 3, "j")
>>> F = ops.apply("exp", ops.apply("neg", ops.apply("sum", ops.apply("square", ops.apply("sub", x, y)))))
>>> unique, uses = fused_tangents(F, [basis_jvp(F, x, c) for c in range(3)])
>>> [scale for _, scale in uses], ir.to_text(unique[0])
([-2.0, -2.0, -2.0], 'mul(slice(sub(Vi(0,3), Vj(1,3)), 0, 1), exp(neg(sum(square(sub(Vi(0,3), Vj(1,3)))))))')
"""

from __future__ import annotations

from collections import Counter

from . import diff, ir
from .ops import apply
from .simplify import SLICE_THROUGH, simplify, simplify_step, slice_of


def _one_hot(node: ir.Node):
    """(c, v) when ``node`` is a constant of dimension > 1 with one nonzero entry v at c."""
    if node.op != "const" or node.dim < 2:
        return None
    nz = [(c, v) for c, v in enumerate(node.params) if v != 0.0]
    return nz[0] if len(nz) == 1 else None


def _component(a: ir.Node, c: int) -> ir.Node:
    """Component c of ``a`` (a itself when it is a scalar broadcast against a vector)."""
    return a if a.dim == 1 else slice_of(a, c, 1)


def _pad_of(node: ir.Node):
    """(inner, c, D) when ``node`` is a scalar padded to dimension D at c, else None."""
    if node.op == "pad" and node.args[0].dim == 1:
        return node.args[0], node.params[0], node.params[1]
    return None


def _pad(inner: ir.Node, c: int, D: int) -> ir.Node:
    if ir.const_value(inner) == 0.0:
        return ir.const([0.0] * D)
    return apply("pad", inner, params=(c, D))


def _sparse(node: ir.Node, args: tuple) -> ir.Node:
    """One step of the basis-derivative rewrite (see the module docstring)."""
    op = node.op
    if op == "const":
        hot = _one_hot(node)
        return _pad(ir.const(hot[1]), hot[0], node.dim) if hot else node
    if op == "var":
        return node
    pads = [_pad_of(a) for a in args]
    if op == "pad" and pads[0] is None:
        return node if args == node.args else ir.make(op, args, node.params, node.dim)
    if any(p is not None for p in pads):
        if op in ("add", "sub") and all(p is not None for p in pads) and \
                pads[0][1:] == pads[1][1:]:
            return _pad(simplify(apply(op, pads[0][0], pads[1][0])), *pads[0][1:])
        if op == "neg":
            return _pad(apply("neg", pads[0][0]), *pads[0][1:])
        if op == "sum":
            return pads[0][0]
        if op in ("mul", "div") and sum(p is not None for p in pads) == 1:
            k = 0 if pads[0] is not None else 1
            inner, c, D = pads[k]
            other = _component(args[1 - k], c)
            if op == "mul":
                pair = (inner, other) if k == 0 else (other, inner)
                return _pad(simplify(apply("mul", *pair)), c, D)
            if k == 0:  # pad(u) / b: only the padded component is not 0 / b
                return _pad(simplify(apply("div", inner, other)), c, D)
    return simplify_step(ir.make(op, args, node.params, node.dim) if args != node.args else node, args)


def basis_jvp(F: ir.Node, x: ir.Node, c: int) -> ir.Node:
    """``∂F/∂x_c`` (``x`` a variable, c a component), one-hot vectors rewritten away."""
    e = [0.0] * x.dim
    e[c] = 1.0
    t = diff.jvp(F, {x: ir.const(e)})
    t = ir.rebuild(t, _sparse)
    return simplify(t)


# ------------------------------------------------------------------ scales and products


def _factors(node: ir.Node):
    """(scale, Counter of factor nodes) with node == scale * Π factors (dimensions
    broadcast), looking through mul, neg, add(a, a) and scalar constants."""
    scale, out = 1.0, Counter()
    stack = [node]
    while stack:
        n = stack.pop()
        v = ir.const_value(n)
        if v is not None:
            scale *= v
        elif n.op == "mul":
            stack.extend(n.args)
        elif n.op == "neg":
            scale = -scale
            stack.append(n.args[0])
        elif n.op == "add" and n.args[0] is n.args[1]:
            scale *= 2.0
            stack.append(n.args[0])
        elif n.op == "div" and ir.const_value(n.args[1]) not in (None, 0.0):
            scale /= ir.const_value(n.args[1])
            stack.append(n.args[0])
        else:
            out[n] += 1
    return scale, out


def _products(F: ir.Node) -> list:
    """(Counter of factors, node) of the products formed by F, largest first."""
    found = {}
    for n in ir.topo_order(F):
        if n.op == "mul":
            scale, fac = _factors(n)
            if scale == 1.0 and sum(fac.values()) >= 2:
                found[n] = fac
    return sorted(((fac, n) for n, fac in found.items()), key=lambda p: -sum(p[0].values()))


def _contains(big: Counter, small: Counter) -> bool:
    return all(big[k] >= v for k, v in small.items())


def _product(nodes: list, dim: int) -> ir.Node:
    """The product of ``nodes`` (scalars first, then vectors), expanded to ``dim``."""
    nodes = sorted(nodes, key=lambda n: n.dim)
    out = nodes[0]
    for n in nodes[1:]:
        out = apply("mul", out, n)
    return out if out.dim == dim else apply("expand", out, params=(dim,))


def _shared(t: ir.Node, products: list):
    """(scale, node) with t == scale * node, node reusing the largest product of F."""
    scale, fac = _factors(t)
    if not fac:  # a constant tangent
        return scale, ir.const([1.0] * t.dim)
    parts = []
    for pf, pnode in products:
        if _contains(fac, pf):
            parts.append(pnode)
            fac = fac - pf
            break
    parts.extend(fac.elements())
    return scale, _product(parts, t.dim)


def _forward_components(F: ir.Node) -> dict:
    """{component pushed through its ops: slice of the forward's node} for the vector
    nodes of F built elementwise (``sub(slice(x, c), slice(y, c))`` is ``(x - y)[c]``,
    which the pair loop already holds)."""
    out = {}
    for n in ir.topo_order(F):
        if n.dim > 1 and n.op in SLICE_THROUGH:
            for c in range(n.dim):
                pushed = slice_of(n, c, 1)
                if pushed.op != "slice":
                    out.setdefault(pushed, ir.make("slice", (n,), (c, 1), 1))
    return out


def fused_tangents(F: ir.Node, tangents: list) -> tuple:
    """``(unique, uses)``: the distinct tangent formulas to sum, and for each tangent
    ``(index into unique, scale)`` (index -1: the tangent is 0) so that tangent k is
    ``scale * unique[index]``."""
    products = _products(F)
    components = _forward_components(F)
    unique: list = []
    where: dict = {}
    uses = []
    for t in tangents:
        t = simplify(t)
        if ir.const_value(t) == 0.0:
            uses.append((-1, 0.0))
            continue
        scale, node = _shared(t, products)
        if components:
            node = ir.substitute(node, components)
        if node not in where:
            where[node] = len(unique)
            unique.append(node)
        uses.append((where[node], scale))
    return unique, uses
