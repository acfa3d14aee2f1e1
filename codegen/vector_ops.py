"""Vector ops: structure over the vector dimension, emitted as loops (never scalarized).

Matrices are stored row-major in a vector: ``A`` of dimension ``n*m`` is ``A[r*m + c]``.

>>> from lazytensor.codegen import ir, ops
>>> A = ir.var(0, 6, "i"); x = ir.var(1, 3, "j")
>>> ops.apply("matvec", A, x).dim
2
>>> ops.apply("matmul", A, ir.var(2, 9, "j"), params=(3,)).dim   # (2×3) @ (3×3)
6
"""

from __future__ import annotations

import numbers

from . import ir
from .ops import OpDef, apply, register

# the doctest of a method over the vector dimension: two points of dimension 3
_VECTOR_EXAMPLE = """>>> x = Vi(np.array([[1.0, 3.0, 2.0], [0.0, -1.0, 5.0]]))
>>> x.{call}.dense().tolist()
{result}"""


def _integers(op: str, names: str, values) -> tuple:
    """``values`` as Python ints, or a TypeError naming the op and the parameter (a float
    such as 0.5 would otherwise reach the generated code, or be truncated)."""
    out = []
    for name, v in zip(names.split(), values):
        if not isinstance(v, numbers.Integral) or isinstance(v, bool):
            raise TypeError(f"{op}: {name} must be an integer, got {v!r} ({type(v).__name__})")
        out.append(int(v))
    return tuple(out)


def _fixed(dim):
    return lambda dims, params: dim


def _zeros_like(node: ir.Node) -> ir.Node:
    return ir.const([0.0] * node.dim)


def _reshape(a, shape):
    return a.reshape(tuple(shape))


# ---------------------------------------------------------------- reductions over the vector


# Sums over the vector dimension longer than this add blocks of SUM_BLOCK terms one after
# the other and the blocks' sums pairwise: term by term, a float32 sum of 10^6 terms was
# off by 1e-4 (each term rounded to the ulp of the running sum), where dense torch's is
# 1e-7; pairwise, the error grows as log2(n / SUM_BLOCK). Shorter sums are unchanged.
SUM_BLOCK = 64


def _sum_emit(node, out, args, dtype):
    a = args[0]
    n = node.args[0].dim
    if n <= SUM_BLOCK:
        return f"{{ T s = 0; for (int k = 0; k < {n}; ++k) s += {a}[k]; {out}[0] = s; }}"
    # the sums of blocks on a stack, merged as a binary counter: block c (counting from 1)
    # is added to as many stacked sums as c has trailing zero bits, each of its own size
    levels = ((n + SUM_BLOCK - 1) // SUM_BLOCK).bit_length() + 1
    return (f"{{ T lv[{levels}]; int top = 0; int64_t c = 0; "
            f"for (int64_t k0 = 0; k0 < {n}; k0 += {SUM_BLOCK}) {{ "
            f"const int64_t k1 = k0 + {SUM_BLOCK} < {n} ? k0 + {SUM_BLOCK} : {n}; T s = 0; "
            f"for (int64_t k = k0; k < k1; ++k) s += {a}[k]; "
            f"for (int64_t q = ++c; !(q & 1); q >>= 1) s += lv[--top]; lv[top++] = s; }} "
            f"T s = 0; while (top > 0) s += lv[--top]; {out}[0] = s; }}")


register(OpDef(
    "sum", 1, _fixed(1), _sum_emit,
    ref=lambda xp, t, p: xp.vsum(t[0]),
    vjp=lambda node, g: [apply("expand", g, params=(node.args[0].dim,))],
    jvp=lambda node, t: None if t[0] is None else apply("sum", t[0]),
    doc="sum over the vector dimension", keops=("Sum",), method="sum",
    example=_VECTOR_EXAMPLE.format(call="sum()", result="[[6.0], [4.0]]"),
))


def _expand_dim(dims, params):
    if dims[0] != 1:
        raise ValueError(f"expand: operand must have dimension 1, got {dims[0]}")
    return _integers("expand", "dimension", params)[0]


register(OpDef(
    "expand", 1, _expand_dim,
    lambda node, out, args, dtype: f"for (int k = 0; k < {node.dim}; ++k) {out}[k] = {args[0]}[0];",
    ref=lambda xp, t, p: t[0] * xp.asarray([1.0] * int(p[0]), t[0]),
    vjp=lambda node, g: [apply("sum", g)],
    jvp=lambda node, t: None if t[0] is None else apply("expand", t[0], params=node.params),
    doc="broadcast a scalar to dimension D",
))


def _select_emit(cmp, want_index):
    def emit(node, out, args, dtype):
        a, n = args[0], node.args[0].dim
        # NaN wins (as numpy.min/argmin): once the best is NaN it stays.
        result = "(T)b" if want_index else "v"
        return (
            f"{{ T v = {a}[0]; int b = 0; for (int k = 1; k < {n}; ++k) "
            f"{{ if (v == v && ({a}[k] {cmp} v || {a}[k] != {a}[k])) {{ v = {a}[k]; b = k; }} }} "
            f"{out}[0] = {result}; }}"
        )

    return emit


def _select_vjp(arg_name):
    def vjp(node, g):
        a = node.args[0]
        return [apply("mul", g, apply("one_hot", apply(arg_name, a), params=(a.dim,)))]

    return vjp


def _select_jvp(arg_name):
    def jvp(node, t):
        if t[0] is None:
            return None
        a = node.args[0]
        return apply("sum", apply("mul", t[0], apply("one_hot", apply(arg_name, a), params=(a.dim,))))

    return jvp


for _name, _cmp, _index, _keops, _result in (
    ("vmin", "<", False, "Min", "[[1.0], [-1.0]]"), ("vmax", ">", False, "Max", "[[3.0], [5.0]]"),
    ("vargmin", "<", True, "ArgMin", "[[0.0], [1.0]]"),
    ("vargmax", ">", True, "ArgMax", "[[1.0], [2.0]]"),
):  # fmt: skip
    _arg = "vargmin" if _cmp == "<" else "vargmax"
    register(OpDef(
        _name, 1, _fixed(1), _select_emit(_cmp, _index),
        ref=lambda xp, t, p, _ref=_name: getattr(xp, _ref)(t[0]),
        vjp=None if _index else _select_vjp(_arg),
        jvp=None if _index else _select_jvp(_arg),
        differentiable=not _index,
        doc=f"{_name[1:]} over the vector dimension" + (" (as a float)" if _index else ""),
        keops=(_keops,), method=_keops.lower(),
        example=_VECTOR_EXAMPLE.format(call=f"{_keops.lower()}()", result=_result),
    ))


# ---------------------------------------------------------------- slices and concatenation


def _slice_dim(dims, params):
    start, length = _integers("slice", "start length", params)
    if not (0 <= start and length >= 1 and start + length <= dims[0]):
        raise ValueError(f"slice [{start}:{start + length}] out of range for dimension {dims[0]}")
    return length


register(OpDef(
    "slice", 1, _slice_dim,
    lambda node, out, args, dtype: (
        f"for (int k = 0; k < {node.dim}; ++k) {out}[k] = {args[0]}[{node.params[0]} + k];"
    ),
    ref=lambda xp, t, p: t[0][..., p[0]: p[0] + p[1]],
    vjp=lambda node, g: [apply("pad", g, params=(node.params[0], node.args[0].dim))],
    jvp=lambda node, t: None if t[0] is None else apply("slice", t[0], params=node.params),
    doc="components start..start+length-1",
))


def _pad_dim(dims, params):
    start, total = _integers("pad", "start total", params)
    if start < 0 or start + dims[0] > total:
        raise ValueError(f"pad: cannot place dimension {dims[0]} at {start} in {total}")
    return total


def _pad_ref(xp, t, p):
    start, total = p
    a = t[0]
    z = a[..., :1] * 0
    parts = [z * xp.asarray([0.0] * start, a)] if start else []
    parts.append(a)
    rest = total - start - a.shape[-1]
    if rest:
        parts.append(z * xp.asarray([0.0] * rest, a))
    return xp.concat(parts)


register(OpDef(
    "pad", 1, _pad_dim,
    lambda node, out, args, dtype: (
        f"for (int k = 0; k < {node.dim}; ++k) {out}[k] = 0; "
        f"for (int k = 0; k < {node.args[0].dim}; ++k) {out}[{node.params[0]} + k] = {args[0]}[k];"
    ),
    ref=_pad_ref,
    vjp=lambda node, g: [apply("slice", g, params=(node.params[0], node.args[0].dim))],
    jvp=lambda node, t: None if t[0] is None else apply("pad", t[0], params=node.params),
    doc="zeros of dimension total with the operand placed at start (transpose of slice)",
))


def _concat_jvp(node, t):
    if all(x is None for x in t):
        return None
    a, b = node.args
    ta = t[0] if t[0] is not None else _zeros_like(a)
    tb = t[1] if t[1] is not None else _zeros_like(b)
    return apply("concat", ta, tb)


register(OpDef(
    "concat", 2, lambda dims, params: dims[0] + dims[1],
    lambda node, out, args, dtype: (
        f"for (int k = 0; k < {node.args[0].dim}; ++k) {out}[k] = {args[0]}[k]; "
        f"for (int k = 0; k < {node.args[1].dim}; ++k) {out}[{node.args[0].dim} + k] = {args[1]}[k];"
    ),
    ref=lambda xp, t, p: xp.concat(list(t)),
    vjp=lambda node, g: [
        apply("slice", g, params=(0, node.args[0].dim)),
        apply("slice", g, params=(node.args[0].dim, node.args[1].dim)),
    ],
    jvp=_concat_jvp,
    doc="concatenation of two vectors: dimensions D and E give D + E", keops=("Concat",),
    method="concat", example=""">>> x, y = Vi(np.array([[1.0, 3.0, 2.0]])), Vj(np.array([[7.0]]))
>>> x.concat(y).dense().tolist()
[[[1.0, 3.0, 2.0, 7.0]]]""",
))


def _one_hot_dim(dims, params):
    if dims[0] != 1:
        raise ValueError(f"one_hot: operand must have dimension 1, got {dims[0]}")
    return _integers("one_hot", "dimension", params)[0]


def _one_hot_ref(xp, t, p):
    a = t[0]
    r = xp.sign(a) * xp.floor(xp.abs(a) + 0.5)
    return xp.as_float(r == xp.arange(int(p[0]), a), a)


register(OpDef(
    "one_hot", 1, _one_hot_dim,
    lambda node, out, args, dtype: (
        f"{{ const T r = round({args[0]}[0]); "
        f"for (int k = 0; k < {node.dim}; ++k) {out}[k] = (r == (T)k) ? (T)1 : (T)0; }}"
    ),
    ref=_one_hot_ref, differentiable=False,
    doc="one-hot vector of dimension D at the rounded value of a scalar",
))

# ---------------------------------------------------------------- small matrix products


def _matvec_dim(dims, params):
    a, x = dims
    if a % x:
        raise ValueError(f"matvec: matrix dimension {a} is not a multiple of vector dimension {x}")
    return a // x


def _matvec_emit(node, out, args, dtype):
    n, m = node.dim, node.args[1].dim
    return (f"for (int r = 0; r < {n}; ++r) {{ T s = 0; for (int c = 0; c < {m}; ++c) "
            f"s += {args[0]}[r * {m} + c] * {args[1]}[c]; {out}[r] = s; }}")


def _matvec_ref(xp, t, p):
    A, x = t
    m = x.shape[-1]
    n = A.shape[-1] // m
    return (_reshape(A, (*A.shape[:-1], n, m)) @ x[..., None])[..., 0]


def _sum_terms(*terms):
    terms = [t for t in terms if t is not None]
    if not terms:
        return None
    out = terms[0]
    for t in terms[1:]:
        out = apply("add", out, t)
    return out


register(OpDef(
    "matvec", 2, _matvec_dim, _matvec_emit, ref=_matvec_ref,
    vjp=lambda node, g: [apply("tensorprod", g, node.args[1]), apply("vecmat", g, node.args[0])],
    jvp=lambda node, t: _sum_terms(
        None if t[0] is None else apply("matvec", t[0], node.args[1]),
        None if t[1] is None else apply("matvec", node.args[0], t[1]),
    ),
    doc="A(n*m, row-major) times x(m)", keops=("MatVecMult",), method="matvecmult",
    example=""">>> A = Vi(np.array([[1.0, 2.0, 3.0, 4.0]]))  # the matrix [[1, 2], [3, 4]]
>>> v = Vj(np.array([[1.0, 1.0], [1.0, 0.0]]))
>>> A.matvecmult(v).dense().tolist()
[[[3.0, 7.0], [1.0, 3.0]]]""",
))


def _vecmat_dim(dims, params):
    x, a = dims
    if a % x:
        raise ValueError(f"vecmat: matrix dimension {a} is not a multiple of vector dimension {x}")
    return a // x


def _vecmat_emit(node, out, args, dtype):
    n, m = node.args[0].dim, node.dim
    return (f"for (int c = 0; c < {m}; ++c) {{ T s = 0; for (int r = 0; r < {n}; ++r) "
            f"s += {args[0]}[r] * {args[1]}[r * {m} + c]; {out}[c] = s; }}")


def _vecmat_ref(xp, t, p):
    x, A = t
    n = x.shape[-1]
    m = A.shape[-1] // n
    return (x[..., None, :] @ _reshape(A, (*A.shape[:-1], n, m)))[..., 0, :]


register(OpDef(
    "vecmat", 2, _vecmat_dim, _vecmat_emit, ref=_vecmat_ref,
    vjp=lambda node, g: [apply("matvec", node.args[1], g), apply("tensorprod", node.args[0], g)],
    jvp=lambda node, t: _sum_terms(
        None if t[0] is None else apply("vecmat", t[0], node.args[1]),
        None if t[1] is None else apply("vecmat", node.args[0], t[1]),
    ),
    doc="x(n) times A(n*m, row-major)", keops=("VecMatMult",), method="vecmatmult",
    example=""">>> A = Vi(np.array([[1.0, 2.0, 3.0, 4.0]]))  # the matrix [[1, 2], [3, 4]]
>>> v = Vj(np.array([[1.0, 1.0], [1.0, 0.0]]))
>>> v.vecmatmult(A).dense().tolist()
[[[4.0, 6.0], [1.0, 2.0]]]""",
))


def _tensorprod_ref(xp, t, p):
    a, b = t
    prod = a[..., :, None] * b[..., None, :]
    return _reshape(prod, (*prod.shape[:-2], a.shape[-1] * b.shape[-1]))


register(OpDef(
    "tensorprod", 2, lambda dims, params: dims[0] * dims[1],
    lambda node, out, args, dtype: (
        f"for (int r = 0; r < {node.args[0].dim}; ++r) for (int c = 0; c < {node.args[1].dim}; ++c) "
        f"{out}[r * {node.args[1].dim} + c] = {args[0]}[r] * {args[1]}[c];"
    ),
    ref=_tensorprod_ref,
    vjp=lambda node, g: [apply("matvec", g, node.args[1]), apply("vecmat", node.args[0], g)],
    jvp=lambda node, t: _sum_terms(
        None if t[0] is None else apply("tensorprod", t[0], node.args[1]),
        None if t[1] is None else apply("tensorprod", node.args[0], t[1]),
    ),
    doc="outer product a(n) b(m) as an n*m row-major vector", keops=("TensorProd",),
    method="tensorprod",
    example=""">>> x, y = Vi(np.array([[1.0, 3.0, 2.0]])), Vj(np.array([[1.0, 10.0]]))
>>> x.tensorprod(y).dense().tolist()
[[[1.0, 10.0, 3.0, 30.0, 2.0, 20.0]]]""",
))


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
    prod = _reshape(a, (*a.shape[:-1], n, k)) @ _reshape(b, (*b.shape[:-1], k, m))
    return _reshape(prod, (*prod.shape[:-2], n * m))


def transpose_indices(rows: int, cols: int) -> tuple:
    """The ``gather`` indices that transpose a ``rows×cols`` row-major matrix."""
    return tuple(r * cols + c for c in range(cols) for r in range(rows))


def _matmul_vjp(node, g):
    a, b = node.args
    n, k, m = _matmul_shape(node)
    # C = A B: dA = G Bᵀ (inner m), dB = Aᵀ G (inner n)
    bt = apply("gather", b, params=(transpose_indices(k, m),))
    at = apply("gather", a, params=(transpose_indices(n, k),))
    return [apply("matmul", g, bt, params=(m,)), apply("matmul", at, g, params=(n,))]


register(OpDef(
    "matmul", 2, _matmul_dim, _matmul_emit, ref=_matmul_ref, vjp=_matmul_vjp,
    jvp=lambda node, t: _sum_terms(
        None if t[0] is None else apply("matmul", t[0], node.args[1], params=node.params),
        None if t[1] is None else apply("matmul", node.args[0], t[1], params=node.params),
    ),
    doc="A (n×k) @ B (k×m), both row-major, params (k,): TensorDot's contraction",
))



# ---------------------------------------------------------------- static index maps


def _gather_dim(dims, params):
    idx = params[0]
    if not idx or min(idx) < 0 or max(idx) >= dims[0]:
        raise ValueError(f"gather: indices {list(idx)[:8]}... out of range for dimension {dims[0]}")
    return len(idx)


def _gather_ref(xp, t, p):
    a = t[0]
    return xp.concat([a[..., k: k + 1] for k in p[0]])


register(OpDef(
    "gather", 1, _gather_dim,
    lambda node, out, args, dtype: (
        f"{{ const int ix[{node.dim}] = {{{', '.join(map(str, node.params[0]))}}}; "
        f"for (int k = 0; k < {node.dim}; ++k) {out}[k] = {args[0]}[ix[k]]; }}"
    ),
    ref=_gather_ref,
    vjp=lambda node, g: [apply("scatter", g, params=(node.params[0], node.args[0].dim))],
    jvp=lambda node, t: None if t[0] is None else apply("gather", t[0], params=node.params),
    doc="out[k] = a[idx[k]] for a static index table (permutations, selections)",
))


def _scatter_dim(dims, params):
    idx, total = params
    if len(idx) != dims[0] or (idx and (min(idx) < 0 or max(idx) >= total)):
        raise ValueError(f"scatter: {len(idx)} indices into dimension {total} for an operand of {dims[0]}")
    return int(total)


def _scatter_ref(xp, t, p):
    idx, total = p
    a = t[0]
    cols = []
    for m in range(total):
        terms = [a[..., k: k + 1] for k, i in enumerate(idx) if i == m]
        col = a[..., :1] * 0
        for term in terms:
            col = col + term
        cols.append(col)
    return xp.concat(cols)


register(OpDef(
    "scatter", 1, _scatter_dim,
    lambda node, out, args, dtype: (
        f"{{ const int ix[{node.args[0].dim}] = {{{', '.join(map(str, node.params[0]))}}}; "
        f"for (int k = 0; k < {node.dim}; ++k) {out}[k] = 0; "
        f"for (int k = 0; k < {node.args[0].dim}; ++k) {out}[ix[k]] += {args[0]}[k]; }}"
    ),
    ref=_scatter_ref,
    vjp=lambda node, g: [apply("gather", g, params=(node.params[0],))],
    jvp=lambda node, t: None if t[0] is None else apply("scatter", t[0], params=node.params),
    doc="out[idx[k]] += a[k] into zeros of dimension total (transpose of gather)",
))
