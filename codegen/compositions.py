"""Conveniences written once as compositions of registered ops.

The formula parser (``SqDist(x, y)``, ``Mod(f, m, o)``, ``TensorDot(a, b, ...)``) and the
``LazyTensor`` methods (``x.sqdist(y)``, ``x.mod(m, o)``, ``x.keops_tensordot(...)``) build
their formulas with these functions, so both produce the same IR (and share kernels).
Each takes and returns IR nodes; static arguments are Python numbers and tuples. B-spline
bases and soft-DTW are compositions too (short vectors, as in KeOps): their forward code,
derivatives and references all come from the ops they are made of.

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


_POWER_OPS = {2.0: "square", 0.5: "sqrt", -0.5: "rsqrt"}  # as pykeops's x ** p


def power(f: ir.Node, p: float) -> ir.Node:
    """``f ** p`` for a static exponent: ``square``, ``sqrt`` and ``rsqrt`` (0 at 0) for 2,
    0.5 and -0.5 (as pykeops), else ``pow``."""
    p = float(p)
    return apply(_POWER_OPS[p], f) if p in _POWER_OPS else apply("pow", f, params=(p,))


def powf(f: ir.Node, g: ir.Node) -> ir.Node:
    """``f ** g`` for a formula exponent, as C ``pow`` (the ``powf`` op)."""
    return apply("powf", f, g)


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


def tensordot(a: ir.Node, b: ir.Node, dima, dimb, conta, contb, permute=None) -> ir.Node:
    """``numpy.tensordot`` of ``a`` and ``b`` stored row-major with shapes ``dima``, ``dimb``,
    contracting axes ``conta`` of ``a`` with ``contb`` of ``b``: the free axes of ``a``, then
    those of ``b``, row-major; then moved as KeOps's ``permute`` says (the result's axis
    ``k`` goes to position ``permute[k]``).

    One ``matmul`` of ``a`` as a (free × contracted) matrix by ``b`` as (contracted × free),
    both ``gather``-ed into place (a ``tensorprod`` when nothing is contracted).
    """
    da, db = _shape(dima, "TensorDot"), _shape(dimb, "TensorDot")
    ca = tuple(int(c) for c in np.atleast_1d(conta))
    cb = tuple(int(c) for c in np.atleast_1d(contb))
    if (len(ca) != len(cb) or len(set(ca)) != len(ca) or len(set(cb)) != len(cb)
            or any(not 0 <= p < len(da) for p in ca) or any(not 0 <= q < len(db) for q in cb)
            or any(da[p] != db[q] for p, q in zip(ca, cb))):
        raise ValueError(f"TensorDot: cannot contract axes {ca} of {da} with {cb} of {db}")
    _check_size(a, da, "TensorDot")
    _check_size(b, db, "TensorDot")
    fa = [k for k in range(len(da)) if k not in ca]
    fb = [k for k in range(len(db)) if k not in cb]
    a_mat = _gather(a, np.arange(a.dim).reshape(da).transpose(fa + list(ca)).reshape(-1))
    b_mat = _gather(b, np.arange(b.dim).reshape(db).transpose(list(cb) + fb).reshape(-1))
    if ca:
        out = apply("matmul", a_mat, b_mat, params=(math.prod(da[p] for p in ca),))
    else:
        out = apply("tensorprod", a_mat, b_mat)
    if permute is None:
        return out
    shape = [da[k] for k in fa] + [db[k] for k in fb]
    perm = tuple(int(k) for k in np.atleast_1d(permute))
    if sorted(perm) != list(range(len(shape))):
        raise ValueError(f"TensorDot: permute {perm} is not a permutation of the {len(shape)} "
                         "output axes")
    if not shape:
        return out
    return _gather(out, np.arange(out.dim).reshape(shape).transpose(np.argsort(perm)).reshape(-1))


def _gather(a: ir.Node, index) -> ir.Node:
    """``a[index]`` over the vector dimension; the identity map returns ``a`` itself."""
    index = tuple(int(k) for k in index)
    return a if index == tuple(range(a.dim)) else apply("gather", a, params=(index,))


def concat_all(parts: list) -> ir.Node:
    """Concatenation of several vectors, balanced (a chain copies O(n²) components)."""
    if len(parts) == 1:
        return parts[0]
    half = len(parts) // 2
    return apply("concat", concat_all(parts[:half]), concat_all(parts[half:]))


def _component(v: ir.Node, k: int) -> ir.Node:
    return apply("slice", v, params=(k, 1))


def bspline(knots: ir.Node, x: ir.Node, order: int) -> ir.Node:
    """The ``n - order - 1`` B-spline basis functions of degree ``order`` on the ``n`` knots
    ``knots`` (non-decreasing), at the scalar ``x``: KeOps's ``BSpline(knots, x, order)``.

    Order 0 is the indicator of ``t_j <= x < t_{j+1}``; each order up uses de Boor's
    recursion ``B_{i,p} = w_{i,p} B_{i,p-1} + (1 - w_{i+1,p}) B_{i+1,p-1}`` with
    ``w_{i,p} = (x - t_i) / (t_{i+p} - t_i)``, and 0 where ``t_i == t_{i+p}``. The formula
    has about ``5 n · order`` nodes.
    """
    if isinstance(order, bool) or not isinstance(order, int) or order < 0:
        raise ValueError(f"BSpline: the order must be a non-negative integer, got {order!r}")
    if x.dim != 1:
        raise ValueError(f"BSpline: x must be a scalar formula, got dimension {x.dim}")
    if knots.dim < order + 2:
        raise ValueError(f"BSpline of order {order} needs at least {order + 2} knots, got "
                         f"{knots.dim}")
    t = [_component(knots, k) for k in range(knots.dim)]
    basis = [apply("mul", apply("ge", x, t[j]), apply("lt", x, t[j + 1]))
             for j in range(knots.dim - 1)]
    one = ir.const(1.0)

    def weight(i, p):
        distinct = apply("lt", t[i], t[i + p])  # 1 or 0: the span is not empty
        span = apply("add", apply("sub", t[i + p], t[i]), apply("sub", one, distinct))
        return apply("mul", distinct, apply("div", apply("sub", x, t[i]), span))

    for p in range(1, order + 1):
        w = [weight(i, p) for i in range(len(basis))]
        basis = [apply("add", apply("mul", w[i], basis[i]),
                       apply("mul", apply("sub", one, w[i + 1]), basis[i + 1]))
                 for i in range(len(basis) - 1)]
    return concat_all(basis)


MAX_SOFTDTW_CELLS = 1024  # n · m: the formula has about 20 nodes per cell


def softdtw_sqdist(x: ir.Node, y: ir.Node, gamma: ir.Node) -> ir.Node:
    """Soft-DTW between the sequences ``x`` (n) and ``y`` (m) for the squared difference,
    with smoothing ``gamma`` (scalar): KeOps's ``SoftDTW_SqDist(x, y, gamma)``.

    ``r[i][j] = (x_i - y_j)² + softmin(r[i-1][j-1], r[i-1][j], r[i][j-1])`` with
    ``softmin(a, b, c) = m - gamma log Σ exp((m - .) / gamma)``, ``m = min(a, b, c)``;
    the result is ``r[n-1][m-1]``. Differentiable in ``x``, ``y`` and ``gamma``.
    """
    if gamma.dim != 1:
        raise ValueError(f"SoftDTW_SqDist: gamma must be a scalar formula, got dimension "
                         f"{gamma.dim}")
    n, m = x.dim, y.dim
    if n * m > MAX_SOFTDTW_CELLS:
        raise ValueError(f"SoftDTW_SqDist: sequences of lengths {n} and {m} need {n * m} cells; "
                         f"at most {MAX_SOFTDTW_CELLS} are supported")
    xs = [_component(x, i) for i in range(n)]
    ys = [_component(y, j) for j in range(m)]

    def cost(i, j):
        return apply("square", apply("sub", xs[i], ys[j]))

    def softmin(a, b, c):
        low = apply("min2", apply("min2", a, b), c)
        total = None
        for v in (a, b, c):
            term = apply("exp", apply("div", apply("sub", low, v), gamma))
            total = term if total is None else apply("add", total, term)
        return apply("sub", low, apply("mul", gamma, apply("log", total)))

    prev = []  # r[.][j-1]
    for j in range(m):
        col = []
        for i in range(n):
            if i == 0 and j == 0:
                r = cost(0, 0)
            elif j == 0:
                r = apply("add", cost(i, 0), col[i - 1])
            elif i == 0:
                r = apply("add", cost(0, j), prev[0])
            else:
                r = apply("add", cost(i, j), softmin(prev[i - 1], col[i - 1], prev[i]))
            col.append(r)
        prev = col
    return prev[n - 1]
