"""The CPU kernel skeleton ``lt_run`` around the shared formula and ``Acc`` (render_c.py).

The formula is first planned (:mod:`lazytensor.codegen.cpu_plan`): values that depend on i only
become per-row values, costly values of one j-variable become columns, large dot
products become small matrix products. Then:

- *work items* (batch b, block of rows, chunk of j for split-j) go to OpenMP threads,
  dynamically; one thread, or a small problem, runs them without OpenMP;
- *a work item* walks its j-range in chunks of ``JCH`` columns that stay in L2. It first
  stages the chunk: the j-variables of dimension > 1 and the columns, one component
  after the other (``S[k * JCH + j]``, zero-padded to whole tiles), in a per-thread
  buffer -- a GPU's shared-memory tile, here so that the pair loop reads every
  component with unit stride. There is no O(M) set-up pass and no O(M) buffer, so one
  query against 10^7 points is split over threads from its first byte. Then, for each
  block of ``LT_R`` rows (1 without dot products): the row values and, per tile of
  ``TJ`` columns, the dot products and, for each row, a vectorizable loop over the tile
  that evaluates the formula into ``fb``, handed to ``Acc::tile``. Accumulators stay per
  row across tiles and chunks, so every row sees its j in increasing order;
- *dot products* are a small GEMM, BLIS-style: the j-operand of a chunk is packed in
  panels of ``LT_NR`` = 2 vectors of columns, each panel k-major (transposed in
  registers, ``lt_pack``); the item's rows are packed once, in blocks of ``LT_R`` rows,
  k-major, with their norms; a micro-kernel (``lt_mk``) keeps LT_R x 2 vector
  accumulators in registers and per k broadcasts LT_R row values against 2 vectors of
  the panel. LT_R = 12 with AVX-512 (32 vector registers), 6 otherwise (16), chosen at
  compile time. The panel streams from L2, the row block stays in L1;
- split-j partial accumulators are merged with ``Acc::merge``.

The kernel runs with denormals flushed to zero (``LtFtz``, as CUDA's fast math does):
an underflowing exp would otherwise cost a hundred cycles per pair.

Calling convention: ``lt_run(args)``, one array of 64-bit words (one ctypes argument is
the cheapest call): ``N, M, nbd, nthreads, jchunk, &bshape, &vbs, &vnb``, then the data
pointer of each variable (contiguous ``(batch..., rows, dim)``), then of each output
(contiguous ``(B, N, dim_o)``). ``vbs[v * nbd + k]`` is variable v's stride *in (rows,
dim) blocks* along batch dimension k (0 where broadcast), ``vnb[v]`` its number of
blocks; ``jchunk`` > 0 splits j into chunks (rounded up to the tile length). Returns 0,
or 1 when a work buffer could not be allocated.
"""

from __future__ import annotations

from . import ir, reductions
from .cpu_plan import CpuPlan, plan_cpu
from .render_c import (
    VarSpec,
    _prelude,
    cpu_renames,
    render_formula,
    render_function,
    render_shared,
    tile_size,
)
from .render_wide import wide_acc_code, wide_call, wide_softmax_acc_code, wide_sum

L2_CHUNK_BYTES = 262144  # staged j-data of one chunk, reused by every row block of an item
# With dot products every micro-kernel call streams its panel from the chunk, so the chunk
# must stay in L2 next to the row block: half of the smallest common L2 (256 KB). The same
# speed as 256 KB where L2 is 2 MB (measured, D = 256).
DOT_CHUNK_BYTES = 131072
MAX_ROWS_PER_ITEM = 256  # rows of a work item (fewer when N is small or Acc is large)
WIDE = 16  # formulas on wider vectors vectorize along the vector, not along j


def _vector_header() -> str:
    return """
#if defined(__AVX512F__)
#define LT_VB 64
#elif defined(__AVX__)
#define LT_VB 32
#else
#define LT_VB 16
#endif
typedef T lt_vec __attribute__((vector_size(LT_VB)));
// Dot products: blocks of LT_R rows x panels of LT_NR = 2 vectors of columns, so that the
// LT_R x 2 accumulators, the 2 vectors of B and a broadcast fill the registers (32 with
// AVX-512, 16 below). LT_R is also the row block of kernels with dot products.
#if LT_VB == 64
#define LT_R 12
#else
#define LT_R 6
#endif
enum { LT_W = LT_VB / (int)sizeof(T), LT_NR = 2 * LT_W };
#if defined(__x86_64__) || defined(__i386__)
// Denormals flushed to zero, and read as zero, while a kernel runs (restored after).
struct LtFtz {
  unsigned csr;
  LtFtz() : csr(__builtin_ia32_stmxcsr()) { __builtin_ia32_ldmxcsr(csr | 0x8040); }
  ~LtFtz() { __builtin_ia32_ldmxcsr(csr); }
};
#else
struct LtFtz {};
#endif
// The staging buffer of the calling thread, kept (and grown) across calls.
struct LtStage {
  T* p = 0;
  size_t n = 0;
  ~LtStage() { free(p); }
  T* get(size_t len) {
    if (len > n) {
      free(p);
      void* q = 0;
      p = posix_memalign(&q, 64, sizeof(T) * len) == 0 ? (T*)q : 0;
      n = p ? len : 0;
    }
    return p;
  }
};
static thread_local LtStage lt_stage;
"""


def _dot_micro() -> str:
    """The micro-kernel of the dot products and the packing of their j-operands, shared by
    every dimension."""
    return """
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

// Columns [0, nc) of P (row-major, KD components each) into panels of LT_NR columns, each
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
// G[r*TJ + jj] = sum_k A[k*LT_R + r] B[k*LT_NR + jj] for RR rows and one panel of LT_NR
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


def _dot_kernel(D: int) -> str:
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


def _sqdist_fix(D: int) -> str:
    """d = max(|a|² + |b|² - 2 G, 0) in place, and the near-duplicates recomputed directly."""
    return f"""
// |A_r - B_j|² from the dot products G; where it is below (|A_r|² + |B_j|²) / 16 the
// subtraction has cancelled most digits, so those pairs are recomputed directly (A and B
// packed as for lt_dot{D}).
static LT_INLINE void lt_sqdist{D}(const T* __restrict__ A, const T* __restrict__ nA,
                                  const T* __restrict__ B, const T* __restrict__ nB,
                                  int nr, int nj, T* __restrict__ G) {{
  for (int r = 0; r < nr; ++r) {{
    T* g = G + r * TJ;
    const T na = nA[r];
    int near = 0;
    _Pragma("omp simd reduction(|:near)")
    for (int jj = 0; jj < nj; ++jj) {{
      const T s = na + nB[jj];
      T d = s - 2 * g[jj];
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


def _offsets(specs: list, start: int) -> tuple:
    """({index: first component}, end) of variables laid out one after the other."""
    offsets = {}
    for v in specs:
        offsets[v.index] = start
        start += v.dim
    return offsets, start


class _Layout:
    """Which values are staged per chunk and how each variable is addressed."""

    def __init__(self, var_specs: list, plan: CpuPlan, jch: int | None = None):
        self.orig = sorted(var_specs, key=lambda v: v.index)
        self.n_orig = max([v.index + 1 for v in self.orig] + [0])
        self.rows = [VarSpec(d.var.index, d.var.dim, "i") for d in plan.rows]
        self.cols = [VarSpec(d.var.index, d.var.dim, "j") for d in plan.cols]
        self.col_source = {d.var.index: d.source for d in plan.cols}
        self.dots = list(plan.dots)
        self.dot_index = {d.var.index for d in plan.dots}
        used = {v.index for v in ir.variables(plan.formula)}
        used |= {d.norm_b for d in plan.dots}
        dot_b = {d.b for d in plan.dots}
        # wide: the pair loop is vectorized along the vector dimension (see _row_block)
        self.wide = plan.formula.dim > WIDE or any(
            v.dim > WIDE for v in self.orig if v.index in used)
        # staged: j-variables read component-wise by the pair loop (unless wide), and the
        # columns it reads (S[k * JCH + j])
        self.staged = [v for v in self.orig if v.cat == "j" and v.dim > 1
                       and v.index in used and not self.wide]
        self.staged += [v for v in self.cols if v.index in used]
        self.stage_offset, self.stage_dims = _offsets(self.staged, 0)
        # packed: the j-side operands of dot products, in panels of LT_NR columns, each
        # panel k-major (see lt_dot), after the staged values in the same buffer
        self.packed = [v for v in self.orig + self.cols if v.index in dot_b]
        self.pack_offset, self.buffer_dims = _offsets(self.packed, self.stage_dims)
        self.formula_specs = self.orig + self.rows + self.cols + [
            VarSpec(d.var.index, 1, "j") for d in plan.dots]
        self.row_offset, self.n_row_values = _offsets(self.rows, 0)
        self.row_of_node = {d.node: d.var.index for d in plan.rows}

    def j_bytes(self, size: int) -> int:
        """Bytes of j-data per column: staged, plus the dimension-1 j-variables read in place."""
        raw = sum(v.dim for v in self.orig if v.cat == "j" and v.index not in self.stage_offset
                  and v.index not in self.pack_offset)
        return max(1, (self.buffer_dims + raw) * size)


def _stage(L: _Layout) -> str:
    """Copies (and columns) of the chunk [c0, c1) into S, zero-padded to ncp columns:
    staged ones at ``S[(off + k) * JCH + j]``, packed ones in panels of LT_NR columns
    (variables by ``lt_pack``, columns as they are computed).

    The columns |B_j|² of the sqdist products are summed from B's packed panels, across a
    panel's columns at once (the same sums, in the same order, as lt_col's, but vectorized
    along j instead of a chain of dependent additions per column)."""
    dims = {v.index: v.dim for v in L.orig}
    norms = {d.norm_b: d for d in L.dots if d.kind == "sqdist"}
    out = []
    for v in L.staged + [v for v in L.packed if v.index not in L.stage_offset]:
        k, d = v.index, v.dim
        if k in norms:
            continue
        if k in L.col_source:
            s = L.col_source[k]
            body = [f"T o[{d}]; lt_col{k}(P{s} + (c0 + jj) * {dims[s]}, o);"]
            src = "o"
        else:
            body = [f"const T* src = P{k} + (c0 + jj) * {d};"]
            src = "src"
        writes, pads = [], []
        if k in L.stage_offset:
            writes.append(f"T* Y = S + {L.stage_offset[k]} * JCH + jj; "
                          f"for (int q = 0; q < {d}; ++q) Y[q * JCH] = {src}[q];")
            pads.append(f"{{ T* Y = S + {L.stage_offset[k]} * JCH; for (int q = 0; q < {d}; ++q) "
                        f"for (int64_t jj = nc; jj < ncp; ++jj) Y[q * JCH + jj] = 0; }}")
        if k in L.pack_offset and k in L.col_source:
            writes.append(f"T* Z = S + {L.pack_offset[k]} * JCH + jj / LT_NR * (LT_NR * {d}) "
                          f"+ jj % LT_NR; for (int q = 0; q < {d}; ++q) Z[q * LT_NR] = o[q];")
            pads.append(f"for (int64_t jj = nc; jj < ncp; ++jj) {{ T* Z = S + {L.pack_offset[k]} "
                        f"* JCH + jj / LT_NR * (LT_NR * {d}) + jj % LT_NR; "
                        f"for (int q = 0; q < {d}; ++q) Z[q * LT_NR] = 0; }}")
        elif k in L.pack_offset:
            pads.append(f"lt_pack<{d}>(P{k} + c0 * {d}, nc, ncp, S + {L.pack_offset[k]} * JCH);")
        if writes:
            out.append(f"    for (int64_t jj = 0; jj < nc; ++jj) {{ {' '.join(body + writes)} }}")
        out.extend(f"    {p}" for p in pads)
    for k, dot in norms.items():
        D = dot.dim
        out.append(f"""    for (int64_t p = 0; p < ncp; p += LT_NR) {{
      const T* z = S + {L.pack_offset[dot.b]} * JCH + p * {D};
      T s[LT_NR] = {{}};
      for (int k = 0; k < {D}; ++k)
        for (int q = 0; q < LT_NR; ++q) s[q] += z[k * LT_NR + q] * z[k * LT_NR + q];
      for (int q = 0; q < LT_NR; ++q) S[{L.stage_offset[k]} * JCH + p + q] = s[q];
    }}""")
    return "\n".join(out)


def _row_block(L: _Layout, F: int, R: int, after_tile: str = "") -> str:
    """``lt_rows``: rows [i0, i1) against columns [jb, je) into ``accs`` (``after_tile``:
    a statement run after each ``Acc::tile``, see :mod:`lazytensor.codegen.render_wide`)."""
    ptr_args = ", ".join(f"const T* __restrict__ P{v.index}" for v in L.orig)
    decl = [f"  alignas(64) T fb[{F} * TJ];"]
    nrv = L.n_row_values
    # The work buffer: the chunk's staged and packed j-data; with dot products, also the
    # item's rows, packed once (not once per chunk) in blocks of R, their norms and their
    # row values, which could be too large for the stack.
    extra = []
    for d in L.dots:
        extra.append(f"ni * {d.dim}" + (" + ni" if d.kind == "sqdist" else ""))
    if L.dots and nrv:
        extra.append(f"ni * {nrv}")
    if L.dots:
        decl.append(f"  const int64_t ni = (i1 - i0 + {R} - 1) / {R} * {R};")
    if L.buffer_dims or extra:
        size = " + ".join([f"(size_t){L.buffer_dims} * JCH"] + extra)
        decl.append(f"  T* const S = lt_stage.get({size});")
        decl.append("  if (!S) return 1;")
    at = f"S + (size_t){L.buffer_dims} * JCH"
    pack, block_ptrs = [], []
    for n, d in enumerate(L.dots):
        decl.append(f"  T* const A{n} = {at};")
        at = f"A{n} + ni * {d.dim}"
        if d.kind == "sqdist":
            decl.append(f"  T* const nA{n} = {at};")
            at = f"nA{n} + ni"
        decl.append(f"  alignas(64) T G{n}[{R} * TJ];")
        block_ptrs.append(f"      const T* const Ab{n} = A{n} + (ig - i0) * {d.dim};")
        if d.kind == "sqdist":
            block_ptrs.append(f"      const T* const nAb{n} = nA{n} + (ig - i0);")
        if d.a.op == "var":
            src = f"P{d.a.index} + (ig + r) * {d.a.dim}"
        else:
            src = f"Hb[r] + {L.row_offset[L.row_of_node[d.a]]}"
        norm = ""
        if d.kind == "sqdist":
            # summed across the block's rows at once, each row in the order of k
            norm = f"""
        T s[{R}] = {{}};
        for (int k = 0; k < {d.dim}; ++k)
          for (int r = 0; r < {R}; ++r) s[r] += Ab[k * {R} + r] * Ab[k * {R} + r];
        for (int r = 0; r < nr; ++r) nA{n}[ig - i0 + r] = s[r];"""
        pack.append(f"""      {{ T* const Ab = A{n} + (ig - i0) * {d.dim};
        for (int r = 0; r < {R}; ++r) {{
          if (r < nr) {{ const T* a = {src}; for (int k = 0; k < {d.dim}; ++k) Ab[k * {R} + r] = a[k]; }}
          else for (int k = 0; k < {d.dim}; ++k) Ab[k * {R} + r] = 0;
        }}{norm}
      }}""")
    if nrv:
        if L.dots:
            decl.append(f"  T (* const H)[{nrv}] = (T (*)[{nrv}])({at});")
        else:
            decl.append(f"  T H[{R}][{nrv}];")
        # the rows of block ig: all the item's rows are kept with dot products
        block_ptrs.insert(0, f"      T (* const Hb)[{nrv}] = H{' + (ig - i0)' if L.dots else ''};")
    row_in = [v for v in L.orig if v.cat in ("i", "p")]
    row_args = ", ".join(
        [f"P{v.index} + (ig + r) * {v.dim}" if v.cat == "i" else f"P{v.index}" for v in row_in]
        + ["Hb[r]"])
    rowvals = f"      for (int r = 0; r < nr; ++r) lt_rowvals({row_args});" if nrv else ""
    nl = "\n"
    prep = nl.join([p for p in [rowvals] + pack if p])
    if L.dots:  # once per item, before the chunks
        prep_item = f"""  for (int64_t ig = i0; ig < i1; ig += {R}) {{
      const int nr = (int)((i1 - ig) < {R} ? (i1 - ig) : {R});
{block_ptrs[0] if nrv else ""}
{prep}
  }}"""
        prep_block = ""
    else:
        prep_item, prep_block = "", prep
    dots = []
    for n, d in enumerate(L.dots):
        b = f"S + {L.pack_offset[d.b]} * JCH + t0 * {d.dim}"
        dots.append(f"        lt_dot{d.dim}(Ab{n}, {b}, nr, nj, G{n});")
        if d.kind == "sqdist":
            nb = f"S + {L.stage_offset[d.norm_b]} * JCH + t0"
            dots.append(f"        lt_sqdist{d.dim}(Ab{n}, nAb{n}, {b}, {nb}, nr, nj, G{n});")
    row_ptrs, jloads, call = [], [], []
    for v in L.formula_specs:
        k = v.index
        if k in L.dot_index:
            n = next(q for q, d in enumerate(L.dots) if d.var.index == k)
            row_ptrs.append(f"          const T* g{k} = G{n} + r * TJ;")
            jloads.append(f"            const T y{k}[1] = {{g{k}[jj]}};")
            call.append(f"y{k}")
        elif k in L.row_offset:
            row_ptrs.append(f"          const T* v{k} = Hb[r] + {L.row_offset[k]};")
            call.append(f"v{k}")
        elif v.cat == "i":
            row_ptrs.append(f"          const T* v{k} = P{k} + i * {v.dim};")
            call.append(f"v{k}")
        elif v.cat == "p":
            call.append(f"P{k}")
        elif k in L.stage_offset and (k in L.col_source or not L.wide):
            row_ptrs.append(f"          const T* Y{k} = S + {L.stage_offset[k]} * JCH + t0;")
            jloads.append(f"            T y{k}[{v.dim}]; for (int c = 0; c < {v.dim}; ++c) "
                          f"y{k}[c] = Y{k}[c * JCH + jj];")
            call.append(f"y{k}")
        elif k in L.col_source:  # a dot product's operand only: the formula does not read it
            jloads.append(f"            const T* y{k} = 0;")
            call.append(f"y{k}")
        else:  # a j-variable of dimension 1 (or one the formula does not read): in place
            jloads.append(f"            const T* y{k} = P{k} + (j0 + jj) * {v.dim};")
            call.append(f"y{k}")
    if L.wide:
        # Vectors wider than WIDE: one pair at a time, each op of the formula a loop that
        # vectorizes along the vector, and the reduction's push (also a vector loop).
        pair_loop = f"""          for (int jj = 0; jj < nj; ++jj) {{
{nl.join(jloads)}
            T o[{F}];
            lt_formula({", ".join(call)}, o);
            accs[i - i0].push(o, j0 + jj);
          }}"""
    else:
        pair_loop = f"""          // GCC ivdep, not omp simd: omp simd privatizes the local arrays before inlining
          // and then fails to vectorize; with ivdep they are scalarized and it vectorizes.
          #pragma GCC ivdep
          for (int jj = 0; jj < nj; ++jj) {{
{nl.join(jloads)}
            T o[{F}];
            lt_formula({", ".join(call)}, o);
            for (int k = 0; k < {F}; ++k) fb[k * TJ + jj] = o[k];
          }}
          accs[i - i0].tile(fb, nj, j0);{after_tile}"""
    return f"""
// Rows [i0, i1) against columns [jb, je), chunk by chunk. Returns 1 when out of memory.
static int lt_rows({ptr_args}, int64_t i0, int64_t i1, int64_t jb, int64_t je, Acc* accs) {{
{nl.join(decl)}
  for (int64_t i = i0; i < i1; ++i) accs[i - i0].init();
{prep_item}
  for (int64_t c0 = jb; c0 < je; c0 += JCH) {{
    const int64_t c1 = (c0 + JCH < je) ? c0 + JCH : je, nc = c1 - c0;
    const int64_t ncp = (nc + TJ - 1) / TJ * TJ;
    (void)ncp;
{_stage(L)}
    for (int64_t ig = i0; ig < i1; ig += {R}) {{
      const int nr = (int)((i1 - ig) < {R} ? (i1 - ig) : {R});
{nl.join(block_ptrs)}
{prep_block}
      for (int64_t j0 = c0; j0 < c1; j0 += TJ) {{
        const int nj = (int)((c1 - j0) < TJ ? (c1 - j0) : TJ);
        const int64_t t0 = j0 - c0;
        (void)t0;
{nl.join(dots)}
        for (int r = 0; r < nr; ++r) {{
          const int64_t i = ig + r;
{nl.join(row_ptrs)}
{pair_loop}
        }}
      }}
    }}
  }}
  return 0;
}}
"""


def _item_pointers(L: _Layout) -> str:
    out = []
    for v in L.orig:
        k, d = v.index, v.dim
        rows = {"i": "c.N", "j": "c.M", "p": "1"}[v.cat]
        out.append(f"c.base[{k}] + blk[{k}] * {rows} * {d}")
    return ", ".join(out)


def render_cpu_kernel(formula, var_specs, reduction: str, opts: dict, dtype: str,
                      dot_tiling: bool | None = None) -> str:
    """Complete C++ source of the CPU kernel ``lt_run`` (see the module docstring).

    A Sum of wide terms that are weights times j-variables runs its narrow part in the
    pair loop and the rest as weighted sums of the j-vectors (:mod:`lazytensor.codegen.render_wide`)."""
    lin = wide_sum(formula, reduction)
    if lin is not None:
        src = _render(lin.narrow, var_specs, reduction, opts, dtype, dot_tiling, lin)
        if src is not None:
            return src
    return _render(formula, var_specs, reduction, opts, dtype, dot_tiling)


def _render(formula, var_specs, reduction, opts, dtype, dot_tiling, lin=None) -> str | None:
    F = formula.dim
    plan = plan_cpu(formula, max([v.index + 1 for v in var_specs] + [0]), dot_tiling)
    L = _Layout(var_specs, plan)
    if lin is not None and L.wide:
        return None  # the narrow part still reads a wide vector pair by pair
    size = 4 if dtype == "float32" else 8
    R = "LT_R" if L.dots else "1"  # rows per block: LT_R depends on the vector width
    tj = max(tile_size(F, dtype), 64) if L.dots else tile_size(F, dtype)
    chunk = DOT_CHUNK_BYTES if L.dots else L2_CHUNK_BYTES
    jch = max(tj, chunk // L.j_bytes(size) // tj * tj)
    nv = max(1, L.n_orig)
    if lin is None:
        src = [render_shared(plan.formula, L.formula_specs, reduction, opts, dtype, tj=tj,
                             rename=cpu_renames)]
    else:  # the narrow formula, and the weighted sums' Acc (after the vector types)
        acc_dtype = reductions.get(reduction).acc_dtype(dtype, opts)
        src = [_prelude(dtype, acc_dtype) + f"static const int TJ = {tj};\n"
               + render_formula(plan.formula, L.formula_specs, dtype, cpu_renames)]
    src.append("#ifdef _OPENMP\n#include <omp.h>\n#endif\n")
    src.append(_vector_header())
    if lin is not None:
        red = reductions.get(reduction)
        src.append(wide_acc_code(lin, opts) if red.wide == "sum"
                   else wide_softmax_acc_code(lin, red))
    src.append(f"static const int64_t JCH = {jch};  // columns per staged chunk\n")
    if L.n_row_values:
        row_in = [v for v in L.orig if v.cat in ("i", "p")]
        src.append(render_function("lt_rowvals", [d.node for d in plan.rows], row_in, dtype,
                                   cpu_renames, "static LT_INLINE"))
    for d in plan.cols:
        s = next(v for v in L.orig if v.index == d.source)
        src.append(render_function(f"lt_col{d.var.index}", [d.node], [s], dtype, cpu_renames,
                                   "static LT_INLINE"))
    if L.dots:
        src.append(_dot_micro())
    for D in sorted({d.dim for d in L.dots}):
        src.append(_dot_kernel(D))
    for D in sorted({d.dim for d in L.dots if d.kind == "sqdist"}):
        src.append(_sqdist_fix(D))
    src.append(_row_block(L, F, R, "" if lin is None else "\n          " + wide_call(lin)))
    # With dot products each work item packs all its columns once: below 4 row blocks
    # per item that packing costs more than a third of the products, so fewer, larger
    # items are worth some imbalance between threads.
    min_ib = ("\n  if (IB < 4 * LT_R) IB = 4 * LT_R;  // packing the columns: see the renderer"
              if L.dots else "")
    src.append(f"""
// Rows per work item: a multiple of {R}, the per-row accumulators within 64 KB of stack.
enum {{ LT_MAX_IB = (sizeof(Acc) * {MAX_ROWS_PER_ITEM} <= 65536) ? {MAX_ROWS_PER_ITEM} / {R} * {R}
        : (65536 / sizeof(Acc) >= {R} ? (int)(65536 / sizeof(Acc)) / {R} * {R} : {R}) }};

struct LtCtx {{
  const T* base[{nv}];
  int64_t N, M, IB, nIB, JC, nJC;
  int nbd;
  const int64_t* bshape;
  const int64_t* vbs;
  void* const* outs;
  Acc* part;
}};

static int lt_item(const LtCtx& c, int64_t w) {{
  const int64_t jc = w % c.nJC, rest = w / c.nJC, ib = rest % c.nIB, b = rest / c.nIB;
  int64_t blk[{nv}];
  for (int v = 0; v < {nv}; ++v) blk[v] = 0;
  for (int64_t k = c.nbd - 1, q = b; k >= 0; --k) {{
    const int64_t idx = q % c.bshape[k]; q /= c.bshape[k];
    for (int v = 0; v < {L.n_orig}; ++v) blk[v] += idx * c.vbs[v * c.nbd + k];
  }}
  const int64_t i0 = ib * c.IB, i1 = (i0 + c.IB < c.N) ? i0 + c.IB : c.N;
  const int64_t jb = jc * c.JC, je = (jb + c.JC < c.M) ? jb + c.JC : c.M;
  Acc accs[LT_MAX_IB];
  if (lt_rows({_item_pointers(L)}, i0, i1, jb, je, accs)) return 1;
  for (int64_t i = i0; i < i1; ++i) {{
    if (c.nJC == 1) accs[i - i0].write(c.outs, b * c.N + i);
    else c.part[(b * c.N + i) * c.nJC + jc] = accs[i - i0];
  }}
  return 0;
}}

static_assert(sizeof(void*) == sizeof(int64_t), "64-bit pointers");
extern "C" int lt_run(const int64_t* args) {{
  const int64_t N = args[0], M = args[1], jchunk = args[4];
  const int nbd = (int)args[2];
  int nthreads = (int)args[3];
  const int64_t* bshape = (const int64_t*)(intptr_t)args[5];
  const int64_t* vbs = (const int64_t*)(intptr_t)args[6];
  const void* const* vars = (const void* const*)(args + 8);
  void* const* outs = (void* const*)(args + 8 + {L.n_orig});
  LtCtx c;
  for (int v = 0; v < {nv}; ++v) c.base[v] = v < {L.n_orig} ? (const T*)vars[v] : 0;
  if (nthreads < 1) nthreads = 1;
  int64_t B = 1;
  for (int k = 0; k < nbd; ++k) B *= bshape[k];
  c.N = N; c.M = M; c.nbd = nbd; c.bshape = bshape; c.vbs = vbs; c.outs = outs; c.part = 0;
  int64_t IB = N / (8 * nthreads) + 1;{min_ib}
  if (IB > LT_MAX_IB) IB = LT_MAX_IB;
  IB = (IB + {R} - 1) / {R} * {R};
  c.IB = IB;
  c.nIB = (N + IB - 1) / IB;
  const int64_t JC = (jchunk > 0 && jchunk < M) ? (jchunk + TJ - 1) / TJ * TJ : (M > 0 ? M : 1);
  c.JC = JC;
  c.nJC = (M + JC - 1) / JC > 0 ? (M + JC - 1) / JC : 1;
  const int64_t nrows = B * N;
  if (c.nJC > 1) {{
    c.part = (Acc*)malloc(sizeof(Acc) * (size_t)(nrows * c.nJC));
    if (!c.part) return 1;
  }}
  const int64_t W = B * c.nIB * c.nJC;
  int status = 0;
  if (nthreads > 1 && W > 1) {{
    #pragma omp parallel num_threads(nthreads < W ? nthreads : (int)W) reduction(|:status)
    {{
      LtFtz ftz;
      #pragma omp for schedule(dynamic, 1)
      for (int64_t w = 0; w < W; ++w) status |= lt_item(c, w);
    }}
  }} else {{
    LtFtz ftz;
    for (int64_t w = 0; w < W; ++w) status |= lt_item(c, w);
  }}
  if (c.nJC > 1 && !status) {{
    #pragma omp parallel num_threads(nthreads) if (nthreads > 1 && nrows > 64)
    {{
      LtFtz ftz;
      #pragma omp for
      for (int64_t r = 0; r < nrows; ++r) {{
        Acc a = c.part[r * c.nJC];
        for (int64_t q = 1; q < c.nJC; ++q) a.merge(c.part[r * c.nJC + q]);
        a.write(outs, r);
      }}
    }}
  }}
  free(c.part);
  return status;
}}
""")
    return "".join(src)
