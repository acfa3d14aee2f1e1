"""Simplification, a pass of its own: neutral elements, zeros, constant folding; and the
distribution of dot products over sums (:func:`distribute_dots`).

Gradient formulas come out of the VJP rules full of ``* 1``, ``+ 0`` and constant
subexpressions; this pass removes them before emission. Common subterms are already
shared by hash-consing. Rewrites keep each node's dimension (a dimension-1 result that
replaces a dimension-D node is expanded).

>>> from lazytensor.codegen import ir, ops
>>> x = ir.var(0, 3, "i")
>>> simplify(ops.apply("mul", x, ir.const(1.0))) is x
True
"""

from __future__ import annotations

import numpy as np

from . import ir
from .ops import apply, get


def _is(node: ir.Node, value: float) -> bool:
    return ir.const_value(node) == value


def _fit(new: ir.Node, dim: int) -> ir.Node:
    if new.dim == dim:
        return new
    if new.dim == 1:
        if new.op == "const":
            return ir.const([new.params[0]] * dim)
        return apply("expand", new, params=(dim,))
    raise AssertionError("simplification changed a dimension")


def _fold(node: ir.Node, args) -> ir.Node | None:
    if node.op in ("var", "const") or not args or not all(a.op == "const" for a in args):
        return None
    from .arraymath import numpy_namespace

    arrays = [np.asarray(a.params, dtype=np.float64) for a in args]
    with np.errstate(all="ignore"):
        value = np.asarray(get(node.op).ref(numpy_namespace(), arrays, node.params), dtype=np.float64)
    return ir.const(np.broadcast_to(value.reshape(-1), (node.dim,)).tolist())


def _rewrite(node: ir.Node, args: tuple) -> ir.Node:
    if node.op in ("var", "const"):
        return node
    folded = _fold(node, args)
    if folded is not None:
        return folded
    op = node.op
    if op == "add":
        a, b = args
        if _is(a, 0.0):
            return _fit(b, node.dim)
        if _is(b, 0.0):
            return _fit(a, node.dim)
    elif op == "sub":
        a, b = args
        if _is(b, 0.0):
            return _fit(a, node.dim)
        if _is(a, 0.0):
            return _fit(apply("neg", b), node.dim)
    elif op == "mul":
        a, b = args
        # x * 0 -> 0 follows KeOps: gradient formulas multiply by structural zeros.
        if _is(a, 0.0) or _is(b, 0.0):
            return ir.const([0.0] * node.dim)
        if _is(a, 1.0):
            return _fit(b, node.dim)
        if _is(b, 1.0):
            return _fit(a, node.dim)
        if _is(a, -1.0):
            return _fit(apply("neg", b), node.dim)
        if _is(b, -1.0):
            return _fit(apply("neg", a), node.dim)
    elif op == "div":
        a, b = args
        if _is(b, 1.0):
            return _fit(a, node.dim)
        if _is(a, 0.0):
            return ir.const([0.0] * node.dim)
    elif op == "neg":
        if args[0].op == "neg":
            return args[0].args[0]
    elif op == "pow":
        (p,) = node.params
        if p == 1.0:
            return args[0]
    elif op in ("sum", "expand", "matvec", "vecmat", "tensorprod", "slice", "pad"):
        if any(_is(a, 0.0) for a in args):
            return ir.const([0.0] * node.dim)
        if op == "sum" and args[0].dim == 1:
            return args[0]
        if op == "slice":
            return _slice(args[0], *node.params)
    if args == node.args:
        return node
    return ir.make(op, args, node.params, node.dim)


SLICE_THROUGH = ("add", "sub", "mul", "div", "neg")  # elementwise: slicing commutes


def _slice(x: ir.Node, start: int, length: int, depth: int = 0) -> ir.Node:
    """``slice(x, start, length)`` with the slice pushed into concatenations, pads,
    slices and elementwise operations (gradient formulas are full of ``slice(concat(f, w))``
    and ``slice(pad(g) + pad(h))``, which hide scalar products from the CPU plan)."""
    if start == 0 and length == x.dim:
        return x
    op = x.op
    if depth < 32:
        if op == "slice":
            return _slice(x.args[0], x.params[0] + start, length, depth + 1)
        if op == "concat":
            a, b = x.args
            if start + length <= a.dim:
                return _slice(a, start, length, depth + 1)
            if start >= a.dim:
                return _slice(b, start - a.dim, length, depth + 1)
        if op == "pad":
            (inner,), (off, _) = x.args, x.params
            if start >= off and start + length <= off + inner.dim:
                return _slice(inner, start - off, length, depth + 1)
            if start + length <= off or start >= off + inner.dim:
                return ir.const([0.0] * length)
        if op == "expand":
            return _fit(x.args[0], length)
        if op in SLICE_THROUGH:
            parts = tuple(a if a.dim == 1 else _slice(a, start, length, depth + 1) for a in x.args)
            new = ir.make(op, parts, x.params, length)
            return _rewrite(new, parts)
        if op == "const":
            return ir.const(list(x.params[start:start + length]))
    return ir.make("slice", (x,), (start, length), length)


def simplify(root: ir.Node) -> ir.Node:
    """Return an equivalent, smaller formula (same dimension)."""
    return ir.rebuild(root, _rewrite)


def simplify_step(node: ir.Node, args: tuple) -> ir.Node:
    """``node`` with its (already simplified) ``args``, folded and simplified at the top
    only: the step :func:`simplify` applies to every node, for other rewrites to reuse.

    >>> x = ir.var(0, 2, "i")
    >>> simplify_step(ir.make("add", (x, ir.const([0.0, 0.0])), (), 2), (x, ir.const([0.0, 0.0]))) is x
    True
    """
    return _rewrite(node, args)


def slice_of(x: ir.Node, start: int, length: int) -> ir.Node:
    """``slice(x, start, length)``, pushed into concatenations, pads and elementwise ops.

    >>> a, b = ir.var(0, 2, "i"), ir.var(1, 3, "j")
    >>> slice_of(ir.make("concat", (a, b), (), 5), 2, 3) is b
    True
    """
    return _slice(x, start, length)


def distribute_dots(formula: ir.Node, min_dim: int, max_dim: int) -> ir.Node:
    """``⟨A, B ± C⟩`` -> ``⟨A, B⟩ ± ⟨A, C⟩`` for dimensions in ``[min_dim, max_dim]`` when A
    is on one side (i or j) and B, C on different ones: gradients of softmax-weighted sums
    read ``⟨g_i, v_j - out_i⟩``, a dot product in disguise (and the CPU backend runs dot
    products of one side against the other as a small GEMM)."""
    memo: dict = {}  # node -> its variables' categories (nodes are hash-consed)

    def cats(n):
        c = memo.get(n)
        if c is None:  # built bottom-up: the arguments are already known
            c = {n.cat} if n.op == "var" else set().union(*(cats(a) for a in n.args))
            memo[n] = c
        return c

    def fn(node, args):
        new = node if args == node.args else ir.make(node.op, args, node.params, node.dim)
        if new.op != "sum" or not min_dim <= args[0].dim <= max_dim:
            return new
        m = args[0]
        if m.op != "mul" or m.args[0].dim != m.args[1].dim:
            return new
        for a, s in (m.args, m.args[::-1]):
            ca = cats(a)
            if s.op in ("add", "sub") and s.args[0].dim == s.args[1].dim == a.dim \
                    and not ("i" in ca and "j" in ca):
                x, y = s.args
                cx, cy = cats(x), cats(y)
                if ("j" in cx) != ("j" in cy) or ("i" in cx) != ("i" in cy):
                    left = apply("sum", apply("mul", a, x))
                    right = apply("sum", apply("mul", a, y))
                    return apply(s.op, left, right)
        return new

    return ir.rebuild(formula, fn)
