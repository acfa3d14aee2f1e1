"""CPU sums of vector-valued terms as weighted sums of j-vectors (see codegen.linearize).

For a Sum whose formula is ``Σ_t coef_t s_t(i, j) B_t(j)`` plus narrow components (``K @ V``
with V of 64 columns, gradients of kernels in dimension 64 once their row terms are split
off), the pair loop evaluates only the narrow formula -- the weights ``s_t`` and the
direct components -- vectorized across j like any scalar kernel. Per tile of j, each
column term then adds ``Σ_jj s_t[jj] B_t[j0 + jj, :]`` to its slice of the accumulator:
a product of a row of weights with a (tile × E) block of B read in place (row-major, as
the user's array), the E accumulators of a pass in vector registers (up to 8 vectors)
and each weight broadcast. Partial sums of a tile are in T and added to the running
accumulator in TA, as ``block_sum`` does.

This module emits that ``Acc`` and the call the pair loop makes after ``Acc::tile``; the
skeleton is :mod:`lazytensor.codegen.cpu.rows`'s.
"""

from __future__ import annotations

from .. import ir
from ..linearize import Linear, column_source
from ..reductions.lse import LSE_HELPERS

_TEMPLATES = """
// out[e] = sum_jj w[jj] * B[jj * LD + e] for e in [e0, e0 + NV * LT_W): one pass, NV
// vectors of accumulators in registers, each weight broadcast, B read row by row.
template <int NV, int LD>
static LT_INLINE void lt_wpass(int e0, const T* __restrict__ w, const T* __restrict__ B,
                               int nj, T* __restrict__ out) {
  lt_vec acc[NV];
  #pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) acc[v] = lt_vec{};
  for (int jj = 0; jj < nj; ++jj) {
    const lt_vec s = lt_vec{} + w[jj];
    const T* b = B + (size_t)jj * LD + e0;
    #pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      lt_vec x;
      memcpy(&x, b + v * LT_W, sizeof(lt_vec));
      acc[v] += s * x;
    }
  }
  #pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) memcpy(out + e0 + v * LT_W, &acc[v], sizeof(lt_vec));
}
// out[e] = sum_jj w[jj] * B[jj * LD + e] for e in [E0, E) (LD: the length of B's rows, E
// or more when the factor is a slice of a j-variable): a loop of full passes of 8
// vectors, one shorter pass, then the last E - E0 < LT_W components one by one. A loop,
// not a pass per template instance: the code (and its compile time) does not grow with E.
template <int E, int LD, int E0>
struct LtWsum {
  enum { FULL = 8 * LT_W, NP = (E - E0) / FULL, LEFT = (E - E0) % FULL / LT_W,
         TAIL = E0 + NP * FULL + LEFT * LT_W };
  static LT_INLINE void run(const T* w, const T* B, int nj, T* out) {
    for (int p = 0; p < NP; ++p) lt_wpass<8, LD>(E0 + p * FULL, w, B, nj, out);
    if (LEFT) lt_wpass<(LEFT > 0 ? LEFT : 1), LD>(E0 + NP * FULL, w, B, nj, out);
    for (int e = TAIL; e < E; ++e) {
      T t = 0;
      for (int jj = 0; jj < nj; ++jj) t += w[jj] * B[(size_t)jj * LD + e];
      out[e] = t;
    }
  }
};
// out[q * os + e] (+)= coef * sum_k w[k * wk + q * ws] * B[k * LD + e] for q < Q, e in
// [e0, e0 + NV * LT_W): Q weighted sums at once, each vector of B loaded once for the Q
// of them, Q x NV independent accumulators in registers (a GEMM micro-kernel), where one
// at a time is a chain of loads per multiply-add. The rows of a block against a tile
// (k: the tile's columns, q: the rows; lt_wblock) and the columns of a tile against a
// block (k: the rows, q: the columns; the two-sided kernel's lt_jside) are both this;
// ADD: added into out (else stored).
template <int NV, int LD, int Q, bool ADD>
static LT_INLINE void lt_wpass_block(int e0, const T* __restrict__ w, int ws, int wk, int n,
                                     const T* __restrict__ B, T coef, T* __restrict__ out,
                                     int os) {
  lt_vec acc[Q][NV];
  #pragma GCC unroll 32
  for (int q = 0; q < Q * NV; ++q) acc[q / NV][q % NV] = lt_vec{};
  for (int k = 0; k < n; ++k) {
    const T* b = B + (size_t)k * LD + e0;
    lt_vec x[NV];
    #pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) memcpy(&x[v], b + v * LT_W, sizeof(lt_vec));
    #pragma GCC unroll 8
    for (int q = 0; q < Q; ++q) {
      const lt_vec s = w[(size_t)k * wk + q * ws] - lt_vec{};
      #pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[q][v] += s * x[v];
    }
  }
  #pragma GCC unroll 32
  for (int q = 0; q < Q * NV; ++q) {
    T* o = out + (q / NV) * os + e0 + (q % NV) * LT_W;
    lt_vec t = coef * acc[q / NV][q % NV];
    if (ADD) { lt_vec p; memcpy(&p, o, sizeof p); t += p; }
    memcpy(o, &t, sizeof t);
  }
}
// vectors per pass: 6 rows x 4 vectors are 24 accumulators of AVX-512's 32 registers
// (6 x 2 = 12 of 16 below)
enum { LT_WNV = LT_VB == 64 ? 4 : 2 };
// [E0, E) by a loop of full passes, one shorter pass and the last components one by one
// (as LtWsum).
template <int E, int LD, int E0, int Q, bool ADD>
struct LtWsumBlock {
  enum { FULL = LT_WNV * LT_W, NP = (E - E0) / FULL, LEFT = (E - E0) % FULL / LT_W,
         TAIL = E0 + NP * FULL + LEFT * LT_W };
  static LT_INLINE void run(const T* w, int ws, int wk, int n, const T* B, T coef, T* out,
                            int os) {
    for (int p = 0; p < NP; ++p)
      lt_wpass_block<LT_WNV, LD, Q, ADD>(E0 + p * FULL, w, ws, wk, n, B, coef, out, os);
    if (LEFT)
      lt_wpass_block<(LEFT > 0 ? LEFT : 1), LD, Q, ADD>(E0 + NP * FULL, w, ws, wk, n, B, coef,
                                                      out, os);
    for (int q = 0; q < Q; ++q)
      for (int e = TAIL; e < E; ++e) {
        T t = 0;
        for (int k = 0; k < n; ++k) t += w[(size_t)k * wk + q * ws] * B[(size_t)k * LD + e];
        out[q * os + e] = ADD ? out[q * os + e] + coef * t : coef * t;
      }
  }
};
"""

# Rows whose column terms go through one micro-kernel call (lt_wpass_block), in kernels
# with dot products (row blocks of LT_R = 12 or 6 rows, each row its tile buffer). Measured
# on the D = 64 Gaussian gradient's kernels (one thread, AVX-512): one row at a time
# 73 ms, 4 rows x 4 vectors 66 ms, 6 x 4 51 ms, 12 x 2 60 ms (the forward: 27 ms).
WIDE_ROWS = 6


def _bvars(lin: Linear) -> list:
    return sorted({column_source(t.factor)[0] for t in lin.col_terms})


def _coef(c: float) -> str:
    return "" if c == 1.0 else f"(T){float.hex(c)} * "


def wide_acc_code(lin: Linear, opts: dict) -> str:
    """``struct Acc`` for ``lin`` (the full output, F = lin.dim components) and the
    templates it uses; ``tile`` handles the direct components, ``wtile`` the column terms
    (``B{k}`` is the item's pointer to j-variable k, row 0); then ``lt_wblock``."""
    kahan = opts.get("sum_scheme") == "kahan_scheme"
    add = ("{ TA y = (TA)(x) - c[q]; TA t = s[q] + y; c[q] = (t - s[q]) - y; s[q] = t; }"
           if kahan else "s[q] += (TA)(x);")
    params = ", ".join(f"const T* __restrict__ B{k}" for k in _bvars(lin))
    return _TEMPLATES + _sum_acc(lin, add, params) + _row_block_sums(lin, params)


def _column_sum(t, add: str) -> tuple:
    """(in ``wtile``, in ``push``) the C++ of column term ``t``: its weighted sum of a
    tile's j-vectors, or one pair's term."""
    k, start, ld = column_source(t.factor)
    E = t.dim
    tile = (f"    LtWsum<{E}, {ld}, 0>::run(fb + {t.weight} * TJ, B{k} + j0 * {ld} + {start}, "
            f"nj, part);\n"
            f"    for (int e = 0; e < {E}; ++e) {{ const T x = {_coef(t.coef)}part[e]; "
            f"const int q = {t.offset} + e; {add} }}")
    push = (f"    for (int e = 0; e < {E}; ++e) {{ const T x = {_coef(t.coef)}f[{t.weight}] * "
            f"B{k}[j * {ld} + {start} + e]; const int q = {t.offset} + e; {add} }}")
    return tile, push


def _sum_acc(lin: Linear, add: str, params: str) -> str:
    """The ``Acc`` of a Sum: sums (and compensations) per output component; ``tile``
    sums the direct components of a tile, ``wtile`` adds the column terms."""
    F = lin.dim
    direct = []
    for comp, off in lin.direct:
        direct.append(f"    {{ T t = 0; _Pragma(\"omp simd reduction(+:t)\") for (int jj = 0; jj < nj; ++jj) "
                      f"t += fb[{comp} * TJ + jj]; const T x = t; const int q = {off}; {add} }}")
    push_direct = [f"    {{ const T x = f[{comp}]; const int q = {off}; {add} }}"
                   for comp, off in lin.direct]
    cols, push_cols = zip(*(_column_sum(t, add) for t in lin.col_terms))
    emax = max(t.dim for t in lin.col_terms)
    merge_add = add.replace("(TA)(x)", "x")
    nl = "\n"
    return f"""
struct Acc {{
  TA s[{F}]; TA c[{F}];
  LT_INLINE void init() {{ for (int q = 0; q < {F}; ++q) {{ s[q] = 0; c[q] = 0; }} }}
  // the direct components of a tile (fb: the narrow formula, fb[q * TJ + jj])
  LT_INLINE void tile(const T* fb, int nj, int64_t j0) {{
    (void)fb; (void)nj; (void)j0;
{nl.join(direct)}
  }}
  // the column terms of the same tile, B_k read from row j0
  LT_INLINE void wtile(const T* fb, int nj, int64_t j0, {params}) {{
    alignas(64) T part[{emax}];
{nl.join(cols)}
  }}
  LT_INLINE void push(const T* f, int64_t j, {params}) {{
{nl.join(push_direct + list(push_cols))}
  }}
  LT_INLINE void merge(const Acc& o) {{ for (int q = 0; q < {F}; ++q) {{ const TA x = o.s[q] - o.c[q]; {merge_add} }} }}
  LT_INLINE void write(void* const* outs, int64_t row) const {{
    T* o = (T*)outs[0] + row * {F};
    for (int q = 0; q < {F}; ++q) o[q] = (T)(s[q] - c[q]);
  }}
  LT_INLINE void wadd(int q, T x) {{ {add} }}
}};
"""


def _row_block_sums(lin: Linear, params: str) -> str:
    """``lt_wblock``: the column terms of a tile for a block of rows, by WIDE_ROWS rows at
    once through the micro-kernel."""
    emax = max(t.dim for t in lin.col_terms)
    rows_cols = []
    for t in lin.col_terms:
        k, start, ld = column_source(t.factor)
        E = t.dim
        rows_cols.append(
            f"    LtWsumBlock<{E}, {ld}, 0, {WIDE_ROWS}, false>::run(fb + (size_t)r * fs + "
            f"{t.weight} * TJ, fs, 1, nj, B{k} + j0 * {ld} + {start}, (T)1, part, {emax});\n"
            f"    for (int rr = 0; rr < {WIDE_ROWS}; ++rr) for (int e = 0; e < {E}; ++e) "
            f"accs[r + rr].wadd({t.offset} + e, {_coef(t.coef)}part[rr * {emax} + e]);")
    bargs = ", ".join(f"B{k}" for k in _bvars(lin))
    nl = "\n"
    return f"""
// The column terms of a tile for nr rows (row r's tile buffer at fb + r * fs): by
// {WIDE_ROWS} rows through the micro-kernel, the rest one by one (Acc::wtile).
static LT_INLINE void lt_wblock(const T* fb, int fs, int nr, int nj, int64_t j0, Acc* accs, {params}) {{
  int r = 0;
  for (; r + {WIDE_ROWS} <= nr; r += {WIDE_ROWS}) {{
    alignas(64) T part[{WIDE_ROWS} * {emax}];
{nl.join(rows_cols)}
  }}
  for (; r < nr; ++r) accs[r].wtile(fb + (size_t)r * fs, nj, j0, {bargs});
}}
"""


def wide_softmax_acc_code(lin: Linear, red) -> str:
    """``struct Acc`` of a softmax-weighted sum (or weighted log-sum-exp) whose weight
    ``F[1:]`` is wide: per tile, the max of f, ``e = exp(f - max)`` once, then each column
    term as the weighted sum of its j-vectors with weights ``e * s``; the running sums are
    rescaled when the max grows, as the narrow reductions do (``lt_lse_add``)."""
    E = lin.dim - 1  # the weight's dimension
    softmax = red.total_sum
    base = 1 if softmax else 0  # s[0] = Σ e for the softmax; the weight sums follow
    nsum = base + E
    f_comp = next(q for q, off in lin.direct if off == 0)
    terms = []
    for q, off in lin.direct:
        if off == 0:
            continue
        terms.append(f"    {{ T a = 0; _Pragma(\"omp simd reduction(+:a)\") for (int jj = 0; jj < nj; ++jj) "
                     f"a += e[jj] * fb[{q} * TJ + jj]; t[{base + off - 1}] += a; }}")
    for t in lin.col_terms:
        k, start, ld = column_source(t.factor)
        D = t.dim
        w = lin.components[t.weight]
        if ir.const_value(w) == 1.0:
            weights = "e"
        else:
            terms.append(f"    for (int jj = 0; jj < nj; ++jj) we[jj] = e[jj] * fb[{t.weight} * TJ + jj];")
            weights = "we"
        terms.append(f"    LtWsum<{D}, {ld}, 0>::run({weights}, B{k} + j0 * {ld} + {start}, nj, part);\n"
                     f"    for (int q = 0; q < {D}; ++q) t[{base + t.offset - 1} + q] += "
                     f"{_coef(t.coef)}part[q];")
    if softmax:
        terms.insert(0, "    { T a = 0; _Pragma(\"omp simd reduction(+:a)\") for (int jj = 0; jj < nj; ++jj) "
                        "a += e[jj]; t[0] = a; }")
    writes = red.writes(lin.dim)
    bvars = _bvars(lin)
    params = ", ".join(f"const T* __restrict__ B{k}" for k in bvars)
    emax = max(t.dim for t in lin.col_terms)
    nl = "\n"
    return _TEMPLATES + LSE_HELPERS + f"""
struct Acc {{
  TA m; TA s[{nsum}];
  LT_INLINE void init() {{ m = -(TA)INFINITY; for (int c = 0; c < {nsum}; ++c) s[c] = 0; }}
  LT_INLINE void tile(const T* fb, int nj, int64_t j0) {{ (void)fb; (void)nj; (void)j0; }}
  LT_INLINE void wtile(const T* fb, int nj, int64_t j0, {params}) {{
    const T* f = fb + {f_comp} * TJ;
    const T tm = lt_tile_max(f, nj);
    if (tm == -(T)INFINITY) return;
    TA t[{nsum}];
    for (int c = 0; c < {nsum}; ++c) t[c] = 0;
    if (tm != tm) {{ lt_lse_add(m, s, t, {nsum}, (TA)tm); return; }}
    alignas(64) T e[TJ]; alignas(64) T we[TJ]; alignas(64) T part[{emax}];
    (void)we;
    if (tm == (T)INFINITY) {{  // exp(inf - inf) would be NaN: the +inf terms count 1
      for (int jj = 0; jj < nj; ++jj) e[jj] = f[jj] == tm ? (T)1 : (T)0;
    }} else {{
      _Pragma("omp simd") for (int jj = 0; jj < nj; ++jj) e[jj] = lt_exp(f[jj] - tm);
    }}
{nl.join(terms)}
    lt_lse_add(m, s, t, {nsum}, (TA)tm);
  }}
  LT_INLINE void merge(const Acc& o) {{ if (o.m != -(TA)INFINITY || o.m != o.m) lt_lse_add(m, s, o.s, {nsum}, o.m); }}
  LT_INLINE void write(void* const* outs, int64_t row) const {{ {writes} }}
}};
"""


def wide_call(lin: Linear, acc: str = "accs[i - i0]") -> str:
    """The statement the pair loop runs after ``Acc::tile`` (item pointers ``P{k}``)."""
    bvars = _bvars(lin)
    return f"{acc}.wtile(fb, nj, j0, {', '.join(f'P{k}' for k in bvars)});"


def wide_block_call(lin: Linear, fb_stride: str, accs: str = "accs") -> str:
    """The statement a row block runs after its rows' pair loops (rows ig..ig + nr, row
    r's tile buffer at ``fb + r * fb_stride``, their accumulators from ``accs + (ig - i0)``):
    :func:`wide_acc_code`'s ``lt_wblock``."""
    bvars = _bvars(lin)
    return (f"lt_wblock(fb, {fb_stride}, nr, nj, j0, {accs} + (ig - i0), "
            f"{', '.join(f'P{k}' for k in bvars)});")
