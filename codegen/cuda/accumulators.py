"""CUDA accumulators: one ``struct Acc`` per reduction family, kept in registers.

A thread owns one row i and sees its pairs in increasing j. The CPU's ``Acc``
(:mod:`lazytensor.codegen.reductions`) works on a buffer of a tile's values; on a GPU
such a buffer would be local memory, so the CUDA ``Acc`` takes the pairs one at a time:

- ``push(o, j)``: one pair's formula values ``o[F]`` into the tile's partial;
- ``flush()``: end of a tile (the partial into the running totals);
- ``tile(eval, nj, j0)``: a whole tile, ``eval(jj, o)`` giving pair jj's values (the
  default pushes each pair; log-sum-exp looks at sub-tiles first, see below);
- ``merge(other)`` (split-j partials, flushed) and ``write(outs, row)``.

Every array is indexed with compile-time constants once loops are unrolled, so that it
lives in registers. Per family:

- **Sum**: a float partial per tile (T), added to the TA total (double for float32 unless
  ``dtype_acc``) once per tile: one f64 add per tile and component, none per pair.
  ``kahan_scheme`` compensates each term in TA; ``direct_sum`` adds each term in TA.
- **Min/Max (arg)**: value and index per component; a term replaces the kept one when it
  is better, or NaN (first NaN wins), or the slot is empty; ties keep the lower index.
- **K-min/max (arg)**: per component K sorted slots in registers; the worst kept value is
  the threshold that a term must beat (one compare per pair), and insertion is an
  unrolled compare-and-swap down the K slots.
- **Log-sum-exp family**: ``tile`` takes the pairs in sub-tiles of S (values in
  registers): the sub-tile's max first, then one exp per pair relative to the running
  max, one rescale per sub-tile; the tile's partial (float) joins the totals (TA) once
  per tile. ``push`` (one pair) uses exp(-|f - m|): one exp per pair as well.
"""

from __future__ import annotations

from .. import reductions
from ..reductions.base import write_code
from ..reductions.select import BETTER_CODE as _BETTER  # lt_better / lt_kbetter: NaN, ties

SUMS = ("sum",)
SELECTS = ("min", "max", "argmin", "argmax", "min_argmin", "max_argmax")
KSELECTS = ("kmin", "argkmin", "kmin_argkmin")
LSES = ("logsumexp", "logsumexp_weight", "sumsoftmaxweight", "max_sumshiftexp")
SUPPORTED = SUMS + SELECTS + KSELECTS + LSES


def _write(index: int, kind: str, dim: int, expr: str) -> str:
    return write_code(index, kind, dim, expr)


def acc_code(reduction: str, F: int, opts: dict) -> str:
    """The CUDA ``struct Acc`` of ``reduction`` for a formula of dimension ``F``."""
    red = reductions.get(reduction)
    name = red.name
    if name in SUMS:
        return _sum(F, opts)
    if name in SELECTS:
        return _select(red, F)
    if name in KSELECTS:
        return _kselect(red, F, int(opts["K"]))
    if name in LSES:
        return _lse(name, F)
    raise NotImplementedError(f"the CUDA backend has no accumulator for {name!r} "
                              f"(supported: {', '.join(SUPPORTED)})")


def lse_subtile(F: int) -> int:
    """Pairs per log-sum-exp sub-tile: their F values each stay in registers."""
    s = 16
    while s > 1 and s * F > 32:
        s //= 2
    return s


# ------------------------------------------------------------------------ Sum


def _sum(F: int, opts: dict) -> str:
    scheme = opts.get("sum_scheme", "block_sum")
    kahan = ("{ const TA y = (TA)(x) - c[k]; const TA t = s[k] + y; c[k] = (t - s[k]) - y; "
             "s[k] = t; }")
    if scheme == "kahan_scheme":
        push = f"for (int k = 0; k < {F}; ++k) {{ const T x = o[k]; {kahan} }}"
        flush = ""
    elif scheme == "direct_sum":
        push = f"for (int k = 0; k < {F}; ++k) s[k] += (TA)o[k];"
        flush = ""
    else:
        push = f"for (int k = 0; k < {F}; ++k) p[k] += o[k];"
        flush = f"for (int k = 0; k < {F}; ++k) {{ s[k] += (TA)p[k]; p[k] = 0; }}"
    merge = (f"for (int k = 0; k < {F}; ++k) {{ const TA x = o.s[k] - o.c[k]; "
             + kahan.replace("(TA)(x)", "x") + " }")
    return f"""
struct Acc {{
  TA s[{F}]; TA c[{F}]; T p[{F}];  // totals, compensation (Kahan), this tile's partial
  LT_HD LT_INLINE void init() {{
#pragma unroll
    for (int k = 0; k < {F}; ++k) {{ s[k] = 0; c[k] = 0; p[k] = 0; }}
  }}
  LT_HD LT_INLINE void push(const T* o, int64_t j) {{
#pragma unroll
    {push}
  }}
  LT_HD LT_INLINE void flush() {{
#pragma unroll
    {flush}
  }}
  template <class Eval>
  LT_HD LT_INLINE void tile(Eval&& eval, int nj, int64_t j0) {{
#pragma unroll 2
    for (int jj = 0; jj < nj; ++jj) {{ T o[{F}]; eval(jj, o); push(o, j0 + jj); }}
    flush();
  }}
  LT_HD LT_INLINE void merge(const Acc& o) {{
#pragma unroll
    {merge}
  }}
  LT_HD LT_INLINE void write(void* const* outs, int64_t row) const {{ {_write(0, "value", F, "(T)(s[k] - c[k])")} }}
}};"""


# ------------------------------------------------------------------ Min / Max


def _select(red, F: int) -> str:
    wm = "true" if red.want_min else "false"
    lt = "<" if red.want_min else ">"
    init_v = "(T)INFINITY" if red.want_min else "-(T)INFINITY"
    writes = []
    if red.with_value:
        writes.append(_write(0, "value", F, "v[k]"))
    if red.with_index:
        writes.append(_write(len(writes), "index", F, "i[k]"))
    return _BETTER + f"""
struct Acc {{
  T v[{F}]; int64_t i[{F}];
  LT_HD LT_INLINE void init() {{
#pragma unroll
    for (int k = 0; k < {F}; ++k) {{ v[k] = {init_v}; i[k] = -1; }}
  }}
  // j grows from call to call: a tie never replaces, NaN replaces a number once
  LT_HD LT_INLINE void push(const T* o, int64_t j) {{
#pragma unroll
    for (int k = 0; k < {F}; ++k) {{
      const T x = o[k];
      if (x {lt} v[k] || i[k] < 0 || (x != x && v[k] == v[k])) {{ v[k] = x; i[k] = j; }}
    }}
  }}
  LT_HD LT_INLINE void flush() {{}}
  template <class Eval>
  LT_HD LT_INLINE void tile(Eval&& eval, int nj, int64_t j0) {{
#pragma unroll 2
    for (int jj = 0; jj < nj; ++jj) {{ T o[{F}]; eval(jj, o); push(o, j0 + jj); }}
  }}
  LT_HD LT_INLINE void merge(const Acc& o) {{
#pragma unroll
    for (int k = 0; k < {F}; ++k)
      if (lt_better(o.v[k], o.i[k], v[k], i[k], {wm})) {{ v[k] = o.v[k]; i[k] = o.i[k]; }}
  }}
  LT_HD LT_INLINE void write(void* const* outs, int64_t row) const {{ {" ".join(writes)} }}
}};"""


# ------------------------------------------------------------------ K-min / K-max


def _kselect(red, F: int, K: int) -> str:
    wm = "true" if red.want_min else "false"
    lt = "<" if red.want_min else ">"
    init_v = "(T)INFINITY" if red.want_min else "-(T)INFINITY"
    writes = []
    if red.with_value:
        writes.append(_write(0, "value", K * F, f"v[(k % {F}) * {K} + k / {F}]"))
    if red.with_index:
        writes.append(_write(len(writes), "index", K * F, f"i[(k % {F}) * {K} + k / {F}]"))
    return _BETTER + f"""
struct Acc {{
  T v[{F * K}]; int64_t i[{F * K}];  // per component c: v[c*K .. c*K+K) sorted, best first
  LT_HD LT_INLINE void init() {{
#pragma unroll
    for (int k = 0; k < {F * K}; ++k) {{ v[k] = {init_v}; i[k] = -1; }}
  }}
  // The candidate walks down the K slots, swapping with every slot it beats: unrolled,
  // so that the slots stay in registers.
  LT_HD LT_INLINE void insert(int c, T x, int64_t j) {{
#pragma unroll
    for (int q = 0; q < {K}; ++q) {{
      const int s = c * {K} + q;
      if (lt_kbetter(x, j, v[s], i[s], {wm})) {{
        const T tv = v[s]; const int64_t ti = i[s];
        v[s] = x; i[s] = j; x = tv; j = ti;
      }}
    }}
  }}
  // The worst kept value is the threshold: full slots holding no NaN admit a term only if
  // it is strictly better (j grows: a tie never enters); otherwise the full rule decides.
  LT_HD LT_INLINE void push(const T* o, int64_t j) {{
#pragma unroll
    for (int c = 0; c < {F}; ++c) {{
      const T x = o[c];
      const T thr = v[c * {K} + {K - 1}];
      const bool simple = i[c * {K} + {K - 1}] >= 0 && thr == thr;
      if (simple ? x {lt} thr : lt_kbetter(x, j, thr, i[c * {K} + {K - 1}], {wm})) insert(c, x, j);
    }}
  }}
  LT_HD LT_INLINE void flush() {{}}
  template <class Eval>
  LT_HD LT_INLINE void tile(Eval&& eval, int nj, int64_t j0) {{
    for (int jj = 0; jj < nj; ++jj) {{ T o[{F}]; eval(jj, o); push(o, j0 + jj); }}
  }}
  LT_HD LT_INLINE void merge(const Acc& o) {{
#pragma unroll
    for (int c = 0; c < {F}; ++c)
#pragma unroll
      for (int q = 0; q < {K}; ++q)
        if (o.i[c * {K} + q] >= 0) insert(c, o.v[c * {K} + q], o.i[c * {K} + q]);
  }}
  LT_HD LT_INLINE void write(void* const* outs, int64_t row) const {{ {" ".join(writes)} }}
}};"""


# ------------------------------------------------------------- log-sum-exp family

_LSE_HELPERS = """
// (m, s) stands for exp(m) * s. Adds the terms t (relative to tm); NaN propagates, +inf
// terms count 1 each (exp(inf - inf) would be NaN), -inf terms nothing.
LT_HD LT_INLINE void lt_lse_add(TA& m, TA* s, const TA* t, int n, TA tm) {
  if (tm != tm) { m = tm; for (int c = 0; c < n; ++c) s[c] = tm; return; }
  if (tm > m) { const TA sc = exp(m - tm); for (int c = 0; c < n; ++c) s[c] = s[c] * sc + t[c]; m = tm; }
  else if (tm == m) { for (int c = 0; c < n; ++c) s[c] += t[c]; }
  else { const TA sc = exp(tm - m); for (int c = 0; c < n; ++c) s[c] += t[c] * sc; }
}
// max that keeps a NaN
LT_HD LT_INLINE T lt_nmax(T a, T b) { return (a != a || a > b) ? a : b; }
"""


def _lse(name: str, F: int) -> str:
    weighted = name in ("logsumexp_weight", "sumsoftmaxweight")
    if name == "sumsoftmaxweight":
        nsum, weight = F, "(c == 0 ? (T)1 : {o}[c])"
        writes = (_write(0, "value", F - 1, "(T)(s[1 + k] / s[0])") + " "
                  + _write(1, "value", 1, "(T)(m + log(s[0]))"))
    elif weighted:
        nsum, weight = F - 1, "{o}[1 + c]"
        writes = _write(0, "value", F - 1, "(T)(m + log(s[k]))")
    elif name == "max_sumshiftexp":
        nsum, weight = 1, "(T)1"
        writes = "{ T* o = (T*)outs[0] + row * 2; o[0] = (T)m; o[1] = (T)s[0]; }"
    else:
        nsum, weight = 1, "(T)1"
        writes = _write(0, "value", 1, "(T)(m + log(s[0]))")
    S = lse_subtile(F)
    w_of = weight.format(o="ov[q]")
    w_push = weight.format(o="o")
    return _LSE_HELPERS + f"""
struct Acc {{
  TA m; TA s[{nsum}];   // totals: exp(m) * s
  T pm; T ps[{nsum}];   // this tile's partial
  LT_HD LT_INLINE void init() {{
    m = -(TA)INFINITY; pm = -(T)INFINITY;
#pragma unroll
    for (int c = 0; c < {nsum}; ++c) {{ s[c] = 0; ps[c] = 0; }}
  }}
  // one pair: exp(-|f - pm|) is either the new term or the old partial's scale
  LT_HD LT_INLINE void push(const T* o, int64_t j) {{
    const T x = o[0];
    if (x == -(T)INFINITY) return;
    const bool up = x > pm;
    const T e = x == pm ? (T)1 : exp(-fabs(x - pm));
    const T sc = up ? e : (T)1, et = up ? (T)1 : e;
#pragma unroll
    for (int c = 0; c < {nsum}; ++c) ps[c] = ps[c] * sc + et * {w_push};
    pm = up || x != x ? x : pm;
  }}
  LT_HD LT_INLINE void flush() {{
    if (pm == -(T)INFINITY && !(ps[0] != ps[0])) return;
    TA t[{nsum}];
#pragma unroll
    for (int c = 0; c < {nsum}; ++c) {{ t[c] = (TA)ps[c]; ps[c] = 0; }}
    lt_lse_add(m, s, t, {nsum}, (TA)pm);
    pm = -(T)INFINITY;
  }}
  // Sub-tiles of {S} pairs: their values in registers, their max, then one exp per pair.
  template <class Eval>
  LT_HD LT_INLINE void tile(Eval&& eval, int nj, int64_t j0) {{
    for (int jb = 0; jb < nj; jb += {S}) {{
      T ov[{S}][{F}];
      T bm = -(T)INFINITY;
#pragma unroll
      for (int q = 0; q < {S}; ++q) {{
        if (jb + q < nj) eval(jb + q, ov[q]);
        else {{
#pragma unroll
          for (int k = 0; k < {F}; ++k) ov[q][k] = k == 0 ? -(T)INFINITY : (T)0;
        }}
        bm = lt_nmax(bm, ov[q][0]);
      }}
      const T nm = lt_nmax(pm, bm);
      if (nm == -(T)INFINITY) continue;
      const T sc = pm == nm ? (T)1 : exp(pm - nm);
#pragma unroll
      for (int c = 0; c < {nsum}; ++c) ps[c] *= sc;
#pragma unroll
      for (int q = 0; q < {S}; ++q) {{
        const T x = ov[q][0];
        const T e = x == nm ? (T)1 : exp(x - nm);
#pragma unroll
        for (int c = 0; c < {nsum}; ++c) ps[c] += e * {w_of};
      }}
      pm = nm;
    }}
    flush();
  }}
  LT_HD LT_INLINE void merge(const Acc& o) {{ if (o.m != -(TA)INFINITY || o.m != o.m) lt_lse_add(m, s, o.s, {nsum}, o.m); }}
  LT_HD LT_INLINE void write(void* const* outs, int64_t row) const {{ {writes} }}
}};"""


__all__ = ["SUPPORTED", "acc_code", "lse_subtile"]
