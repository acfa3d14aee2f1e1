"""The CPU kernel's entry ``lt_run`` and its work items, as named pieces of C++.

Calling convention: ``lt_run(args)``, one array of 64-bit words (one ctypes argument is
the cheapest call): ``N, M, nbd, nthreads, jchunk, &bshape, &vbs, &vnb, nblocks, &blocks,
&intervals, &stop`` (``HEADER_WORDS``), then the data pointer of each variable
(contiguous ``(batch..., rows, dim)``), then of each output (contiguous ``(B, N, dim_o)``).
``vbs[v * nbd + k]`` is variable v's stride *in (rows, dim) blocks* along batch dimension
k (0 where broadcast), ``vnb[v]`` its number of blocks; ``jchunk`` > 0 splits j into
chunks (rounded up to the tile length). ``nblocks`` >= 0 makes the call block-sparse:
``blocks`` holds ``(i0, i1, s0, s1)`` per block of rows, which together cover the rows
[0, N) once, and each block reduces over the intervals ``intervals[2s] <= j <
intervals[2s + 1]`` for s in [s0, s1), in that order, in every batch element (blocks
without intervals give the empty reduction); their pieces of at most a work item's rows
are the work items. ``nblocks`` = -1: the full product. ``stop`` points to an int that
another thread may set: the kernel then returns 2 within a chunk of work per thread,
with the outputs unfinished. Returns 0, or 1 when a work buffer could not be allocated.

Pieces: :data:`ACC_TMP` (the accumulators of an interval reduced apart),
:func:`work_items` (``LtCtx``, ``lt_item``: a work item's batch element, rows and
columns, its call of ``lt_rows`` and its outputs; ``lt_pieces``; ``lt_run``: the work
items on OpenMP threads, then the merge of split-j partial accumulators).
"""

from __future__ import annotations

from ..render_c import acc_call
from . import HEADER_WORDS
from .layout import Layout

MAX_ROWS_PER_ITEM = 256  # rows of a work item (fewer when N is small or Acc is large)

ACC_TMP = f"""
enum {{ LT_HEADER = {HEADER_WORDS} }};
// The accumulators of an interval reduced apart (see lt_rows): per thread, kept across calls.
struct LtAccTmp {{
  Acc* p = 0;
  int64_t n = 0;
  ~LtAccTmp() {{ free(p); }}
  Acc* get(int64_t len) {{
    if (len > n) {{
      free(p);
      p = (Acc*)malloc(sizeof(Acc) * (size_t)len);
      n = p ? len : 0;
    }}
    return p;
  }}
}};
static thread_local LtAccTmp lt_acc_tmp;
"""

# The blocks of a block-sparse call cut into work items.
_PIECES = """
// The blocks (i0, i1, s0, s1) of a block-sparse call, cut into pieces of at most IB rows
// (malloc'ed, 4 words each; *n of them); null when out of memory.
static int64_t* lt_pieces(const int64_t* blocks, int64_t nblocks, int64_t IB, int64_t* n) {
  int64_t count = 0;
  for (int64_t k = 0; k < nblocks; ++k)
    if (blocks[4 * k + 1] > blocks[4 * k]) count += (blocks[4 * k + 1] - blocks[4 * k] + IB - 1) / IB;
  int64_t* out = (int64_t*)malloc(sizeof(int64_t) * 4 * (size_t)(count > 0 ? count : 1));
  if (!out) return 0;
  int64_t* p = out;
  for (int64_t k = 0; k < nblocks; ++k) {
    const int64_t* blk = blocks + 4 * k;
    for (int64_t i0 = blk[0]; i0 < blk[1]; i0 += IB, p += 4) {
      p[0] = i0; p[1] = (i0 + IB < blk[1]) ? i0 + IB : blk[1]; p[2] = blk[2]; p[3] = blk[3];
    }
  }
  *n = count;
  return out;
}
"""


def work_items(L: Layout, R: str) -> str:
    """Everything after ``lt_rows``: the work items and ``lt_run`` (``R``: the rows of a
    block, a multiple of which a work item holds)."""
    nv = max(1, L.n_orig)
    return (_context(R, nv) + _item(L, nv) + _PIECES + _entry_setup(L, R, nv)
            + _entry_run())


def _context(R: str, nv: int) -> str:
    return f"""
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
  // block-sparse: npieces pieces (i0, i1, first interval, end of intervals) of at most IB
  // rows each, the same in every batch element; pieces == 0 without ranges
  int64_t npieces;
  const int64_t* pieces;
  const int64_t* ivs;
  const int* stop;
}};
"""


def _item_pointers(L: Layout) -> str:
    out = []
    for v in L.orig:
        k, d = v.index, v.dim
        rows = {"i": "c.N", "j": "c.M", "p": "1"}[v.cat]
        out.append(f"c.base[{k}] + blk[{k}] * {rows} * {d}")
    return ", ".join(out)


def _item(L: Layout, nv: int) -> str:
    """``lt_item``: work item w's batch element, rows and columns (or piece), its rows
    reduced, their outputs written (or their partial accumulators kept, split-j)."""
    return f"""
static int lt_item(const LtCtx& c, int64_t w) {{
  if (__atomic_load_n(c.stop, __ATOMIC_RELAXED)) return 2;
  int64_t b, i0, i1, jc = 0, niv = 1, one[2];
  const int64_t* iv = one;
  if (c.pieces) {{
    const int64_t* p = c.pieces + 4 * (w % c.npieces);
    b = w / c.npieces; i0 = p[0]; i1 = p[1]; iv = c.ivs + 2 * p[2]; niv = p[3] - p[2];
  }} else {{
    jc = w % c.nJC;
    const int64_t rest = w / c.nJC, ib = rest % c.nIB;
    b = rest / c.nIB;
    i0 = ib * c.IB; i1 = (i0 + c.IB < c.N) ? i0 + c.IB : c.N;
    one[0] = jc * c.JC; one[1] = (one[0] + c.JC < c.M) ? one[0] + c.JC : c.M;
  }}
  int64_t blk[{nv}];
  for (int v = 0; v < {nv}; ++v) blk[v] = 0;
  for (int64_t k = c.nbd - 1, q = b; k >= 0; --k) {{
    const int64_t idx = q % c.bshape[k]; q /= c.bshape[k];
    for (int v = 0; v < {L.n_orig}; ++v) blk[v] += idx * c.vbs[v * c.nbd + k];
  }}
  Acc accs[LT_MAX_IB];
  const int status = lt_rows({_item_pointers(L)}, i0, i1, iv, niv, accs, c.stop);
  if (status) return status;
  for (int64_t i = i0; i < i1; ++i) {{
    if (c.nJC == 1) {acc_call("accs[i - i0]", "write", "c.outs", "b * c.N + i")}
    else c.part[(b * c.N + i) * c.nJC + jc] = accs[i - i0];
  }}
  return 0;
}}
"""


def _entry_setup(L: Layout, R: str, nv: int) -> str:
    """The start of ``lt_run``: its arguments read, the work items sized (with dot products
    each work item packs all its columns once: below 4 row blocks per item that packing
    costs more than a third of the products, so fewer, larger items are worth some
    imbalance between threads), the block-sparse pieces and split-j partials allocated."""
    min_ib = ("\n  if (IB < 4 * LT_R) IB = 4 * LT_R;  // packing the columns: see the renderer"
              if L.dots else "")
    return f"""
static_assert(sizeof(void*) == sizeof(int64_t), "64-bit pointers");
extern "C" int lt_run(const int64_t* args) {{
  const int64_t N = args[0], M = args[1], jchunk = args[4], nblocks = args[8];
  const int nbd = (int)args[2];
  int nthreads = (int)args[3];
  const int64_t* bshape = (const int64_t*)(intptr_t)args[5];
  const int64_t* vbs = (const int64_t*)(intptr_t)args[6];
  const void* const* vars = (const void* const*)(args + LT_HEADER);
  void* const* outs = (void* const*)(args + LT_HEADER + {L.n_orig});
  LtCtx c;
  for (int v = 0; v < {nv}; ++v) c.base[v] = v < {L.n_orig} ? (const T*)vars[v] : 0;
  if (nthreads < 1) nthreads = 1;
  int64_t B = 1;
  for (int k = 0; k < nbd; ++k) B *= bshape[k];
  c.N = N; c.M = M; c.nbd = nbd; c.bshape = bshape; c.vbs = vbs; c.outs = outs; c.part = 0;
  c.stop = (const int*)(intptr_t)args[11];
  c.ivs = (const int64_t*)(intptr_t)args[10];
  c.pieces = 0; c.npieces = 0;
  int64_t IB = N / (8 * nthreads) + 1;{min_ib}
  if (IB > LT_MAX_IB) IB = LT_MAX_IB;
  IB = (IB + {R} - 1) / {R} * {R};
  c.IB = IB;
  c.nIB = (N + IB - 1) / IB;
  const bool sparse = nblocks >= 0;
  const int64_t JC = (!sparse && jchunk > 0 && jchunk < M) ? (jchunk + TJ - 1) / TJ * TJ : (M > 0 ? M : 1);
  c.JC = JC;
  c.nJC = (M + JC - 1) / JC > 0 ? (M + JC - 1) / JC : 1;
  if (sparse) {{
    c.nJC = 1;
    int64_t* pieces = lt_pieces((const int64_t*)(intptr_t)args[9], nblocks, IB, &c.npieces);
    if (!pieces) return 1;
    c.pieces = pieces;
  }}
  const int64_t nrows = B * N;
  if (c.nJC > 1) {{
    c.part = (Acc*)malloc(sizeof(Acc) * (size_t)(nrows * c.nJC));
    if (!c.part) return 1;
  }}"""


def _entry_run() -> str:
    """The rest of ``lt_run``: the work items on the threads (denormals flushed while they
    run), then the split-j partial accumulators merged and written."""
    return f"""
  const int64_t W = sparse ? B * c.npieces : B * c.nIB * c.nJC;
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
        for (int64_t q = 1; q < c.nJC; ++q) {acc_call("a", "merge", "c.part[r * c.nJC + q]")}
        {acc_call("a", "write", "outs", "r")}
      }}
    }}
  }}
  free(c.part);
  free((void*)c.pieces);
  return status;
}}
"""
