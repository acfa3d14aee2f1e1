"""The reduction registry: accumulator, init / push / merge / write hooks, reference.

A reduction sees one formula ``F`` of dimension ``F`` per pair (weighted reductions take
``F = concat(f, w)`` with ``f`` scalar). Its C hooks are emitted once as an ``Acc`` struct
with ``init``, ``push(f, j)`` (one more term), ``tile(fb, nj, j0)`` (a tile of terms laid
out ``fb[c*TJ + jj]``, the CPU fast path), ``merge`` (two partial accumulators, for split-j
schemes) and ``write`` (the outputs of one row). The same struct compiles with g++ and nvcc.

>>> r = get("argkmin"); [o.dim for o in r.outputs(1, {"K": 5})]
[5]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Output:
    dim: int
    kind: str  # "value" (dtype T) or "index" (int64)


class Reduction:
    name: str = ""
    aliases: tuple = ()
    needs_weight = False  # F = concat(f (scalar), w)

    def outputs(self, F: int, opts: dict) -> list[Output]:
        raise NotImplementedError

    def check(self, F: int, opts: dict, M: int | None = None) -> None:
        """Raise ValueError for a formula dimension or options this reduction can't take."""

    def acc_code(self, F: int, opts: dict) -> str:
        """C++ of ``struct Acc`` (uses typedefs T, TA and the constants TJ)."""
        raise NotImplementedError

    def ref(self, values: np.ndarray, opts: dict, j0: int = 0) -> list[np.ndarray]:
        """Reference over the pair axis -2 of ``values`` (..., M, F), float64."""
        raise NotImplementedError


REDUCTIONS: dict[str, Reduction] = {}


def register(cls):
    r = cls()
    for n in (r.name, *r.aliases):
        REDUCTIONS[n.lower()] = r
    return cls


def get(name: str) -> Reduction:
    try:
        return REDUCTIONS[name.lower().replace("_reduction", "")]
    except KeyError:
        raise ValueError(
            f"unknown reduction {name!r}; known: {sorted(set(r.name for r in REDUCTIONS.values()))}"
        ) from None


def _write(outs_index: int, kind: str, dim: int, expr_k: str) -> str:
    ctype = "T" if kind == "value" else "int64_t"
    return (f"{{ {ctype}* o = ({ctype}*)outs[{outs_index}] + row * {dim}; "
            f"for (int k = 0; k < {dim}; ++k) o[k] = {expr_k}; }}")


# ------------------------------------------------------------------------------- Sum


@register
class Sum(Reduction):
    name = "sum"

    def outputs(self, F, opts):
        return [Output(F, "value")]

    def acc_code(self, F, opts):
        scheme = opts.get("sum_scheme", "block_sum")
        add = ("{ TA y = (TA)(x) - c[k]; TA t = s[k] + y; c[k] = (t - s[k]) - y; s[k] = t; }"
               if scheme == "kahan_scheme" else "s[k] += (TA)(x);")
        tile_body = (
            f"for (int k = 0; k < {F}; ++k) {{ for (int jj = 0; jj < nj; ++jj) {{ const T x = fb[k * TJ + jj]; {add} }} }}"
            if scheme in ("direct_sum", "kahan_scheme") else
            f"for (int k = 0; k < {F}; ++k) {{ T t = 0;\n"
            f"      _Pragma(\"omp simd reduction(+:t)\") for (int jj = 0; jj < nj; ++jj) t += fb[k * TJ + jj];\n"
            f"      const T x = t; {add} }}"
        )
        return f"""
struct Acc {{
  TA s[{F}]; TA c[{F}];
  LT_HD LT_INLINE void init() {{ for (int k = 0; k < {F}; ++k) {{ s[k] = 0; c[k] = 0; }} }}
  LT_HD LT_INLINE void push(const T* f, int64_t j) {{ for (int k = 0; k < {F}; ++k) {{ const T x = f[k]; {add} }} }}
  LT_INLINE void tile(const T* fb, int nj, int64_t j0) {{ {tile_body} }}
  LT_HD LT_INLINE void merge(const Acc& o) {{ for (int k = 0; k < {F}; ++k) {{ const TA x = o.s[k] - o.c[k]; {add.replace("(TA)(x)", "x")} }} }}
  LT_HD LT_INLINE void write(void* const* outs, int64_t row) const {{ {_write(0, "value", F, "(T)(s[k] - c[k])")} }}
}};"""

    def ref(self, values, opts, j0=0):
        return [values.sum(axis=-2)]


# ---------------------------------------------------------------- Min / Max and their args

_BETTER = """
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


class _Select(Reduction):
    want_min = True
    with_value = True
    with_index = False

    def outputs(self, F, opts):
        outs = []
        if self.with_value:
            outs.append(Output(F, "value"))
        if self.with_index:
            outs.append(Output(F, "index"))
        return outs

    def acc_code(self, F, opts):
        wm = "true" if self.want_min else "false"
        writes = []
        if self.with_value:
            writes.append(_write(0, "value", F, "v[k]"))
        if self.with_index:
            writes.append(_write(len(writes), "index", F, "i[k]"))
        init_v = "(T)INFINITY" if self.want_min else "-(T)INFINITY"
        return _BETTER + f"""
struct Acc {{
  T v[{F}]; int64_t i[{F}];
  LT_HD LT_INLINE void init() {{ for (int k = 0; k < {F}; ++k) {{ v[k] = {init_v}; i[k] = -1; }} }}
  LT_HD LT_INLINE void push(const T* f, int64_t j) {{
    for (int k = 0; k < {F}; ++k) if (lt_better(f[k], j, v[k], i[k], {wm})) {{ v[k] = f[k]; i[k] = j; }} }}
  // A vectorized pass finds the tile's best value (and any NaN); only a tile that holds
  // a NaN, or a better value, is looked at term by term.
  LT_INLINE void tile(const T* fb, int nj, int64_t j0) {{
    for (int k = 0; k < {F}; ++k) {{
      const T* f = fb + k * TJ;
      T m = {init_v}; int nan = 0;
      _Pragma("omp simd reduction({"min" if self.want_min else "max"}:m) reduction(|:nan)")
      for (int jj = 0; jj < nj; ++jj) {{ const T x = f[jj]; nan |= (x != x); m = x {"<" if self.want_min else ">"} m ? x : m; }}
      if (nan) {{
        for (int jj = 0; jj < nj; ++jj)
          if (lt_better(f[jj], j0 + jj, v[k], i[k], {wm})) {{ v[k] = f[jj]; i[k] = j0 + jj; }}
        continue;
      }}
      // the tile's terms come after every index kept, so a tie does not replace
      if (i[k] >= 0 && !(m {"<" if self.want_min else ">"} v[k])) continue;
      int jj = 0;
      while (!(f[jj] == m)) ++jj;  // the first term equal to the best
      v[k] = f[jj]; i[k] = j0 + jj;
    }} }}
  LT_HD LT_INLINE void merge(const Acc& o) {{
    for (int k = 0; k < {F}; ++k) if (lt_better(o.v[k], o.i[k], v[k], i[k], {wm})) {{ v[k] = o.v[k]; i[k] = o.i[k]; }} }}
  LT_HD LT_INLINE void write(void* const* outs, int64_t row) const {{ {" ".join(writes)} }}
}};"""

    def ref(self, values, opts, j0=0):
        M = values.shape[-2]
        outs = []
        if M == 0:
            shape = values.shape[:-2] + values.shape[-1:]
            v = np.full(shape, np.inf if self.want_min else -np.inf)
            idx = np.full(shape, -1, dtype=np.int64)
        else:
            idx = (values.argmin if self.want_min else values.argmax)(axis=-2)
            v = np.take_along_axis(values, idx[..., None, :], axis=-2)[..., 0, :]
            idx = idx.astype(np.int64) + j0
        if self.with_value:
            outs.append(v)
        if self.with_index:
            outs.append(idx)
        return outs


def _select(name, want_min, with_value, with_index, aliases=()):
    cls = type(name.title(), (_Select,), dict(
        name=name, want_min=want_min, with_value=with_value, with_index=with_index,
        aliases=aliases))
    register(cls)


_select("min", True, True, False)
_select("max", False, True, False)
_select("argmin", True, False, True)
_select("argmax", False, False, True)
_select("min_argmin", True, True, True, aliases=("minargmin",))
_select("max_argmax", False, True, True, aliases=("maxargmax",))


class _KSelect(Reduction):
    want_min = True
    with_value = True
    with_index = False

    def outputs(self, F, opts):
        K = int(opts["K"])
        outs = []
        if self.with_value:
            outs.append(Output(K * F, "value"))
        if self.with_index:
            outs.append(Output(K * F, "index"))
        return outs

    def check(self, F, opts, M=None):
        K = opts.get("K")
        if not isinstance(K, (int, np.integer)) or isinstance(K, bool) or K < 1:
            raise ValueError(f"{self.name}: K must be a positive integer, got {K!r}")
        if M is not None and K > M:
            raise ValueError(f"{self.name}: K={K} is larger than the number of reduced points ({M})")

    def acc_code(self, F, opts):
        K = int(opts["K"])
        wm = "true" if self.want_min else "false"
        init_v = "(T)INFINITY" if self.want_min else "-(T)INFINITY"
        writes = []
        # layout of outputs: [K][F]
        if self.with_value:
            writes.append(_write(0, "value", K * F, f"v[(k % {F}) * {K} + k / {F}]"))
        if self.with_index:
            writes.append(_write(len(writes), "index", K * F, f"i[(k % {F}) * {K} + k / {F}]"))
        return _BETTER + _KMASK + f"""
struct Acc {{
  T v[{F * K}]; int64_t i[{F * K}];   // per component c: v[c*K .. c*K+K) sorted best first
  LT_HD LT_INLINE void init() {{ for (int k = 0; k < {F * K}; ++k) {{ v[k] = {init_v}; i[k] = -1; }} }}
  LT_HD LT_INLINE void insert(int c, T x, int64_t j) {{
    T* vc = v + c * {K}; int64_t* ic = i + c * {K};
    if (!lt_kbetter(x, j, vc[{K - 1}], ic[{K - 1}], {wm})) return;
    int p = {K - 1};
    while (p > 0 && lt_kbetter(x, j, vc[p - 1], ic[p - 1], {wm})) {{ vc[p] = vc[p - 1]; ic[p] = ic[p - 1]; --p; }}
    vc[p] = x; ic[p] = j;
  }}
  LT_HD LT_INLINE void push(const T* f, int64_t j) {{ for (int c = 0; c < {F}; ++c) insert(c, f[c], j); }}
  // Once the K slots are full (and the worst is not NaN), a vectorized pass over a block
  // of 64 terms asks whether any is strictly better than the worst kept (NaN never is);
  // most blocks hold none and cost that pass alone. The others are scanned in order:
  // the terms of a tile come after every kept index, so a tie never enters.
  LT_INLINE void tile(const T* fb, int nj, int64_t j0) {{
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
          if (!(x {"<" if self.want_min else ">"} vc[{K - 1}])) continue;
          int p = {K - 1};
          while (p > 0 && x {"<" if self.want_min else ">"} vc[p - 1]) {{ vc[p] = vc[p - 1]; ic[p] = ic[p - 1]; --p; }}
          vc[p] = x; ic[p] = j0 + q;
        }}
        jj = e;
      }}
    }} }}
  LT_HD LT_INLINE void merge(const Acc& o) {{
    for (int c = 0; c < {F}; ++c) for (int q = 0; q < {K}; ++q) if (o.i[c * {K} + q] >= 0) insert(c, o.v[c * {K} + q], o.i[c * {K} + q]); }}
  LT_HD LT_INLINE void write(void* const* outs, int64_t row) const {{ {" ".join(writes)} }}
}};"""

    def ref(self, values, opts, j0=0):
        K = int(opts["K"])
        key = values if self.want_min else -values
        order = np.argsort(key, axis=-2, kind="stable")[..., :K, :]  # NaN last, ties by index
        v = np.take_along_axis(values, order, axis=-2)  # (..., K, F)
        outs = []
        lead = v.shape[:-2]
        if self.with_value:
            outs.append(v.reshape(*lead, -1))
        if self.with_index:
            outs.append((order + j0).astype(np.int64).reshape(*lead, -1))
        return outs


def _kselect(name, with_value, with_index, aliases=()):
    register(type(name.title(), (_KSelect,), dict(
        name=name, with_value=with_value, with_index=with_index, aliases=aliases)))


_kselect("kmin", True, False)
_kselect("argkmin", False, True)
_kselect("kmin_argkmin", True, True, aliases=("kminargkmin",))


# ------------------------------------------------------------- log-sum-exp and softmax

# Online log-sum-exp: (m, s) represents exp(m) * s. Tiles take their max first so the
# sum of exponentials vectorizes; NaN propagates through s. Infinite terms follow the
# limits (and the reference): with m = +inf each +inf term counts exp(0) = 1 and the finite
# ones 0; -inf terms count 0, so a row of -inf only keeps s = 0 (as an empty row).
_LSE_HELPERS = """
LT_HD LT_INLINE void lt_lse_add(TA& m, TA* s, const TA* t, int n, TA tm) {
  if (tm != tm) { m = tm; for (int c = 0; c < n; ++c) s[c] = tm; return; }  // NaN max, as numpy
  if (tm > m) { const TA sc = exp(m - tm); for (int c = 0; c < n; ++c) s[c] = s[c] * sc + t[c]; m = tm; }
  else if (tm == m) { for (int c = 0; c < n; ++c) s[c] += t[c]; }
  else { const TA sc = exp(tm - m); for (int c = 0; c < n; ++c) s[c] += t[c] * sc; }
}
// The largest of a tile's terms, NaN if one is NaN (the CPU tiles' first pass).
LT_INLINE T lt_tile_max(const T* f, int nj) {
  T tm = -(T)INFINITY; int nan = 0;
  _Pragma("omp simd reduction(max:tm) reduction(|:nan)")
  for (int jj = 0; jj < nj; ++jj) { const T x = f[jj]; nan |= (x != x); tm = x > tm ? x : tm; }
  return nan ? (T)NAN : tm;
}
"""


class _LSEBase(Reduction):
    """m (scalar) and sums s[0..W) of exp(f - m) * w (w = 1 for s[0] when unweighted)."""

    weighted = False

    def _w(self, F):
        return F - 1 if self.weighted else 0

    def check(self, F, opts, M=None):
        if self.weighted and F < 2:
            raise ValueError(f"{self.name}: needs a weight (formula dimension {F})")
        if not self.weighted and F != 1 and self.name != "logsumexp":
            raise ValueError(f"{self.name}: the formula must be scalar, got dimension {F}")

    def _acc(self, nsum: int, weights: str, writes: str) -> str:
        # weights: C expression of the weight of sum c for a term at pointer f (c in [0, nsum)).
        return _LSE_HELPERS + f"""
struct Acc {{
  TA m; TA s[{nsum}];
  LT_HD LT_INLINE void init() {{ m = -(TA)INFINITY; for (int c = 0; c < {nsum}; ++c) s[c] = 0; }}
  LT_HD LT_INLINE void push(const T* f, int64_t j) {{
    if (f[0] == -(T)INFINITY) return;
    TA t[{nsum}]; for (int c = 0; c < {nsum}; ++c) t[c] = {weights.format(f="f", jj="0", stride="1")};
    lt_lse_add(m, s, t, {nsum}, (TA)f[0]); }}
  LT_INLINE void tile(const T* fb, int nj, int64_t j0) {{
    const T tm = lt_tile_max(fb, nj);
    if (tm == -(T)INFINITY) return;
    TA t[{nsum}];
    if (tm == (T)INFINITY) {{  // exp(inf - inf) would be NaN: count the +inf terms
      for (int c = 0; c < {nsum}; ++c) {{ T a = 0;
        for (int jj = 0; jj < nj; ++jj) if (fb[jj] == tm) a += {weights.format(f="fb", jj="jj", stride="TJ")};
        t[c] = a; }}
      lt_lse_add(m, s, t, {nsum}, (TA)tm); return;
    }}
    for (int c = 0; c < {nsum}; ++c) {{ T a = 0;
      _Pragma("omp simd reduction(+:a)") for (int jj = 0; jj < nj; ++jj) a += lt_exp(fb[jj] - tm) * {weights.format(f="fb", jj="jj", stride="TJ")};
      t[c] = a; }}
    lt_lse_add(m, s, t, {nsum}, (TA)tm); }}
  LT_HD LT_INLINE void merge(const Acc& o) {{ if (o.m != -(TA)INFINITY || o.m != o.m) lt_lse_add(m, s, o.s, {nsum}, o.m); }}
  LT_HD LT_INLINE void write(void* const* outs, int64_t row) const {{ {writes} }}
}};"""


@register
class LogSumExp(_LSEBase):
    name = "logsumexp"
    aliases = ("lse",)

    def outputs(self, F, opts):
        return [Output(1, "value")]

    def check(self, F, opts, M=None):
        if F != 1:
            raise ValueError(
                f"logsumexp: the formula must be scalar (dimension 1), got dimension {F}"
            )

    def acc_code(self, F, opts):
        return self._acc(1, "(T)1", _write(0, "value", 1, "(T)(m + log(s[0]))"))

    def ref(self, values, opts, j0=0):
        f = values[..., :1]
        m = _ref_max(f)
        with np.errstate(all="ignore"):
            return [m + np.log(_ref_shifted_exp(f, m).sum(axis=-2))]


@register
class LogSumExpWeight(_LSEBase):
    name = "logsumexp_weight"
    weighted = True

    def outputs(self, F, opts):
        return [Output(F - 1, "value")]

    def acc_code(self, F, opts):
        W = F - 1
        return self._acc(W, "{f}[(1 + c) * {stride} + {jj}]",
                         _write(0, "value", W, "(T)(m + log(s[k]))"))

    def ref(self, values, opts, j0=0):
        f, w = values[..., :1], values[..., 1:]
        m = _ref_max(f)
        with np.errstate(all="ignore"):
            return [m + np.log((_ref_shifted_exp(f, m) * w).sum(axis=-2))]


@register
class SumSoftMaxWeight(_LSEBase):
    """Σ_j softmax_j(f) w_j; also writes the log-sum-exp of f (second output, for gradients)."""

    name = "sumsoftmaxweight"
    aliases = ("sum_softmax_weight", "softmax")
    weighted = True

    def outputs(self, F, opts):
        return [Output(F - 1, "value"), Output(1, "value")]

    def acc_code(self, F, opts):
        W = F - 1
        writes = (_write(0, "value", W, "(T)(s[1 + k] / s[0])") + " "
                  + _write(1, "value", 1, "(T)(m + log(s[0]))"))
        return self._acc(W + 1, "(c == 0 ? (T)1 : {f}[c * {stride} + {jj}])", writes)

    def ref(self, values, opts, j0=0):
        f, w = values[..., :1], values[..., 1:]
        m = _ref_max(f)
        with np.errstate(all="ignore"):
            e = _ref_shifted_exp(f, m)
            s0 = e.sum(axis=-2)
            return [(e * w).sum(axis=-2) / s0, m + np.log(s0)]


@register
class MaxSumShiftExp(_LSEBase):
    """(m, s) with m = max_j f and s = Σ_j exp(f - m): KeOps's Max_SumShiftExp."""

    name = "max_sumshiftexp"
    aliases = ("maxsumshiftexp",)

    def outputs(self, F, opts):
        return [Output(2, "value")]

    def acc_code(self, F, opts):
        return self._acc(1, "(T)1", "{ T* o = (T*)outs[0] + row * 2; o[0] = (T)m; o[1] = (T)s[0]; }")

    def ref(self, values, opts, j0=0):
        f = values[..., 0:1]
        m = _ref_max(f)
        s = _ref_shifted_exp(f, m).sum(axis=-2)
        return [np.concatenate([m, s], axis=-1)]


def _ref_max(f):
    """Max over the pair axis; -inf for empty reductions, NaN if any NaN."""
    if f.shape[-2] == 0:
        return np.full(f.shape[:-2] + f.shape[-1:], -np.inf)
    with np.errstate(all="ignore"):
        m = f.max(axis=-2)
    return np.where(np.isinf(m) & (m < 0), -np.inf, m)


def _ref_shifted_exp(f, m):
    """``exp(f - m)`` for ``m = max f`` (over axis -2), with the limits the kernels use:
    where ``m = +inf`` each +inf term counts 1 and the others 0 (so ``logsumexp`` is +inf,
    as ``scipy.special.logsumexp``, and softmax averages the weights of the +inf terms);
    where ``m = -inf`` (all terms -inf, or none) every term counts 0. NaN propagates."""
    mb = m[..., None, :]
    with np.errstate(all="ignore"):
        e = np.exp(f - mb)
    e = np.where(np.isposinf(mb), (f == mb).astype(e.dtype), e)
    return np.where(np.isneginf(mb), 0.0, e)
