"""Large vector dimensions on the GPU: sums over the vector chunked through shared memory.

A formula such as ``exp(-|x_i - y_j|²)`` with D = 784 would keep 784-wide temporaries per
thread: local memory. Every node wider than :data:`CHUNK_MIN_DIM` in such formulas is
inside a *vector sum* ``sum(E)`` whose body E is elementwise over variables (and
constants) of that dimension. :func:`plan_chunks` rewrites the formula so that each vector
sum becomes a per-pair scalar, computed by the kernel in chunks of the vector dimension:
the chunk of the block's rows (x_i) and of a tile of j-rows (y_j) is staged in shared
memory, and each thread adds ``E(x_i[d], y_j[d])`` for its row and every j of the tile
into registers. What is left (``exp(-s)``) is a narrow formula of those scalars.

>>> from lazytensor.codegen import ir, ops
>>> x, y = ir.var(0, 784, "i"), ir.var(1, 784, "j")
>>> d2 = ops.apply("sum", ops.apply("square", ops.apply("sub", x, y)))
>>> plan = plan_chunks(ops.apply("exp", ops.apply("neg", d2)), 2)
>>> plan.formula.dim, [(s.dim, [l.index for l in s.leaves]) for s in plan.sums]
(1, [(784, [0, 1])])
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import elementwise, ir, ops

CHUNK_MIN_DIM = 32  # vector sums at least this wide are chunked
NARROW = 16  # what the rest of the formula may hold per node


@dataclass(frozen=True)
class VectorSum:
    """``sum(E)`` over a vector of ``dim`` components, E elementwise in ``leaves``."""

    var: ir.Node  # the per-pair scalar standing for the sum in the rewritten formula
    term: ir.Node  # E with each leaf replaced by a scalar placeholder (see ``scalars``)
    leaves: tuple  # the variables E reads (dim ``dim`` or 1), in placeholder order
    scalars: tuple  # placeholder variables (dimension 1) of ``term``, one per leaf
    dim: int


@dataclass(frozen=True)
class ChunkedSums:
    formula: ir.Node  # the narrow rest, reading ``VectorSum.var`` for each sum
    sums: tuple  # of VectorSum


def _elementwise_body(node: ir.Node, dim: int):
    """The leaves (variables) of an elementwise expression of dimension ``dim``, or None."""
    leaves, stack, seen = [], [node], set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.op == "var":
            if n.dim not in (dim, 1):
                return None
            leaves.append(n)
        elif n.op == "const":
            if n.dim not in (dim, 1) or ir.const_value(n) is None:
                return None  # a vector of distinct constants: not worth a chunked read
        elif n.op in elementwise.ELEMENTWISE and n.dim in (dim, 1):
            stack.extend(n.args)
        else:
            return None
    return sorted(set(leaves), key=lambda v: (v.index, v.cat))


def plan_chunks(formula: ir.Node, n_vars: int) -> ChunkedSums | None:
    """The chunked form of ``formula``, or None when it has nothing to chunk or keeps wide
    values outside vector sums (then the kernel evaluates it directly)."""
    next_index = max([v.index + 1 for v in ir.variables(formula)] + [n_vars])
    sums, mapping = [], {}
    for node in ir.topo_order(formula):
        if node.op != "sum" or node.args[0].dim < CHUNK_MIN_DIM or node in mapping:
            continue
        body = node.args[0]
        leaves = _elementwise_body(body, body.dim)
        if leaves is None:
            continue
        scalars = tuple(ir.var(next_index + k, 1, v.cat) for k, v in enumerate(leaves))
        next_index += len(leaves)
        term = _scalarize(body, dict(zip(leaves, scalars)))
        var = ir.var(next_index, 1, "j")
        next_index += 1
        sums.append(VectorSum(var, term, tuple(leaves), scalars, body.dim))
        mapping[node] = var
    if not sums:
        return None
    rest = ir.substitute(formula, mapping)
    if any(n.dim > NARROW for n in ir.topo_order(rest)):
        return None
    return ChunkedSums(rest, tuple(sums))


def _scalarize(body: ir.Node, scalars: dict) -> ir.Node:
    """``body`` rebuilt on scalar placeholders: the same elementwise code, one component."""
    def fn(node, args):
        if node.op == "var":
            return scalars[node]
        if node.op == "const":
            return ir.const(ir.const_value(node))
        return ops.apply(node.op, *args, params=node.params)

    return ir.rebuild(body, fn)


__all__ = ["CHUNK_MIN_DIM", "ChunkedSums", "VectorSum", "plan_chunks"]
