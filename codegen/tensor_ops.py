"""Tensors stored row-major in the vector dimension: matrix products, tensordot, Kronecker.

The ``matmul`` op multiplies an ``n×k`` matrix by a ``k×m`` one (both row-major vectors);
:func:`tensordot` and :func:`kron` are compositions of it with ``gather`` (static index
maps) and ``tensorprod``, so their derivatives and references come from those ops.
``tensordot`` follows KeOps's ``TensorDot(a, b, dimfa, dimfb, contfa, contfb, permute)``:
the free axes of ``a`` then those of ``b``, and ``permute[k]`` is the position in the
output of that result's axis ``k``.

>>> from lazytensor.codegen import ir
>>> A, B = ir.var(0, 6, "i"), ir.var(1, 12, "j")
>>> ops.apply("matmul", A, B, params=(3,)).dim      # (2×3) @ (3×4)
8
>>> tensordot(A, B, (2, 3), (3, 4), (1,), (0,), (1, 0)).dim
8
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import ir, ops
from .ops import OpDef, register


def _matmul_dim(dims, params):
    (inner,) = params
    a, b = dims
    if inner < 1 or a % inner or b % inner:
        raise ValueError(f"matmul: operands of dimensions {a} and {b} are not n×{inner} and "
                         f"{inner}×m matrices")
    return (a // inner) * (b // inner)


def _matmul_shape(node: ir.Node):
    inner = node.params[0]
    return node.args[0].dim // inner, inner, node.args[1].dim // inner


def _matmul_emit(node, out, args, dtype):
    n, k, m = _matmul_shape(node)
    return (f"for (int r = 0; r < {n}; ++r) for (int c = 0; c < {m}; ++c) {{ T s = 0; "
            f"for (int q = 0; q < {k}; ++q) s += {args[0]}[r * {k} + q] * {args[1]}[q * {m} + c]; "
            f"{out}[r * {m} + c] = s; }}")


def _matmul_ref(xp, t, p):
    a, b = t
    k = int(p[0])
    n, m = a.shape[-1] // k, b.shape[-1] // k
    prod = a.reshape(*a.shape[:-1], n, k) @ b.reshape(*b.shape[:-1], k, m)
    return prod.reshape(*prod.shape[:-2], n * m)


def transpose(a: ir.Node, rows: int, cols: int) -> ir.Node:
    """The transpose of a ``rows×cols`` row-major matrix (a ``gather``)."""
    return gather(a, np.arange(rows * cols).reshape(rows, cols).T.reshape(-1))


def gather(a: ir.Node, index) -> ir.Node:
    """``a[index]`` over the vector dimension; the identity map returns ``a`` itself."""
    index = tuple(int(k) for k in index)
    if index == tuple(range(a.dim)):
        return a
    return ops.apply("gather", a, params=(index,))


def _matmul_vjp(node, g):
    a, b = node.args
    n, k, m = _matmul_shape(node)
    # C = A B: dA = G Bᵀ (inner m), dB = Aᵀ G (inner n)
    return [ops.apply("matmul", g, transpose(b, k, m), params=(m,)),
            ops.apply("matmul", transpose(a, n, k), g, params=(n,))]


def _matmul_jvp(node, t):
    a, b = node.args
    terms = []
    if t[0] is not None:
        terms.append(ops.apply("matmul", t[0], b, params=node.params))
    if t[1] is not None:
        terms.append(ops.apply("matmul", a, t[1], params=node.params))
    if not terms:
        return None
    return terms[0] if len(terms) == 1 else ops.apply("add", *terms)


register(OpDef(
    "matmul", 2, _matmul_dim, _matmul_emit, ref=_matmul_ref, vjp=_matmul_vjp, jvp=_matmul_jvp,
    doc="A (n×k) @ B (k×m), row-major, params (k,)",
))


# ---------------------------------------------------------------------------- compositions


def _ints(values, what: str) -> tuple:
    if isinstance(values, (int, np.integer)):
        values = (values,)
    try:
        return tuple(int(v) for v in values)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a sequence of integers, got {values!r}") from None


def tensordot(a: ir.Node, b: ir.Node, dims_a: Sequence[int], dims_b: Sequence[int],
              cont_a: Sequence[int], cont_b: Sequence[int],
              permute: Sequence[int] | None = None) -> ir.Node:
    """``numpy.tensordot(a, b, (cont_a, cont_b))`` of tensors of shapes ``dims_a`` and
    ``dims_b`` stored in the vector dimension, then its axes moved as KeOps's
    ``permute`` says (axis ``k`` of the tensordot goes to position ``permute[k]``).
    """
    da, db = _ints(dims_a, "dimfa"), _ints(dims_b, "dimfb")
    ca, cb = _ints(cont_a, "contfa"), _ints(cont_b, "contfb")
    if int(np.prod(da)) != a.dim or int(np.prod(db)) != b.dim:
        raise ValueError(f"TensorDot: shapes {list(da)} and {list(db)} do not match operands of "
                         f"dimensions {a.dim} and {b.dim}")
    if len(ca) != len(cb) or len(set(ca)) != len(ca) or len(set(cb)) != len(cb) or any(
            not (0 <= p < len(da) and 0 <= q < len(db)) or da[p] != db[q] for p, q in zip(ca, cb)):
        raise ValueError(f"TensorDot: cannot contract axes {list(ca)} of {list(da)} with axes "
                         f"{list(cb)} of {list(db)}")
    free_a = [k for k in range(len(da)) if k not in ca]
    free_b = [k for k in range(len(db)) if k not in cb]
    inner = int(np.prod([da[p] for p in ca]))
    # a as a (free_a × contracted) matrix, b as (contracted × free_b): one matmul
    a_mat = gather(a, np.arange(a.dim).reshape(da).transpose(free_a + list(ca)).reshape(-1))
    b_mat = gather(b, np.arange(b.dim).reshape(db).transpose(list(cb) + free_b).reshape(-1))
    if ca:
        out = ops.apply("matmul", a_mat, b_mat, params=(inner,))
    else:
        out = ops.apply("tensorprod", a_mat, b_mat)
    shape = [da[k] for k in free_a] + [db[k] for k in free_b]
    if permute is None:
        return out
    perm = _ints(permute, "permute")
    if sorted(perm) != list(range(len(shape))):
        raise ValueError(f"TensorDot: permute {list(perm)} is not a permutation of the "
                         f"{len(shape)} output axes")
    # output axis k holds the tensordot's axis argsort(perm)[k]
    return gather(out, np.arange(out.dim).reshape(shape or [1]).transpose(
        np.argsort(perm) if shape else [0]).reshape(-1))


def kron(a: ir.Node, b: ir.Node, dims_a: Sequence[int], dims_b: Sequence[int]) -> ir.Node:
    """The Kronecker product of tensors of shapes ``dims_a`` and ``dims_b`` (same number of
    axes) stored in the vector dimension: shape ``(a0*b0, a1*b1, ...)``, as ``numpy.kron``.
    """
    da, db = _ints(dims_a, "dimfa"), _ints(dims_b, "dimfb")
    if len(da) != len(db):
        raise ValueError(f"Kron: shapes {list(da)} and {list(db)} have different numbers of axes")
    n = len(da)
    # tensorprod's axes (a0..an-1, b0..bn-1) interleaved as (a0, b0, a1, b1, ...)
    order = [k for pair in zip(range(n), range(n, 2 * n)) for k in pair]
    return tensordot(a, b, da, db, (), (), np.argsort(order))
