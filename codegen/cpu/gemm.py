"""The CPU kernel's dot products as a small GEMM (BLIS-style), as C++ text.

``⟨A_i, B_j⟩`` and ``|A_i - B_j|²`` of dimension D >= ``DOT_MIN_DIM`` (see
:mod:`lazytensor.codegen.cpu.plan`) are computed for a block of ``LT_R`` rows and a tile of
j at once: the j-operand of a chunk is packed in panels of ``LT_NR`` = 2 vectors of
columns, each panel k-major (transposed in registers, ``lt_pack``); the item's rows are
packed once, k-major, with their norms; the micro-kernel ``lt_mk`` keeps LT_R x 2 vector
accumulators in registers and per k broadcasts LT_R row values against 2 vectors of the
panel. LT_R = 12 with AVX-512 (32 vector registers), 6 otherwise (16), chosen at compile
time (:func:`lazytensor.codegen.cpu.simd.vector_header`).

>>> "lt_mk" in dot_micro() and "lt_dot64" in dot_kernel(64) and "lt_sqdist64" in sqdist_fix(64)
True
"""

from __future__ import annotations


def dot_micro() -> str:
    """The micro-kernel of the dot products and the packing of their j-operands, shared by
    every dimension: the integer vector type and the transpose stages, ``lt_pack``,
    ``lt_mk``."""
    return _TRANSPOSE + _PACK + _MICRO_KERNEL


# One stage of an LT_W x LT_W transpose in registers (g++'s vector shuffles).
_TRANSPOSE = """
#if !defined(__clang__)
template <int S> struct lt_int_of;
template <> struct lt_int_of<4> { typedef int32_t type; };
template <> struct lt_int_of<8> { typedef int64_t type; };
typedef typename lt_int_of<sizeof(T)>::type lt_int;
typedef lt_int lt_ivec __attribute__((vector_size(LT_VB)));

// One stage of an LT_W x LT_W transpose in registers: rows a and a + H exchange their
// blocks of H lanes (the stages H = 1, 2, ..., LT_W / 2 transpose the whole block).
template <int H>
static LT_INLINE void lt_tstage(lt_vec* v) {
  lt_ivec ma, mb;
  for (int l = 0; l < LT_W; ++l) {
    ma[l] = (l & H) ? LT_W + l - H : l;
    mb[l] = (l & H) ? LT_W + l : l + H;
  }
  #pragma GCC unroll 16
  for (int a = 0; a < LT_W; ++a) {
    if (a & H) continue;
    const lt_vec x = v[a], y = v[a + H];
    v[a] = __builtin_shuffle(x, y, ma);
    v[a + H] = __builtin_shuffle(x, y, mb);
  }
}
#endif

"""

# The j-operand of a chunk packed in panels, by blocks transposed in registers.
_PACK = """// Columns [0, nc) of P (row-major, KD components each) into panels of LT_NR columns, each
// panel k-major (Z[p * KD + k * LT_NR + q] = column p + q, component k), zero-padded to
// ncp columns. By LT_W x LT_W blocks transposed in registers: a copy one component at a
// time would cost a quarter of the products' time at D = 256.
template <int KD>
static __attribute__((noinline)) void lt_pack(const T* __restrict__ P, int64_t nc, int64_t ncp,
                                              T* __restrict__ Z) {
  int64_t j = 0;
#if !defined(__clang__)
  for (; j + LT_W <= nc; j += LT_W) {
    const T* src = P + j * KD;
    T* z = Z + j / LT_NR * (LT_NR * KD) + j % LT_NR;
    int q = 0;
    for (; q + LT_W <= KD; q += LT_W) {
      lt_vec v[LT_W];
      #pragma GCC unroll 16
      for (int a = 0; a < LT_W; ++a) memcpy(&v[a], src + a * KD + q, LT_VB);
      lt_tstage<1>(v);
      if (LT_W > 2) lt_tstage<2 % LT_W>(v);
      if (LT_W > 4) lt_tstage<4 % LT_W>(v);
      if (LT_W > 8) lt_tstage<8 % LT_W>(v);
      #pragma GCC unroll 16
      for (int a = 0; a < LT_W; ++a) memcpy(z + (q + a) * LT_NR, &v[a], LT_VB);
    }
    for (; q < KD; ++q)
      for (int a = 0; a < LT_W; ++a) z[q * LT_NR + a] = src[a * KD + q];
  }
#endif
  for (; j < ncp; ++j) {
    T* z = Z + j / LT_NR * (LT_NR * KD) + j % LT_NR;
    if (j < nc) for (int q = 0; q < KD; ++q) z[q * LT_NR] = P[j * KD + q];
    else for (int q = 0; q < KD; ++q) z[q * LT_NR] = 0;
  }
}
"""

# The register-blocked product of a row block and a panel.
_MICRO_KERNEL = """// G[r*TJ + jj] = sum_k A[k*LT_R + r] B[k*LT_NR + jj] for RR rows and one panel of LT_NR
// columns: A is the row block packed k-major, B a panel packed k-major (both read with
// unit stride, the panel from L2, the block from L1). The RR x 2 accumulators stay in
// registers, each vector of B serves RR rows.
template <int RR, int KD>
static LT_INLINE void lt_mk(const T* __restrict__ A, const T* __restrict__ B,
                            T* __restrict__ G) {
  lt_vec acc[RR][2];
  #pragma GCC unroll 16
  for (int r = 0; r < RR; ++r) acc[r][0] = acc[r][1] = lt_vec{};
  #pragma GCC unroll 2
  for (int k = 0; k < KD; ++k) {
    lt_vec b0, b1;
    memcpy(&b0, B + k * LT_NR, LT_VB);
    memcpy(&b1, B + k * LT_NR + LT_W, LT_VB);
    #pragma GCC unroll 16
    for (int r = 0; r < RR; ++r) {
      const T a = A[k * LT_R + r];
      acc[r][0] += a * b0;
      acc[r][1] += a * b1;
    }
  }
  #pragma GCC unroll 16
  for (int r = 0; r < RR; ++r) {
    memcpy(G + r * TJ, &acc[r][0], LT_VB);
    memcpy(G + r * TJ + LT_W, &acc[r][1], LT_VB);
  }
}
"""


def dot_kernel(D: int) -> str:
    """G[r*TJ + jj] = Σ_k A_r[k] B_jj[k] for the ``nr`` rows of a block and a tile."""
    return f"""
// Dot products of the nr rows of a block (A, packed k-major) with a tile of nj columns (B,
// panels of LT_NR columns packed k-major, zero-padded): whole panels are computed (G holds
// TJ columns). A partial block goes by 4 rows and then single rows, not by LT_R. Not
// inlined: one call computes LT_R x TJ x {D} products, and compiling lt_rows with the
// micro-kernels inside takes longer.
static __attribute__((noinline)) void lt_dot{D}(const T* __restrict__ A, const T* __restrict__ B,
                                               int nr, int nj, T* __restrict__ G) {{
  for (int p = 0; p < nj; p += LT_NR) {{
    const T* Bp = B + p * {D};
    if (nr == LT_R) {{ lt_mk<LT_R, {D}>(A, Bp, G + p); continue; }}
    int r = 0;
    for (; r + 4 <= nr; r += 4) lt_mk<4, {D}>(A + r, Bp, G + r * TJ + p);
    for (; r < nr; ++r) lt_mk<1, {D}>(A + r, Bp, G + r * TJ + p);
  }}
}}
"""


def sqdist_fix(D: int) -> str:
    """d = max(|a|² + |b|² - 2 G, 0) in place, and the near-duplicates recomputed directly."""
    return f"""
// |A_r - B_j|² from the dot products G, as (min(|A_r|², |B_j|²) - 2 G) + max(...): the
// first rounding at the ulp of |B_j|² - 2 G, about half that of |A_r|² + |B_j|² (that one
// made near ties of softmax gradients 18x dense float32's error at D = 64), and the same
// value with the roles of A and B swapped (a backward's f must be its forward's); where it is below (|A_r|² + |B_j|²) / 16 the subtraction has cancelled most digits, so
// those pairs are recomputed directly (A and B packed as for lt_dot{D}).
static LT_INLINE void lt_sqdist{D}(const T* __restrict__ A, const T* __restrict__ nA,
                                  const T* __restrict__ B, const T* __restrict__ nB,
                                  int nr, int nj, T* __restrict__ G) {{
  for (int r = 0; r < nr; ++r) {{
    T* g = G + r * TJ;
    const T na = nA[r];
    int near = 0;
    _Pragma("omp simd reduction(|:near)")
    for (int jj = 0; jj < nj; ++jj) {{
      const T nb = nB[jj], s = na + nb;
      const T lo = na < nb ? na : nb, hi = na < nb ? nb : na;
      T d = (lo - 2 * g[jj]) + hi;
      d = d < 0 ? 0 : d;  // NaN stays
      near |= d < s * (T)0.0625;
      g[jj] = d;
    }}
    if (!near) continue;
    for (int jj = 0; jj < nj; ++jj) {{
      if (!(g[jj] < (na + nB[jj]) * (T)0.0625)) continue;
      const T* b = B + jj / LT_NR * (LT_NR * {D}) + jj % LT_NR;
      T e = 0;
      for (int k = 0; k < {D}; ++k) {{ const T t = A[k * LT_R + r] - b[k * LT_NR]; e += t * t; }}
      g[jj] = e;
    }}
  }}
}}
"""
