"""Selections: Min, Max, their indices (ArgMin, Min_ArgMin, ...) and the K-min family.

Every selection keeps values and indices (int64, global j) in its accumulator; NaN counts
as the best value (as ``numpy.min``/``argmin``) for Min/Max, and sorts last (as
``numpy.sort``) for the K-min family; ties go to the lowest index. Min, Max and KMin have
an ``arg_variant`` that also outputs the indices, through which their gradients gather.

>>> import numpy as np
>>> from lazytensor.codegen.reductions import get
>>> r = get("argkmin"); [o.dim for o in r.outputs(1, {"K": 5})]
[5]
>>> v = np.array([[3.0], [1.0], [2.0]])
>>> r.merge(r.partial(v[:2], {"K": 2}), r.partial(v[2:], {"K": 2}, j0=2), {"K": 2})[1][:, 0]
array([1, 2])
"""

from __future__ import annotations

import numpy as np

from ..arraymath import namespace_of
from .base import (
    PAIRS,
    TILES,
    Accumulator,
    Array,
    Hook,
    Output,
    Reduction,
    register,
    unrolled,
    write_code,
)

BETTER_CODE = """
// (a, ia) replaces (b, ib)? ib < 0 marks an empty slot. NaN counts as the best value
// (numpy.min/argmin propagate NaN); ties go to the lowest index.
LT_HD LT_INLINE bool lt_better(T a, int64_t ia, T b, int64_t ib, bool want_min) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
  const bool an = a != a, bn = b != b;
  if (an || bn) return an && (!bn || ia < ib);
  if (a == b) return ia < ib;
  return want_min ? a < b : a > b;
}
// K-min order: NaN last (as numpy.sort), ties to the lowest index.
LT_HD LT_INLINE bool lt_kbetter(T a, int64_t ia, T b, int64_t ib, bool want_min) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
  const bool an = a != a, bn = b != b;
  if (an || bn) return !an || (bn && ia < ib);
  if (a == b) return ia < ib;
  return want_min ? a < b : a > b;
}
"""


# Which of n <= 64 terms are better than a threshold, as bits: the K-selections test each
# block of a tile this way (NaN never is). GCC's vector compares give the bits directly
# (the intrinsics' header alone would add ~0.4 s to every compile); elsewhere, a loop.
_KMASK = """
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && defined(__x86_64__) \\
    && (defined(__AVX512F__) || defined(__AVX__))
#if defined(__AVX512F__)
typedef float lt_kf __attribute__((vector_size(64)));
typedef double lt_kd __attribute__((vector_size(64)));
#define LT_KCMP_F(a, b) (uint64_t)__builtin_ia32_cmpps512_mask(a, b, 17, (unsigned short)-1, 4)
#define LT_KCMP_D(a, b) (uint64_t)__builtin_ia32_cmppd512_mask(a, b, 17, (unsigned char)-1, 4)
#else
typedef float lt_kf __attribute__((vector_size(32)));
typedef double lt_kd __attribute__((vector_size(32)));
#define LT_KCMP_F(a, b) (uint64_t)(unsigned)__builtin_ia32_movmskps256(__builtin_ia32_cmpps256(a, b, 17))
#define LT_KCMP_D(a, b) (uint64_t)(unsigned)__builtin_ia32_movmskpd256(__builtin_ia32_cmppd256(a, b, 17))
#endif
#define LT_KMASK_VEC(VT, CMP)                                                      \\
  enum { W = sizeof(VT) / sizeof(t) };                                           \\
  VT tv = {}; tv += t;                                                           \\
  for (; q + W <= n; q += W) {                                                   \\
    VT a; memcpy(&a, f + q, sizeof(VT));                                         \\
    m |= (want_min ? CMP(a, tv) : CMP(tv, a)) << q;                              \\
  }
static inline uint64_t lt_kmask(const float* f, int n, float t, bool want_min) {
  uint64_t m = 0; int q = 0;
  LT_KMASK_VEC(lt_kf, LT_KCMP_F)
  for (; q < n; ++q) m |= (uint64_t)(want_min ? f[q] < t : f[q] > t) << q;
  return m;
}
static inline uint64_t lt_kmask(const double* f, int n, double t, bool want_min) {
  uint64_t m = 0; int q = 0;
  LT_KMASK_VEC(lt_kd, LT_KCMP_D)
  for (; q < n; ++q) m |= (uint64_t)(want_min ? f[q] < t : f[q] > t) << q;
  return m;
}
#else
static inline uint64_t lt_kmask(const T* f, int n, T t, bool want_min) {
  uint64_t m = 0;
  for (int q = 0; q < n; ++q) m |= (uint64_t)(want_min ? f[q] < t : f[q] > t) << q;
  return m;
}
#endif
"""




def _better(a, ia, b, ib, want_min: bool):
    """Where ``(a, ia)`` replaces ``(b, ib)`` (``lt_better``): an empty slot (index < 0)
    never wins, NaN is the best value, ties go to the lower index."""
    an, bn = a != a, b != b
    nan_case = an & (~bn | (ia < ib))
    order = (a < b) if want_min else (a > b)
    xp = namespace_of(a)
    res = xp.where(an | bn, nan_case, xp.where(a == b, ia < ib, order))
    return xp.where(ib < 0, ia >= 0, res & (ia >= 0))


def _kbetter(a, ia, b, ib, want_min: bool):
    """The K-min order (``lt_kbetter``): as :func:`_better`, but NaN sorts last."""
    an, bn = a != a, b != b
    nan_case = ~an | (bn & (ia < ib))
    order = (a < b) if want_min else (a > b)
    xp = namespace_of(a)
    res = xp.where(an | bn, nan_case, xp.where(a == b, ia < ib, order))
    return xp.where(ib < 0, ia >= 0, res & (ia >= 0))


class _Select(Reduction):
    want_min = True
    with_value = True
    with_index = False
    user_outputs = 1

    def outputs(self, F: int, opts: dict) -> list[Output]:
        empty = float("inf") if self.want_min else float("-inf")
        outs = []
        if self.with_value:
            outs.append(Output(F, "value", empty))
        if self.with_index:
            outs.append(Output(F, "index", -1))
        return outs

    def accumulator(self, F: int, opts: dict, form: str = TILES) -> Accumulator:
        """Value and index per component; a term replaces the kept one when it is better
        (``lt_better``). PAIRS: j grows from push to push, so a tie never replaces and NaN
        replaces a number once."""
        wm = "true" if self.want_min else "false"
        lt = "<" if self.want_min else ">"
        writes = []
        if self.with_value:
            writes.append(write_code(0, "value", F, "v[k]"))
        if self.with_index:
            writes.append(write_code(len(writes), "index", F, "i[k]"))
        init_v = "(T)INFINITY" if self.want_min else "-(T)INFINITY"
        comps = f"for (int k = 0; k < {F}; ++k)"
        init = f"{comps} {{ v[k] = {init_v}; i[k] = -1; }}"
        merge = (f"{comps} if (lt_better(o.v[k], o.i[k], v[k], i[k], {wm})) "
                 "{ v[k] = o.v[k]; i[k] = o.i[k]; }")
        write = Hook("write", f"{{ {' '.join(writes)} }}")
        if form == PAIRS:
            return Accumulator(BETTER_CODE, f"T v[{F}]; int64_t i[{F}];", (
                Hook("init", unrolled(init)),
                Hook("push", unrolled(
                    f"{comps} {{\n      const T x = o[k];\n      if (x {lt} v[k] || i[k] < 0 || "
                    "(x != x && v[k] == v[k])) { v[k] = x; i[k] = j; }\n    }"),
                     comment="// j grows from call to call: a tie never replaces, NaN replaces "
                             "a number once"),
                Hook("flush", "{}"),
                Hook("tile", "{\n#pragma unroll 2\n    for (int jj = 0; jj < nj; ++jj) "
                             f"{{ T o[{F}]; eval(jj, o); push(o, j0 + jj); }}\n  }}"),
                Hook("merge", unrolled(merge)),
                write), arg="o")
        tile = f"""{{
    {comps} {{
      const T* f = fb + k * TJ;
      T m = {init_v}; int nan = 0;
      _Pragma("omp simd reduction({"min" if self.want_min else "max"}:m) reduction(|:nan)")
      for (int jj = 0; jj < nj; ++jj) {{ const T x = f[jj]; nan |= (x != x); m = x {lt} m ? x : m; }}
      if (nan) {{
        for (int jj = 0; jj < nj; ++jj)
          if (lt_better(f[jj], j0 + jj, v[k], i[k], {wm})) {{ v[k] = f[jj]; i[k] = j0 + jj; }}
        continue;
      }}
      // the tile's terms come after every index kept, so a tie does not replace
      if (i[k] >= 0 && !(m {lt} v[k])) continue;
      int jj = 0;
      while (!(f[jj] == m)) ++jj;  // the first term equal to the best
      v[k] = f[jj]; i[k] = j0 + jj;
    }} }}"""
        return Accumulator(BETTER_CODE, f"T v[{F}]; int64_t i[{F}];", (
            Hook("init", f"{{ {init} }}"),
            Hook("push", f"{{\n    {comps} if (lt_better(f[k], j, v[k], i[k], {wm})) "
                         "{ v[k] = f[k]; i[k] = j; } }"),
            Hook("tile", tile, comment="// A vectorized pass finds the tile's best value (and any "
                                       "NaN); only a tile that holds\n// a NaN, or a better value, "
                                       "is looked at term by term."),
            Hook("merge", f"{{\n    {merge} }}"),
            write))

    def partial(self, values: Array, opts: dict, j0: int = 0) -> list:
        M = values.shape[-2]
        if M == 0:
            shape = values.shape[:-2] + values.shape[-1:]
            v = np.full(shape, np.inf if self.want_min else -np.inf)
            idx = np.full(shape, -1, dtype=np.int64)
        else:
            idx = (values.argmin if self.want_min else values.argmax)(axis=-2)
            v = np.take_along_axis(values, idx[..., None, :], axis=-2)[..., 0, :]
            idx = idx.astype(np.int64) + j0
        return [v, idx]

    def merge(self, a: list, b: list, opts: dict) -> list:
        take = _better(b[0], b[1], a[0], a[1], self.want_min)
        xp = namespace_of(a[0])
        return [xp.where(take, b[0], a[0]), xp.where(take, b[1], a[1])]

    def finalize(self, state: list, opts: dict) -> list:
        return ([state[0]] if self.with_value else []) + ([state[1]] if self.with_index else [])

    def state_layout(self, opts: dict, dim: int) -> list:
        return [((dim,), "value", float("inf") if self.want_min else float("-inf")),
                ((dim,), "index", -1)]

    def from_block(self, outs: list, opts: dict, offset: int, dim: int) -> list:
        v, i = outs
        return [v, namespace_of(v).where(i >= 0, i + offset, i)]

    def to_block(self, state: list, opts: dict, offset: int, m: int) -> list:
        v, i = state
        return [v, namespace_of(v).where(i >= 0, i - offset, i)]


# The doctest of a selection's class: its reference on the terms f_ij of N = 3 rows
# (``Vi(x).sqdist(Vj(y))`` for x = (0, 1, 3), y = (0, 2)), one output per list.
_EXAMPLE = """

    >>> f = np.array([[[0.0], [4.0]], [[1.0], [1.0]], [[9.0], [1.0]]])  # (N, M, F) = (3, 2, 1)
    >>> [out.tolist() for out in {cls}().ref(f, {opts})]
    {result}
    """


def _select(name, keops_name, want_min, with_value, with_index, doc, result, aliases=(),
            arg_variant=None, **method):
    cls_name = keops_name.replace("_", "")
    # on blocks: the values and the indices, always (the one-pass selection)
    both = "min_argmin" if want_min else "max_argmax"
    fields = dict(name=name, keops_name=keops_name, want_min=want_min, with_value=with_value,
                  with_index=with_index, aliases=aliases, arg_variant=arg_variant,
                  block_runs=((both, "all"),),
                  user_outputs=2 if with_value and with_index else 1,
                  gradient="gather" if with_value and with_index else None,
                  __doc__=doc + _EXAMPLE.format(cls=cls_name, opts="{}", result=result), **method)
    return register(type(cls_name, (_Select,), fields))


Min = _select("min", "Min", True, True, False, arg_variant="min_argmin", doc="""\
    ``min_j f_ij`` per component (``K.min(dim=1)``, pykeops's ``Min``): ``(N, F)``; +inf
    for an empty reduction, NaN if a term is NaN. Differentiable through ``min_argmin``.""",
              result="[[[0.0], [1.0], [1.0]]]",
    method="min", vector_op="vmin", method_doc="""\
    Minimum over i (dim=0) or j (dim=1), per component; ``dim=-1``: over the vector.

    An empty reduction gives +inf (``max``: -inf); a NaN term gives NaN, as ``np.min``.

    Shapes: ``(N, M, D)`` gives ``(N, D)`` for ``dim=1``, ``(M, D)`` for ``dim=0``.

    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
    >>> D = Vi(x).sqdist(Vj(y))     # (3, 2): [[0, 4], [1, 1], [9, 1]]
    >>> D.min(dim=1).tolist()
    [[0.0], [1.0], [1.0]]
    """)
Max = _select("max", "Max", False, True, False, arg_variant="max_argmax", doc="""\
    ``max_j f_ij`` per component (``K.max(dim=1)``, pykeops's ``Max``): ``(N, F)``; -inf
    for an empty reduction, NaN if a term is NaN.""", result="[[[4.0], [1.0], [9.0]]]",
    method="max", vector_op="vmax", method_doc="""\
    Maximum over i (dim=0) or j (dim=1), per component; ``dim=-1``: over the vector.

    An empty reduction gives -inf; a NaN term gives NaN, as ``np.max``. Shapes as
    :meth:`min`.

    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
    >>> D = Vi(x).sqdist(Vj(y))     # (3, 2): [[0, 4], [1, 1], [9, 1]]
    >>> D.max(dim=1).tolist()
    [[4.0], [1.0], [9.0]]
    """)
ArgMin = _select("argmin", "ArgMin", True, False, True, doc="""\
    The index j (int64) of ``min_j f_ij`` per component (``K.argmin(dim=1)``): ``(N, F)``;
    the lowest index among ties, -1 for an empty reduction.""", result="[[[0], [0], [1]]]",
    method="argmin", vector_op="vargmin", method_doc="""\
    Index (int64) of the minimum over i or j: the lowest index among ties, the first
    NaN's index if there is a NaN (as ``np.argmin``), -1 for an empty reduction.

    Shapes as :meth:`min`; ``dim=-1`` gives the index over the vector (as a float).

    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
    >>> D = Vi(x).sqdist(Vj(y))     # (3, 2): [[0, 4], [1, 1], [9, 1]]
    >>> D.argmin(dim=1).tolist()
    [[0], [0], [1]]
    """)
ArgMax = _select("argmax", "ArgMax", False, False, True, doc="""\
    The index j (int64) of ``max_j f_ij`` per component (``K.argmax(dim=1)``): ``(N, F)``;
    the lowest index among ties, -1 for an empty reduction.""", result="[[[1], [0], [0]]]",
    method="argmax", vector_op="vargmax", method_doc="""\
    Index (int64) of the maximum over i or j, as :meth:`argmin` (lowest index among
    ties).

    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
    >>> D = Vi(x).sqdist(Vj(y))     # (3, 2): [[0, 4], [1, 1], [9, 1]]
    >>> D.argmax(dim=1).tolist()
    [[1], [0], [0]]
    """)
MinArgMin = _select("min_argmin", "Min_ArgMin", True, True, True, aliases=("minargmin",),
                    doc="""\
    ``(min, argmin)`` in one pass (``K.min_argmin(dim=1)``): two ``(N, F)`` arrays; its
    gradient gathers through the indices.""", result="[[[0.0], [1.0], [1.0]], [[0], [0], [1]]]",
    method="min_argmin", method_doc="""\
    ``(min, argmin)`` over i or j in one pass: two arrays of shape ``(N, D)`` for
    ``dim=1`` (values, int64 indices), as :meth:`min` and :meth:`argmin`; the values are
    differentiable (through the indices).

    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
    >>> D = Vi(x).sqdist(Vj(y))     # (3, 2): [[0, 4], [1, 1], [9, 1]]
    >>> [a.tolist() for a in D.min_argmin(dim=1)]
    [[[0.0], [1.0], [1.0]], [[0], [0], [1]]]
    """)
MaxArgMax = _select("max_argmax", "Max_ArgMax", False, True, True, aliases=("maxargmax",),
                    doc="""\
    ``(max, argmax)`` in one pass (``K.max_argmax(dim=1)``): two ``(N, F)`` arrays; its
    gradient gathers through the indices.""", result="[[[4.0], [1.0], [9.0]], [[1], [0], [0]]]",
    method="max_argmax", method_doc="""\
    ``(max, argmax)`` over i or j in one pass, as :meth:`min_argmin`.

    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
    >>> D = Vi(x).sqdist(Vj(y))     # (3, 2): [[0, 4], [1, 1], [9, 1]]
    >>> [a.tolist() for a in D.max_argmax(dim=1)]
    [[[4.0], [1.0], [9.0]], [[1], [0], [0]]]
    """)


class _KSelect(Reduction):
    want_min = True
    with_value = True
    with_index = False
    needs_k = True

    def outputs(self, F: int, opts: dict) -> list[Output]:
        K = int(opts["K"])
        empty = float("inf") if self.want_min else float("-inf")
        outs = []
        if self.with_value:
            outs.append(Output(K * F, "value", empty))
        if self.with_index:
            outs.append(Output(K * F, "index", -1))
        return outs

    def check(self, F: int, opts: dict, M: int | None = None) -> None:
        K = opts.get("K")
        if not isinstance(K, (int, np.integer)) or isinstance(K, bool) or K < 1:
            raise ValueError(f"{self.name}: K must be a positive integer, got {K!r}")
        if M is not None and K > M:
            raise ValueError(f"{self.name}: K={K} is larger than the number of reduced points ({M})")

    def shape_output(self, out: Array, F: int, opts: dict) -> Array:
        if F > 1:
            return out.reshape(*out.shape[:-1], int(opts["K"]), F)
        return out

    def accumulator(self, F: int, opts: dict, form: str = TILES) -> Accumulator:
        """Per component c, K slots ``v[c*K .. c*K+K)`` sorted best first (``lt_kbetter``),
        with their indices; the worst kept value is the threshold a term must beat."""
        K = int(opts["K"])
        wm = "true" if self.want_min else "false"
        lt = "<" if self.want_min else ">"
        init_v = "(T)INFINITY" if self.want_min else "-(T)INFINITY"
        writes = []
        # layout of outputs: [K][F]
        if self.with_value:
            writes.append(write_code(0, "value", K * F, f"v[(k % {F}) * {K} + k / {F}]"))
        if self.with_index:
            writes.append(write_code(len(writes), "index", K * F, f"i[(k % {F}) * {K} + k / {F}]"))
        state = f"T v[{F * K}]; int64_t i[{F * K}];   // per component c: v[c*K .. c*K+K) sorted best first"
        init = f"for (int k = 0; k < {F * K}; ++k) {{ v[k] = {init_v}; i[k] = -1; }}"
        write = Hook("write", f"{{ {' '.join(writes)} }}")
        if form == PAIRS:
            return Accumulator(BETTER_CODE, state, (
                Hook("init", unrolled(init)),
                Hook("insert", f"""{{
#pragma unroll
    for (int q = 0; q < {K}; ++q) {{
      const int s = c * {K} + q;
      if (lt_kbetter(x, j, v[s], i[s], {wm})) {{
        const T tv = v[s]; const int64_t ti = i[s];
        v[s] = x; i[s] = j; x = tv; j = ti;
      }}
    }}
  }}""", signature="LT_HD LT_INLINE void insert(int c, T x, int64_t j)",
                     comment="// The candidate walks down the K slots, swapping with every slot "
                             "it beats: unrolled,\n// so that the slots stay in registers."),
                Hook("push", unrolled(f"""for (int c = 0; c < {F}; ++c) {{
      const T x = o[c];
      const T thr = v[c * {K} + {K - 1}];
      const bool simple = i[c * {K} + {K - 1}] >= 0 && thr == thr;
      if (simple ? x {lt} thr : lt_kbetter(x, j, thr, i[c * {K} + {K - 1}], {wm})) insert(c, x, j);
    }}"""), comment="// The worst kept value is the threshold: full slots holding no NaN admit "
                    "a term only if\n// it is strictly better (j grows: a tie never enters); "
                    "otherwise the full rule decides."),
                Hook("flush", "{}"),
                Hook("tile", f"""{{
    for (int jj = 0; jj < nj; ++jj) {{ T o[{F}]; eval(jj, o); push(o, j0 + jj); }}
  }}"""),
                Hook("merge", unrolled(f"""for (int c = 0; c < {F}; ++c)
#pragma unroll
      for (int q = 0; q < {K}; ++q)
        if (o.i[c * {K} + q] >= 0) insert(c, o.v[c * {K} + q], o.i[c * {K} + q]);""")),
                write), arg="o")
        tile = f"""{{
    for (int c = 0; c < {F}; ++c) {{
      const T* f = fb + c * TJ;
      int jj = 0;
      while (jj < nj) {{
        const T thr = v[c * {K} + {K - 1}];
        if (i[c * {K} + {K - 1}] < 0 || thr != thr) {{ insert(c, f[jj], j0 + jj); ++jj; continue; }}
        const int e = jj + 64 < nj ? jj + 64 : nj;
        uint64_t bits = lt_kmask(f + jj, e - jj, thr, {wm});
        // Here the slots are full, hold no NaN, and every kept index is below j0: a term
        // better than the worst moves up past the strictly worse ones, ties stay ahead.
        T* vc = v + c * {K}; int64_t* ic = i + c * {K};
        while (bits) {{
          const int q = jj + __builtin_ctzll(bits);
          bits &= bits - 1;
          const T x = f[q];
          if (!(x {lt} vc[{K - 1}])) continue;
          int p = {K - 1};
          while (p > 0 && x {lt} vc[p - 1]) {{ vc[p] = vc[p - 1]; ic[p] = ic[p - 1]; --p; }}
          vc[p] = x; ic[p] = j0 + q;
        }}
        jj = e;
      }}
    }} }}"""
        return Accumulator(BETTER_CODE + _KMASK, state, (
            Hook("init", f"{{ {init} }}"),
            Hook("insert", f"""{{
    T* vc = v + c * {K}; int64_t* ic = i + c * {K};
    if (!lt_kbetter(x, j, vc[{K - 1}], ic[{K - 1}], {wm})) return;
    int p = {K - 1};
    while (p > 0 && lt_kbetter(x, j, vc[p - 1], ic[p - 1], {wm})) {{ vc[p] = vc[p - 1]; ic[p] = ic[p - 1]; --p; }}
    vc[p] = x; ic[p] = j;
  }}""", signature="LT_HD LT_INLINE void insert(int c, T x, int64_t j)"),
            Hook("push", f"{{ for (int c = 0; c < {F}; ++c) insert(c, f[c], j); }}"),
            Hook("tile", tile, comment="""\
// Once the K slots are full (and the worst is not NaN), a vectorized pass over a block
// of 64 terms asks whether any is strictly better than the worst kept (NaN never is);
// most blocks hold none and cost that pass alone. The others are scanned in order:
// the terms of a tile come after every kept index, so a tie never enters."""),
            Hook("merge", f"""{{
    for (int c = 0; c < {F}; ++c) for (int q = 0; q < {K}; ++q) if (o.i[c * {K} + q] >= 0) insert(c, o.v[c * {K} + q], o.i[c * {K} + q]); }}"""),
            write))

    def partial(self, values: Array, opts: dict, j0: int = 0) -> list:
        """(values, indices), each (..., K, F) best first; slots past the terms are empty."""
        K = int(opts["K"])
        key = values if self.want_min else -values
        order = np.argsort(key, axis=-2, kind="stable")[..., :K, :]  # NaN last, ties by index
        v = np.take_along_axis(values, order, axis=-2)
        idx = (order + j0).astype(np.int64)
        missing = K - v.shape[-2]
        if missing > 0:
            shape = v.shape[:-2] + (missing,) + v.shape[-1:]
            v = np.concatenate([v, np.full(shape, np.inf if self.want_min else -np.inf)], -2)
            idx = np.concatenate([idx, np.full(shape, -1, dtype=np.int64)], -2)
        return [v, idx]

    def merge(self, a: list, b: list, opts: dict) -> list:
        """The K best of two sorted lists, K steps of a vectorized merge."""
        K = int(opts["K"])
        xp = namespace_of(a[0])
        (va, ia), (vb, ib) = a, b
        pa = ia[..., :1, :] * 0
        pb = pa
        out_v, out_i = [], []
        for _ in range(K):
            qa, qb = pa.clip(max=K - 1), pb.clip(max=K - 1)
            av, ai = xp.take_along(va, qa, -2), xp.take_along(ia, qa, -2)
            bv, bi = xp.take_along(vb, qb, -2), xp.take_along(ib, qb, -2)
            ai = xp.where(pa >= K, ai * 0 - 1, ai)
            bi = xp.where(pb >= K, bi * 0 - 1, bi)
            take = _kbetter(bv, bi, av, ai, self.want_min)
            out_v.append(xp.where(take, bv, av))
            out_i.append(xp.where(take, bi, ai))
            pa, pb = pa + (~take), pb + take
        return [_join(xp, out_v), _join(xp, out_i)]

    block_runs = (("kmin_argkmin", "all"),)

    def block_opts(self, opts: dict, m: int) -> dict:
        return {**opts, "K": min(int(opts["K"]), m)}

    def state_layout(self, opts: dict, dim: int) -> list:
        K = int(opts["K"])
        return [((K, dim), "value", float("inf") if self.want_min else float("-inf")),
                ((K, dim), "index", -1)]

    def from_block(self, outs: list, opts: dict, offset: int, dim: int) -> list:
        """(values, global indices) ``(..., K, F)``; a block of fewer than K points pads
        its slots with empty ones."""
        v, i = (o if dim > 1 else o[..., None] for o in outs)  # (..., K_block, F)
        xp = namespace_of(v)
        i = xp.where(i >= 0, i + offset, i)
        pad = int(opts["K"]) - v.shape[-2]
        if pad:
            fill = float("inf") if self.want_min else float("-inf")
            shape = (*v.shape[:-2], pad, v.shape[-1])
            v = xp.cat([v, xp.full(shape, fill, v)], -2)
            i = xp.cat([i, xp.full(shape, -1, i)], -2)
        return [v, i]

    def to_block(self, state: list, opts: dict, offset: int, m: int) -> list:
        k = min(int(opts["K"]), m)
        v, i = state[0][..., :k, :], state[1][..., :k, :]
        i = namespace_of(v).where(i >= 0, i - offset, i)
        return [v, i] if v.shape[-1] > 1 else [v[..., 0], i[..., 0]]

    def block_outputs(self, state: list, opts: dict) -> list:
        """Values and indices ``(..., K)`` (``(..., K, F)`` for F > 1), as one reduction."""
        outs = [state[0]] if self.with_value else []
        outs += [state[1]] if self.with_index else []
        return [o[..., 0] if o.shape[-1] == 1 else o for o in outs]

    def finalize(self, state: list, opts: dict) -> list:
        lead = state[0].shape[:-2]
        outs = []
        if self.with_value:
            outs.append(state[0].reshape(*lead, -1))
        if self.with_index:
            outs.append(state[1].reshape(*lead, -1))
        return outs


def _join(xp, rows):
    """(..., 1, F) pieces into (..., n, F)."""
    return xp.stack([r[..., 0, :] for r in rows], -2)


def _kselect(name, keops_name, with_value, with_index, doc, result, aliases=(), arg_variant=None,
             **method):
    cls_name = keops_name.replace("_", "")
    return register(type(cls_name, (_KSelect,), dict(
        name=name, keops_name=keops_name, with_value=with_value, with_index=with_index,
        aliases=aliases, arg_variant=arg_variant,
        user_outputs=2 if with_value and with_index else 1,
        gradient="gather" if with_value and with_index else None,
        __doc__=doc + _EXAMPLE.format(cls=cls_name, opts='{"K": 2}', result=result), **method)))


KMin = _kselect("kmin", "KMin", True, False, arg_variant="kmin_argkmin", doc="""\
    The K smallest ``f_ij`` over j, sorted, per component (``K.Kmin(K, dim=1)``, option
    ``K``): ``(N, K)``, or ``(N, K, F)`` for F > 1; NaN sorts last, ties keep index order.""",
                result="[[[0.0, 4.0], [1.0, 1.0], [1.0, 9.0]]]",
    method="Kmin", method_doc="""\
    The K smallest values over i or j, sorted, per component (shape (N, K) or
    (N, K, D)); NaN sorts last (as ``np.sort``), ties keep index order; K must be a
    positive integer at most the number of reduced points.

    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
    >>> D = Vi(x).sqdist(Vj(y))     # (3, 2): [[0, 4], [1, 1], [9, 1]]
    >>> D.Kmin(2, dim=1).tolist()
    [[0.0, 4.0], [1.0, 1.0], [1.0, 9.0]]
    """)
ArgKMin = _kselect("argkmin", "ArgKMin", False, True, doc="""\
    The indices j (int64) of the K smallest ``f_ij``, in :class:`KMin`'s order
    (``K.argKmin(K, dim=1)``: the K nearest neighbours for a distance).""",
                   result="[[[0, 1], [0, 1], [1, 0]]]",
    method="argKmin", method_doc="""\
    Indices (int64) of the K smallest values, in the order of :meth:`Kmin`: shape
    ``(N, K)`` for ``dim=1`` (``(N, K, D)`` for D > 1), the K nearest neighbours of
    each i for a distance.

    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
    >>> D = Vi(x).sqdist(Vj(y))     # (3, 2): [[0, 4], [1, 1], [9, 1]]
    >>> D.argKmin(2, dim=1).tolist()
    [[0, 1], [0, 1], [1, 0]]
    """)
KMinArgKMin = _kselect("kmin_argkmin", "KMin_ArgKMin", True, True, aliases=("kminargkmin",),
                       doc="""\
    ``(KMin, ArgKMin)`` in one pass (``K.Kmin_argKmin(K, dim=1)``); its gradient gathers
    through the indices.""",
                       result="[[[0.0, 4.0], [1.0, 1.0], [1.0, 9.0]], [[0, 1], [0, 1], [1, 0]]]",
    method="Kmin_argKmin", method_doc="""\
    ``(Kmin, argKmin)`` in one pass, as :meth:`Kmin` and :meth:`argKmin`.

    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
    >>> D = Vi(x).sqdist(Vj(y))     # (3, 2): [[0, 4], [1, 1], [9, 1]]
    >>> [a.tolist() for a in D.Kmin_argKmin(2, dim=1)]
    [[[0.0, 4.0], [1.0, 1.0], [1.0, 9.0]], [[0, 1], [0, 1], [1, 0]]]
    """)
