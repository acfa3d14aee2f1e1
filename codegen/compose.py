"""Formulas built from other ops: B-spline bases (de Boor) and soft-DTW (a dynamic program).

Each function returns IR made of registered ops (slices, comparisons, products, ``min2``,
``log``, ``exp``), so forward code, VJP, JVP and the NumPy reference all come from those
ops: nothing here is emitted by hand. The formulas grow with the sizes (``n_knots · order``
terms for a B-spline basis, ``n · m`` cells for soft-DTW), which suits the short vectors
these operations take in KeOps.

>>> from lazytensor.codegen import ir
>>> knots, x = ir.var(0, 6, "j"), ir.var(1, 1, "i")
>>> bspline(knots, x, 2).dim                       # 6 knots, order 2: 3 basis functions
3
>>> softdtw_sqdist(ir.var(0, 4, "i"), ir.var(1, 3, "j"), ir.const(0.1)).dim
1
"""

from __future__ import annotations

from . import ir, ops

MAX_SOFTDTW_CELLS = 1024  # n · m: the formula has about 20 nodes per cell


def _a(name, *args, params=()):
    return ops.apply(name, *args, params=params)


def _component(v: ir.Node, k: int) -> ir.Node:
    return _a("slice", v, params=(k, 1))


def concat_all(parts: list) -> ir.Node:
    """Concatenation of several vectors, balanced (a chain copies O(n²) components)."""
    if len(parts) == 1:
        return parts[0]
    half = len(parts) // 2
    return _a("concat", concat_all(parts[:half]), concat_all(parts[half:]))


def bspline(knots: ir.Node, x: ir.Node, order: int) -> ir.Node:
    """The ``n - order - 1`` B-spline basis functions of degree ``order`` on the ``n`` knots
    ``knots`` (non-decreasing), at the scalar ``x``: KeOps's ``BSpline(knots, x, order)``.

    Order 0 is the indicator of ``t_j <= x < t_{j+1}``; each order up uses de Boor's
    recursion ``B_{i,p} = w_{i,p} B_{i,p-1} + (1 - w_{i+1,p}) B_{i+1,p-1}`` with
    ``w_{i,p} = (x - t_i) / (t_{i+p} - t_i)``, and 0 where ``t_i == t_{i+p}``.
    """
    if isinstance(order, bool) or not isinstance(order, int) or order < 0:
        raise ValueError(f"BSpline: the order must be a non-negative integer, got {order!r}")
    if x.dim != 1:
        raise ValueError(f"BSpline: x must be a scalar formula, got dimension {x.dim}")
    if knots.dim < order + 2:
        raise ValueError(f"BSpline of order {order} needs at least {order + 2} knots, got "
                         f"{knots.dim}")
    t = [_component(knots, k) for k in range(knots.dim)]
    basis = [_a("mul", _a("ge", x, t[j]), _a("lt", x, t[j + 1])) for j in range(knots.dim - 1)]
    one = ir.const(1.0)

    def weight(i, p):
        distinct = _a("lt", t[i], t[i + p])  # 1 or 0: the span is not empty
        span = _a("add", _a("sub", t[i + p], t[i]), _a("sub", one, distinct))
        return _a("mul", distinct, _a("div", _a("sub", x, t[i]), span))

    for p in range(1, order + 1):
        w = [weight(i, p) for i in range(len(basis))]
        basis = [_a("add", _a("mul", w[i], basis[i]), _a("mul", _a("sub", one, w[i + 1]),
                                                          basis[i + 1]))
                 for i in range(len(basis) - 1)]
    return concat_all(basis)


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
        return _a("square", _a("sub", xs[i], ys[j]))

    def softmin(a, b, c):
        low = _a("min2", _a("min2", a, b), c)
        total = None
        for v in (a, b, c):
            term = _a("exp", _a("div", _a("sub", low, v), gamma))
            total = term if total is None else _a("add", total, term)
        return _a("sub", low, _a("mul", gamma, _a("log", total)))

    prev = []  # r[.][j-1]
    for j in range(m):
        col = []
        for i in range(n):
            if i == 0 and j == 0:
                r = cost(0, 0)
            elif j == 0:
                r = _a("add", cost(i, 0), col[i - 1])
            elif i == 0:
                r = _a("add", cost(0, j), prev[0])
            else:
                r = _a("add", cost(i, j), softmin(prev[i - 1], col[i - 1], prev[i]))
            col.append(r)
        prev = col
    return prev[n - 1]
