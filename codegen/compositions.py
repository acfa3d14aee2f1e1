"""Conveniences written once as compositions of registered ops.

The formula parser (``SqDist(x, y)``, ``Mod(f, m, o)``, ``TensorDot(a, b, ...)``) and the
``LazyTensor`` methods (``x.sqdist(y)``, ``x.mod(m, o)``, ``x.keops_tensordot(...)``) build
their formulas with these functions, so both produce the same IR (and share kernels).
Each takes and returns IR nodes; static arguments are Python numbers and tuples.

>>> from lazytensor.codegen import ir
>>> x, y = ir.var(0, 3, "i"), ir.var(1, 3, "j")
>>> ir.to_text(sqdist(x, y))
'sum(mul(sub(Vi(0,3), Vj(1,3)), sub(Vi(0,3), Vj(1,3))))'
>>> kron_indices((2,), (3,))
(0, 1, 2, 3, 4, 5)
"""

from __future__ import annotations

import math

import numpy as np

from . import ir
from .ops import apply


def concat(nodes) -> ir.Node:
    """``concat(concat(n0, n1), n2) ...``: the nodes side by side, in order."""
    out = nodes[0]
    for n in nodes[1:]:
        out = apply("concat", out, n)
    return out


def dot(a: ir.Node, b: ir.Node) -> ir.Node:
    """``Σ_k a_k b_k`` (``(a | b)``, ``Scalprod``)."""
    return apply("sum", apply("mul", a, b))


def sqnorm2(a: ir.Node) -> ir.Node:
    """``Σ_k a_k²``."""
    return apply("sum", apply("mul", a, a))


def norm2(a: ir.Node) -> ir.Node:
    """``sqrt(Σ_k a_k²)``."""
    return apply("sqrt", sqnorm2(a))


def normalize(a: ir.Node) -> ir.Node:
    """``a / |a|``, as ``a * rsqrt(|a|²)``."""
    return apply("mul", a, apply("rsqrt", sqnorm2(a)))


def sqdist(a: ir.Node, b: ir.Node) -> ir.Node:
    """``|a - b|²`` (the CPU backend recognizes this form for its GEMM path)."""
    return sqnorm2(apply("sub", a, b))


def weightedsqnorm(s: ir.Node, x: ir.Node) -> ir.Node:
    """``Σ_k s_k x_k²`` (``s`` of dimension 1 or D) or ``xᵀ S x`` (``s`` of dimension D²,
    row-major)."""
    D = x.dim
    if s.dim in (1, D):
        return apply("sum", apply("mul", apply("mul", s, x), x))
    if s.dim == D * D:
        return apply("sum", apply("mul", x, apply("matvec", s, x)))
    raise ValueError(f"weightedsqnorm: weight of dimension {s.dim} for vectors of dimension {D} "
                     f"(expected 1, {D} or {D * D})")


def weightedsqdist(s: ir.Node, x: ir.Node, y: ir.Node) -> ir.Node:
    """``weightedsqnorm(s, x - y)``."""
    return weightedsqnorm(s, apply("sub", x, y))


def power(f: ir.Node, p: float) -> ir.Node:
    """``f ** p`` for a static exponent: ``square`` for 2, else ``pow``."""
    p = float(p)
    return apply("square", f) if p == 2.0 else apply("pow", f, params=(p,))


def powf(f: ir.Node, g: ir.Node) -> ir.Node:
    """``f ** g`` for a formula exponent: ``exp(log(f) g)``."""
    return apply("exp", apply("mul", apply("log", f), g))


def mod(f: ir.Node, modulus: ir.Node, offset: ir.Node) -> ir.Node:
    """``f - modulus * floor((f - offset) / modulus)``, in ``[offset, offset + modulus)``."""
    return apply("sub", f, apply("mul", modulus, apply("floor",
                                                       apply("div", apply("sub", f, offset), modulus))))


def round_to(f: ir.Node, decimals: int) -> ir.Node:
    """``f`` rounded half away from zero to ``decimals`` decimals."""
    d = int(decimals)
    if d == 0:
        return apply("round", f)
    if abs(d) > 300:
        raise ValueError(f"Round: {d} decimals is out of range")
    s = ir.const(float(10 ** d) if d > 0 else 10.0 ** d)
    return apply("div", apply("round", apply("mul", f, s)), s)


def _shape(dims, what: str) -> tuple:
    dims = tuple(int(d) for d in np.atleast_1d(dims))
    if not dims or any(d < 1 for d in dims):
        raise ValueError(f"{what}: a shape of positive integers, got {dims}")
    return dims


def _check_size(f: ir.Node, dims: tuple, what: str):
    if f.dim != math.prod(dims):
        raise ValueError(f"{what}: shape {dims} holds {math.prod(dims)} values, the formula has "
                         f"dimension {f.dim}")


def kron_indices(dima, dimb) -> tuple:
    """Components of ``tensorprod(a, b)`` (index ``ia * |b| + ib``) in the order of
    ``numpy.kron`` of ``a`` and ``b`` reshaped row-major to ``dima`` and ``dimb``."""
    da, db = _shape(dima, "Kron"), _shape(dimb, "Kron")
    if len(da) != len(db):
        raise ValueError(f"Kron: shapes {da} and {db} have different numbers of axes")
    ia = np.arange(math.prod(da)).reshape(da)
    ib = np.arange(math.prod(db)).reshape(db)
    flat = np.kron(ia * math.prod(db), np.ones(db, dtype=np.int64)) + np.kron(
        np.ones(da, dtype=np.int64), ib)
    return tuple(int(k) for k in flat.reshape(-1))


def kron(a: ir.Node, b: ir.Node, dima, dimb) -> ir.Node:
    """Kronecker product of ``a`` and ``b`` stored row-major with shapes ``dima``, ``dimb``
    (same number of axes); the result has shape ``(d0*e0, d1*e1, ...)``, row-major."""
    index = kron_indices(dima, dimb)
    _check_size(a, _shape(dima, "Kron"), "Kron")
    _check_size(b, _shape(dimb, "Kron"), "Kron")
    return apply("gather", apply("tensorprod", a, b), params=(index,))


def tensordot_indices(dima, dimb, conta, contb) -> tuple:
    """``(ia, ib)``: for each contracted multi-index c (row-major), the components of
    ``a`` (free axes, row-major) and of ``b`` (free axes) to multiply as an outer product."""
    da, db = _shape(dima, "TensorDot"), _shape(dimb, "TensorDot")
    ca = tuple(int(c) for c in np.atleast_1d(conta))
    cb = tuple(int(c) for c in np.atleast_1d(contb))
    if (len(ca) != len(cb) or any(not 0 <= p < len(da) for p in ca)
            or any(not 0 <= q < len(db) for q in cb) or any(da[p] != db[q] for p, q in zip(ca, cb))):
        raise ValueError(f"TensorDot: cannot contract axes {ca} of {da} with {cb} of {db}")
    fa = [k for k in range(len(da)) if k not in ca]
    fb = [k for k in range(len(db)) if k not in cb]
    nc = math.prod(da[p] for p in ca)
    ia = np.arange(math.prod(da)).reshape(da).transpose(fa + list(ca)).reshape(-1, nc)
    ib = np.arange(math.prod(db)).reshape(db).transpose(list(cb) + fb).reshape(nc, -1)
    return (tuple(tuple(int(k) for k in ia[:, c]) for c in range(nc)),
            tuple(tuple(int(k) for k in ib[c, :]) for c in range(nc)))


def tensordot(a: ir.Node, b: ir.Node, dima, dimb, conta, contb) -> ir.Node:
    """``numpy.tensordot`` of ``a`` and ``b`` stored row-major with shapes ``dima``, ``dimb``,
    contracting axes ``conta`` of ``a`` with ``contb`` of ``b``: the free axes of ``a``, then
    those of ``b``, row-major."""
    cols, rows = tensordot_indices(dima, dimb, conta, contb)
    _check_size(a, _shape(dima, "TensorDot"), "TensorDot")
    _check_size(b, _shape(dimb, "TensorDot"), "TensorDot")
    total = None
    for col, row in zip(cols, rows):
        term = apply("tensorprod", apply("gather", a, params=(col,)),
                     apply("gather", b, params=(row,)))
        total = term if total is None else apply("add", total, term)
    return total
