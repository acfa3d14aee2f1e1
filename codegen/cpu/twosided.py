"""One CPU kernel for both sides of a gradient: the i-side and j-side sums from the same tiles.

The backward of a reduction over j whose inputs on both sides need a gradient runs two
Sums: ``Σ_j G_i(i, j)`` (the i-variables' and parameters' cotangents) and ``Σ_i G_j(i, j)``
(the j-variables'). When both are sums of wide terms the wide plan handles
(:func:`lazytensor.codegen.linearize.wide_sum`: weights times vectors of the other side)
and share their costly part (a Gaussian's distances and exponential), one pass computes
both: the pair loop evaluates the narrow formulas of the two sides together (the
distances by the small matrix product of :mod:`lazytensor.codegen.cpu.gemm`, once), then
per row block and tile

- the i-side weighted sums ``Σ_j s_ij B_j`` into the rows' accumulators, as the one-sided
  kernel does (:mod:`lazytensor.codegen.cpu.wide`, ``lt_wblock``);
- the j-side weighted sums ``Σ_i t_ij X_i`` (the block's rows against each column of the
  tile, ``lt_jside``): 6 columns share each vector of a row's X, 6 x 4 vector
  accumulators in registers, added into the thread's partial sums of the chunk.

Outer loop: spans of columns (all M when the partial sums below fit in ``SPAN_BYTES`` per
thread, 8 MB: 32,000 columns of a D = 64 gradient in float32); within a span the threads
share the row blocks (each walking the span by L2-sized chunks of ``JCH`` columns as the
one-sided kernel does), each thread adding its j-side sums into its own span-sized buffer;
after the span the buffers are summed into the j-side output (and cleared). Memory:
O(threads × min(M, SPAN) × F_j) for the j-side partial sums and O(N × F_i) for the i-side
accumulators (kept across spans); no N×M buffer, no atomics, and one barrier per span
(on a loaded machine a barrier per L2 chunk cost more than the distances it saved). The
j-side sums are plain float sums of the row blocks' sums (no Kahan scheme, whatever the
i-side's scheme).

The kernel's formula is ``concat(G_i, G_j')`` with ``G_j'`` the j-side formula written with
i and j exchanged back (:func:`two_sided_formula`): variables numbered once for both.
Calling convention: the one-sided kernel's (:mod:`lazytensor.codegen.cpu.entry`), without
block-sparse ranges, ``jchunk`` > 0 bounding the span (a few rows against many columns:
more spans), two outputs: ``(B, N, F_i)`` and
``(B, M, F_j)``.

>>> from lazytensor.codegen import ir, ops
>>> from lazytensor.codegen.render_c import VarSpec
>>> x, y, g = ir.var(0, 64, "i"), ir.var(1, 64, "j"), ir.var(2, 1, "i")
>>> k = ops.apply("exp", ops.apply("neg", ops.apply("sum", ops.apply("square", ops.apply("sub", x, y)))))
>>> w = ops.apply("mul", g, k)
>>> f = two_sided_formula(ops.apply("mul", w, y), ops.apply("mul", w, x))
>>> specs = [VarSpec(0, 64, "i"), VarSpec(1, 64, "j"), VarSpec(2, 1, "i")]
>>> "lt_jside" in render_two_sided(f, specs, {}, "float32")
True
"""

from __future__ import annotations

import dataclasses

from .. import ir, ops
from ..linearize import Linear, column_source, wide_sum
from . import TUNING
from .kernel import DOT_CHUNK_BYTES, plan_shape, render_planned

# columns of a tile whose j-side sums share each vector of a row (wide.lt_wpass_block)
J_COLS = 6
# Staged j-data per chunk: 4x the one-sided kernel's (D = 64, float32, one thread, N = M =
# 4,000: chunks of 256 columns 75.5 ms, 512 73.3 ms, 1,024 72.4 ms; L2 is 1 MB there).
CHUNK_BYTES = 4 * DOT_CHUNK_BYTES
# rows per work item (their accumulators on the heap, not the stack)
ITEM_ROWS = 256
# Bytes of j-side partial sums per thread: the columns of a span (all M when they fit)
# are reduced by every thread before the threads sum their spans; one span per barrier
# (barriers cost most on a loaded machine: a descheduled thread holds up the others).
SPAN_BYTES = 8 << 20

def two_sided_formula(G_i: ir.Node, G_j_swapped: ir.Node) -> ir.Node:
    """The kernel's formula: the i-side Sum's formula ``G_i`` (a sum over j) and the j-side
    one ``G_j_swapped`` (a sum over i, its variables in the i-side's numbering and with
    their own categories: ``ir.swap_ij`` of the j-side call's formula)."""
    return ops.apply("concat", G_i, G_j_swapped)


def split_sides(formula: ir.Node) -> tuple:
    """(lin_i, lin_j, narrow, where): the two sides' weighted-sum forms (lin_j in the
    j-side's own orientation), the narrow formula the pair loop evaluates (lin_i's
    components, then those of lin_j's that differ from them) and where each of lin_j's
    components is in it; None when either side is not a wide sum."""
    if formula.op != "concat":
        return None
    G_i, G_jb = formula.args
    lin_i = wide_sum(G_i, "sum", TUNING)
    lin_j = wide_sum(ir.swap_ij(G_jb), "sum", TUNING)
    if lin_i is None or lin_j is None:
        return None
    comps = list(lin_i.components)
    where = []  # the pair loop's component of each of lin_j's (equal values computed once)
    for c in lin_j.components:
        c = ir.swap_ij(c)
        if c not in comps:
            comps.append(c)
        where.append(comps.index(c))
    narrow = comps[0]
    for c in comps[1:]:
        narrow = ops.apply("concat", narrow, c)
    return lin_i, lin_j, narrow, tuple(where)


def two_sided_shape(formula: ir.Node, var_specs: list, dtype: str):
    """(KernelShape, lin_j, where) of the two-sided kernel, or None when it does not apply: a
    side that is not a wide sum, or no dot products (the j-side sums need row blocks)."""
    parts = split_sides(formula)
    if parts is None:
        return None
    lin_i, lin_j, narrow, where = parts
    shape = plan_shape(narrow, var_specs, dtype, None, lin_i)
    if shape is None or not shape.layout.dots or narrow.dim > 16:
        return None
    size = 4 if dtype == "float32" else 8
    jch = max(shape.jch, CHUNK_BYTES // shape.layout.j_bytes(size) // shape.tj * shape.tj)
    return dataclasses.replace(shape, jch=jch), lin_j, where


def _coef(c: float) -> str:
    return "(T)1" if c == 1.0 else f"(T){float.hex(c)}"


def _jside(lin_j: Linear, F: int, where: tuple) -> tuple:
    """(definitions, statement) of the j-side sums of a row block and a tile: ``fb`` holds
    the pair loop's F components per row, lin_j's component q at ``where[q]``."""
    FJ = lin_j.dim
    xvars = sorted({column_source(t.factor)[0] for t in lin_j.col_terms})
    params = ", ".join(f"const T* __restrict__ X{k}" for k in xvars)
    body = []
    for t in lin_j.col_terms:
        k, start, ld = column_source(t.factor)
        w = f"fb + {where[t.weight]} * TJ"
        x = f"X{k} + {start}"
        body.append(f"""  {{
    const T* const w = {w};
    T* const o = out + {t.offset};
    int jj = 0;
    for (; jj + {J_COLS} <= nj; jj += {J_COLS})
      LtWsumBlock<{t.dim}, {ld}, 0, {J_COLS}, true>::run(w + jj, 1, fs, nr, {x}, {_coef(t.coef)}, o + (size_t)jj * {FJ}, {FJ});
    for (; jj < nj; ++jj)
      LtWsumBlock<{t.dim}, {ld}, 0, 1, true>::run(w + jj, 1, fs, nr, {x}, {_coef(t.coef)}, o + (size_t)jj * {FJ}, {FJ});
  }}""")
    for q, off in lin_j.direct:
        body.append(f"""  {{
    alignas(64) T a[TJ];
    const T* const w = fb + {where[q]} * TJ;
    for (int jj = 0; jj < nj; ++jj) a[jj] = w[jj];
    for (int r = 1; r < nr; ++r) {{
      _Pragma("omp simd") for (int jj = 0; jj < nj; ++jj) a[jj] += w[(size_t)r * fs + jj];
    }}
    for (int jj = 0; jj < nj; ++jj) out[(size_t)jj * {FJ} + {off}] += a[jj];
  }}""")
    nl = "\n"
    defs = f"""
// The j-side partial sums of the thread's current span of columns: column t0 + jj of the
// span at lt_jpart[(t0 + jj) * {FJ}], set by lt_run.
static thread_local T* lt_jpart;
// The j-side sums of a row block (nr rows, row r's weights at fb + r * fs) and a tile of nj
// columns from column t0 of the span; X_k: the block's first row of i-variable k.
static LT_INLINE void lt_jside(const T* __restrict__ fb, int fs, int nr, int nj, int64_t t0, {params}) {{
  T* const out = lt_jpart + (size_t)t0 * {FJ};
{nl.join(body)}
}}
"""
    ptrs = ", ".join(f"P{k} + ig * {column_source(next(t.factor for t in lin_j.col_terms if column_source(t.factor)[0] == k))[2]}"
                     for k in xvars)
    call = f"\n        lt_jside(fb, {F} * TJ, nr, nj, j0 - jb, {ptrs});"
    return defs, call


def _skeleton(shape, lin_j: Linear) -> str:
    """``lt_run`` of the two-sided kernel: its set-up, then the spans of columns."""
    L = shape.layout
    base = []
    for v in L.orig:
        rows = {"i": "N", "j": "M", "p": "1"}[v.cat]
        base.append(f"(const T*)vars[{v.index}] + blk[{v.index}] * {rows} * {v.dim}")
    return _setup(L, lin_j.dim) + _spans(L, lin_j.dim, base)


def _setup(L, FJ: int) -> str:
    """The start of ``lt_run``: its arguments, the row blocks, the span of columns, the
    buffers (each thread's j-side partial sums of a span, the rows' accumulators)."""
    return f"""
static_assert(sizeof(void*) == sizeof(int64_t), "64-bit pointers");
extern "C" int lt_run(const int64_t* args) {{
  const int64_t N = args[0], M = args[1];
  const int nbd = (int)args[2];
  int nt = (int)args[3];
  if (nt < 1) nt = 1;
  const int64_t* bshape = (const int64_t*)(intptr_t)args[5];
  const int64_t* vbs = (const int64_t*)(intptr_t)args[6];
  if (args[8] >= 0) return 1;  // block-sparse calls take the one-sided kernels
  const int* stop = (const int*)(intptr_t)args[11];
  const void* const* vars = (const void* const*)(args + LT_HEADER);
  void* const* outs = (void* const*)(args + LT_HEADER + {L.n_orig});
  T* const outj = (T*)outs[1];
  int64_t B = 1;
  for (int k = 0; k < nbd; ++k) B *= bshape[k];
  int64_t IB = N / (8 * nt) + 1;
  if (IB < 4 * LT_R) IB = 4 * LT_R;
  if (IB > {ITEM_ROWS}) IB = {ITEM_ROWS};
  IB = (IB + LT_R - 1) / LT_R * LT_R;
  const int64_t nIB = (N + IB - 1) / IB;
  // j-side partial sums: one span of SPAN columns per thread, cleared as they are summed
  int64_t SPAN = (int64_t)({SPAN_BYTES} / (sizeof(T) * {FJ})) / JCH * JCH;
  if (args[4] > 0 && args[4] < SPAN) SPAN = (args[4] + JCH - 1) / JCH * JCH;  // jchunk
  if (SPAN < JCH) SPAN = JCH;
  if (SPAN > M) SPAN = M;
  T* const parts = (T*)calloc((size_t)nt * (SPAN > 0 ? SPAN : 1) * {FJ}, sizeof(T));
  Acc* const accI = (Acc*)malloc(sizeof(Acc) * (size_t)(B * N > 0 ? B * N : 1));
  if (!parts || !accI) {{ free(parts); free(accI); return 1; }}
  const bool one_span = SPAN >= M;  // the rows' accumulators see all j in one lt_rows
  int status = 0;
"""


def _spans(L, FJ: int, base: list) -> str:
    """The parallel part of ``lt_run``: per batch element and span of columns, the row
    blocks shared by the threads (each adding its j-side sums into its own buffer), then
    the threads' buffers summed into the j-side output; the i-side outputs at the end."""
    nv = max(1, L.n_orig)
    return f"""  #pragma omp parallel num_threads(nt) if (nt > 1)
  {{
    LtFtz ftz;
    int tid = 0;
#ifdef _OPENMP
    tid = omp_get_thread_num();
#endif
    lt_jpart = parts + (size_t)tid * SPAN * {FJ};
    // an item's accumulators, merged into accI after each span (several spans only)
    Acc* const accs = one_span ? 0 : (Acc*)malloc(sizeof(Acc) * (size_t)IB);
    if (!one_span && !accs) __atomic_fetch_or(&status, 1, __ATOMIC_RELAXED);
    #pragma omp for
    for (int64_t r = 0; r < B * N; ++r) accI[r].init();
    for (int64_t b = 0; b < B; ++b) {{
      int64_t blk[{nv}];
      for (int v = 0; v < {nv}; ++v) blk[v] = 0;
      for (int64_t k = nbd - 1, q = b; k >= 0; --k) {{
        const int64_t idx = q % bshape[k]; q /= bshape[k];
        for (int v = 0; v < {L.n_orig}; ++v) blk[v] += idx * vbs[v * nbd + k];
      }}
      for (int64_t c0 = 0; c0 < M; c0 += SPAN) {{
        const int64_t c1 = (c0 + SPAN < M) ? c0 + SPAN : M;
        const int64_t iv[2] = {{c0, c1}};
        #pragma omp for schedule(dynamic, 1)
        for (int64_t ib = 0; ib < nIB; ++ib) {{
          if (__atomic_load_n(&status, __ATOMIC_RELAXED)) continue;
          const int64_t i0 = ib * IB, i1 = (i0 + IB < N) ? i0 + IB : N;
          Acc* const into = one_span ? accI + b * N + i0 : accs;
          const int st = lt_rows({", ".join(base)}, i0, i1, iv, 1, into, stop);
          if (st) {{ __atomic_fetch_or(&status, st, __ATOMIC_RELAXED); continue; }}
          if (!one_span)
            for (int64_t i = i0; i < i1; ++i) accI[b * N + i].merge(accs[i - i0]);
        }}
        #pragma omp for
        for (int64_t jj = 0; jj < c1 - c0; ++jj) {{
          T* const o = outj + (size_t)(b * M + c0 + jj) * {FJ};
          for (int q = 0; q < {FJ}; ++q) o[q] = 0;
          for (int t = 0; t < nt; ++t) {{
            T* const p = parts + (size_t)t * SPAN * {FJ} + (size_t)jj * {FJ};
            for (int q = 0; q < {FJ}; ++q) {{ o[q] += p[q]; p[q] = 0; }}
          }}
        }}
      }}
    }}
    #pragma omp for
    for (int64_t r = 0; r < B * N; ++r) accI[r].write(outs, r);
    free(accs);
  }}
  free(parts);
  free(accI);
  return status;
}}
"""


def render_two_sided(formula: ir.Node, var_specs: list, opts: dict, dtype: str) -> str:
    """Complete C++ source of the two-sided kernel ``lt_run`` (see the module docstring);
    ``opts``: the Sum's options (its summation scheme applies to the i-side)."""
    found = two_sided_shape(formula, var_specs, dtype)
    if found is None:
        raise ValueError("the two-sided kernel needs two wide sums with dot products")
    shape, lin_j, where = found
    jside = _jside(lin_j, shape.plan.formula.dim, where)
    return render_planned(shape, "sum", opts, jside=jside) + _skeleton(shape, lin_j)
