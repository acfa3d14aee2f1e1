"""The CPU kernel skeleton ``lt_run`` around the shared formula and ``Acc`` (render_c.py).

The formula is first planned (:mod:`lazytensor.codegen.cpu.plan`): values that depend on i
only become per-row values, costly values of one j-variable become columns, large dot
products become small matrix products (:mod:`lazytensor.codegen.cpu.gemm`). Then:

- *work items* (batch b, block of rows, chunk of j for split-j) go to OpenMP threads,
  dynamically; one thread, or a small problem, runs them without OpenMP;
- *a work item* walks its j-range in chunks of ``JCH`` columns that stay in L2. It first
  stages the chunk (:mod:`lazytensor.codegen.cpu.layout`): the j-variables of dimension
  > 1 and the columns, one component after the other (``S[k * JCH + j]``, zero-padded to
  whole tiles), in a per-thread buffer -- a GPU's shared-memory tile, here so that the
  pair loop reads every component with unit stride. There is no O(M) set-up pass and no
  O(M) buffer, so one query against 10^7 points is split over threads from its first
  byte. Then, for each block of ``LT_R`` rows (1 without dot products): the row values
  and, per tile of ``TJ`` columns, the dot products and, for each row, a vectorizable
  loop over the tile that evaluates the formula into ``fb``, handed to ``Acc::tile``.
  Accumulators stay per row across tiles and chunks, so every row sees its j in
  increasing order;
- a Sum of wide terms that are weights times j-variables runs its narrow part in the
  pair loop and the rest as weighted sums of the j-vectors
  (:mod:`lazytensor.codegen.cpu.wide`);
- split-j partial accumulators are merged with ``Acc::merge``;
- block-sparse calls (``ranges``) are work items too: a piece of a block of rows against
  its list of j-intervals, the same accumulators and merges.

The kernel runs with denormals flushed to zero (``LtFtz``, as CUDA's fast math does):
an underflowing exp would otherwise cost a hundred cycles per pair.

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

>>> from lazytensor.codegen import ir, ops
>>> from lazytensor.codegen.render_c import VarSpec
>>> x, y = ir.var(0, 3, "i"), ir.var(1, 3, "j")
>>> src = render_cpu_kernel(ops.apply("sum", ops.apply("mul", x, y)),
...                         [VarSpec(0, 3, "i"), VarSpec(1, 3, "j")], "sum", {}, "float32")
>>> "lt_run" in src and "lt_formula" in src
True
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir, reductions
from ..footprint import FUNCTION_STACK_BYTES, Storage, check_dims, function_footprint
from ..linearize import Linear, wide_sum
from ..render_c import prelude, render_formula, render_function, render_shared
from . import HEADER_WORDS
from .gather import gather_loop, in_place
from .gemm import dot_kernel, dot_micro, sqdist_fix
from .layout import Layout, stage_chunk
from .plan import LoopForm, plan_cpu
from .simd import cpu_renames, heap_defs, prelude_defs, vector_header
from .wide import wide_acc_code, wide_block_call, wide_call, wide_softmax_acc_code

L2_CHUNK_BYTES = 262144  # staged j-data of one chunk, reused by every row block of an item
# With dot products every micro-kernel call streams its panel from the chunk, so the chunk
# must stay in L2 next to the row block: half of the smallest common L2 (256 KB). The same
# speed as 256 KB where L2 is 2 MB (measured, D = 256).
DOT_CHUNK_BYTES = 131072
# Sums add the terms of several tiles lane by lane before summing the lanes (a float sum
# of LANE_TERMS / TJ terms per lane, then of the TJ lanes, then into the wide accumulator):
# one pass over the tile buffer per 2048 terms instead of per tile, whose serial sums were
# a quarter of the instructions of a 4-component sum (fused gradient of a Gaussian, D = 3).
LANE_TERMS = 2048
MAX_ROWS_PER_ITEM = 256  # rows of a work item (fewer when N is small or Acc is large)
# Node values: the largest in the per-thread heap (simd.heap_defs), arrays aligned for AVX.
CPU_STORAGE = Storage("lt_heap.p", 64)


_ACC_TMP = f"""
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


def tile_size(F: int, dtype: str) -> int:
    """j-tile length: the tile buffer F x TJ stays within 16 KB of L1."""
    size = 4 if dtype == "float32" else 8
    tj = 256
    while tj > 8 and F * tj * size > 16384:
        tj //= 2
    return tj


def _row_block(L: Layout, F: int, R: int, after_tile: str = "", lanes: int = 0,
               after_rows: str = "", heap_len: int = 0, gather: set | None = None) -> str:
    """``lt_rows``: rows [i0, i1) against a list of column intervals into ``accs``
    (``after_tile``: a statement run after each ``Acc::tile`` on ``A[i - i0]``, see
    :mod:`lazytensor.codegen.cpu.wide`). ``gather`` (the indices of the variables the
    planned formula reads): the columns of consecutive intervals are staged together,
    chunk after chunk (see :func:`lazytensor.codegen.cpu.gather.gather_loop`).

    ``after_rows``: a statement run once the block's rows have their tiles (each row its
    own tile buffer ``fb + r * F * TJ``), for the weighted sums of several rows at once.

    ``lanes`` > 0 (a sum, one row per block): the pair loop adds its terms into ``fb``
    lane by lane, and ``Acc::tile`` sums the lanes once every ``lanes`` tiles (and at the
    end of a chunk) instead of once per tile. ``heap_len``: values of the per-thread heap
    buffer the formula functions use."""
    ptr_args = ", ".join(f"const T* __restrict__ P{v.index}" for v in L.orig)
    decl = [f"  alignas(64) T fb[{R if after_rows else 1} * {F} * TJ];"]
    if lanes:
        decl.append(f"  for (int q = 0; q < {F} * TJ; ++q) fb[q] = 0;")
    if heap_len:
        decl.append(f"  if (!lt_heap.reserve({heap_len})) return 1;")
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
    gathered = in_place(L, gather) if gather is not None else {}
    staged_dims = L.buffer_dims + sum(d for _, d in gathered.values())
    if staged_dims or extra:
        size = " + ".join([f"(size_t){staged_dims} * JCH"] + extra)
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
            decl.append(f"  alignas(64) T H[{R}][{nrv}];")
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
        elif k in gathered:  # staged after the others by the gathering chunk loop
            row_ptrs.append(f"          const T* Y{k} = S + {gathered[k][0]} * JCH + t0;")
            jloads.append(f"            const T y{k}[1] = {{Y{k}[jj]}};")
            call.append(f"y{k}")
        else:  # a j-variable of dimension 1 (or one the formula does not read): in place
            jloads.append(f"            const T* y{k} = P{k} + (j0 + jj) * {v.dim};")
            call.append(f"y{k}")
    if after_rows:
        row_ptrs.append(f"          T* const fbr = fb + (size_t)r * {F} * TJ;")
    fbuf = "fbr" if after_rows else "fb"
    if L.wide:
        # Vectors wider than WIDE: one pair at a time, each op of the formula a loop that
        # vectorizes along the vector, and the reduction's push (also a vector loop).
        pair_loop = f"""          for (int jj = 0; jj < nj; ++jj) {{
{nl.join(jloads)}
            alignas(64) T o[{F}];
            lt_formula({", ".join(call)}, o);
            A[i - i0].push(o, j0 + jj);
          }}"""
    else:
        if lanes:
            store = "fb[k * TJ + jj] += o[k]"
            hand_over = f"""          if ((j0 - c0) / TJ % {lanes} == {lanes - 1} || j0 + TJ >= c1) {{
            A[i - i0].tile(fb, TJ, j0);
            for (int q = 0; q < {F} * TJ; ++q) fb[q] = 0;
          }}"""
        else:
            store = f"{fbuf}[k * TJ + jj] = o[k]"
            hand_over = f"          A[i - i0].tile({fbuf}, nj, j0);{after_tile}"
        loop = f"""          // GCC ivdep, not omp simd: omp simd privatizes the local arrays before inlining
          // and then fails to vectorize; with ivdep they are scalarized and it vectorizes.
          #pragma GCC ivdep
          for (int jj = @START@; jj < nj; ++jj) {{
{nl.join(jloads)}
            T o[{F}];
            lt_formula({", ".join(call)}, o);
            for (int k = 0; k < {F}; ++k) {store};
          }}"""
        if lanes:
            # Whole vectors of pairs add into F vector accumulators kept in registers
            # across the tile, the rest into fb; the accumulators then join fb's first
            # lanes. fb's load, add and store per term were a fifth of a fused gradient's
            # time (Gaussian D = 3, AVX-512: 8.6 -> 8.3 ms, 7.9 without LT_ROUNDED). LT_ROUNDED:
            # each term rounded before it is added, in every kernel alike (GCC would
            # contract a last product into the sum where nothing else reads it: a fused
            # forward would then differ from the plain one in the last bits).
            vec_loads = nl.join(["    " + j for j in jloads])
            pair_loop = f"""#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define LT_ROUNDED(v) __asm__("" : "+x"(v))
#else
#define LT_ROUNDED(v) (void)0
#endif
          lt_vec la[{F}];
          for (int k = 0; k < {F}; ++k) la[k] = lt_vec{{}};
          int jv = 0;
          for (; jv + LT_W <= nj; jv += LT_W) {{
            alignas(64) T ob[{F}][LT_W];
            #pragma GCC ivdep
            for (int l = 0; l < LT_W; ++l) {{
              const int jj = jv + l;
{vec_loads}
              T o[{F}];
              lt_formula({", ".join(call)}, o);
              for (int k = 0; k < {F}; ++k) ob[k][l] = o[k];
            }}
            for (int k = 0; k < {F}; ++k) {{ lt_vec t; memcpy(&t, ob[k], sizeof t); LT_ROUNDED(t); la[k] += t; }}
          }}
{loop.replace("@START@", "jv")}
          for (int k = 0; k < {F}; ++k) {{
            lt_vec t; memcpy(&t, fb + k * TJ, sizeof t); t += la[k]; memcpy(fb + k * TJ, &t, sizeof t);
          }}
{hand_over}"""
        else:
            pair_loop = loop.replace("@START@", "0") + "\n" + hand_over
    rows_of_chunk = f"""    for (int64_t ig = i0; ig < i1; ig += {R}) {{
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
        }}{after_rows}
      }}
    }}"""
    head = f"""
static int lt_rows({ptr_args}, int64_t i0, int64_t i1, const int64_t* iv, int64_t niv,
                   Acc* accs, const int* stop) {{
  for (int64_t i = i0; i < i1; ++i) accs[i - i0].init();
  if (niv == 0) return 0;
{nl.join(decl)}
{prep_item}"""
    if gather is not None:
        return gather_loop(L, gathered, head, rows_of_chunk)
    return f"""
// Rows [i0, i1) against the columns of the niv intervals iv[2q] <= j < iv[2q + 1], in
// that order, chunk by chunk. An interval that starts below a column already reduced (out
// of order, or repeated) is reduced into accumulators of its own and merged: the tiles'
// fast paths take their columns to come after every index kept. Returns 0, 1 when out of
// memory, 2 when *stop was set (checked before each chunk).{head}
  int64_t seen = INT64_MIN;  // past the largest column reduced so far
  for (int64_t q = 0; q < niv; ++q) {{
  const int64_t jb = iv[2 * q], je = iv[2 * q + 1];
  if (je <= jb) continue;
  Acc* A = accs;
  if (jb < seen) {{
    A = lt_acc_tmp.get(i1 - i0);
    if (!A) return 1;
    for (int64_t i = i0; i < i1; ++i) A[i - i0].init();
  }}
  for (int64_t c0 = jb; c0 < je; c0 += JCH) {{
    if (__atomic_load_n(stop, __ATOMIC_RELAXED)) return 2;
    const int64_t c1 = (c0 + JCH < je) ? c0 + JCH : je, nc = c1 - c0;
    const int64_t ncp = (nc + TJ - 1) / TJ * TJ;
    (void)ncp;
{stage_chunk(L)}
{rows_of_chunk}
  }}
  if (A != accs)
    for (int64_t i = i0; i < i1; ++i) accs[i - i0].merge(A[i - i0]);
  if (je > seen) seen = je;
  }}
  return 0;
}}
"""


def _item_pointers(L: Layout) -> str:
    out = []
    for v in L.orig:
        k, d = v.index, v.dim
        rows = {"i": "c.N", "j": "c.M", "p": "1"}[v.cat]
        out.append(f"c.base[{k}] + blk[{k}] * {rows} * {d}")
    return ", ".join(out)


@dataclass(frozen=True)
class KernelShape:
    """What :func:`render_cpu_kernel` decides before it emits code: the planned formula
    (``lin.narrow`` when ``lin``, the weighted-sum form, is taken), its layout, the tile
    and chunk lengths, and the generated functions that evaluate IR (name, roots,
    variables), whose values may live in the per-thread heap (:mod:`..footprint`)."""

    plan: LoopForm
    layout: Layout
    lin: Linear | None
    tj: int
    jch: int
    functions: tuple
    dtype: str

    def footprints(self) -> dict:
        """{function name: its :class:`~lazytensor.codegen.footprint.Footprint`}."""
        return {name: function_footprint(roots, specs, self.dtype, FUNCTION_STACK_BYTES)
                for name, roots, specs in self.functions}

    @property
    def heap_elements(self) -> int:
        """Length of the per-thread heap buffer the functions share (0: none): they never
        run nested, so each uses it from its start."""
        return max([f.heap_elements for f in self.footprints().values()] + [0])


def cpu_kernel_shape(formula, var_specs, reduction: str, dtype: str,
                     dot_tiling: bool | None = None) -> KernelShape:
    """The shape of the kernel :func:`render_cpu_kernel` emits for these arguments."""
    check_dims(formula)
    lin = wide_sum(formula, reduction)
    if lin is not None:
        shape = _shape(lin.narrow, var_specs, dtype, dot_tiling, lin)
        if shape is not None:
            return shape
    return _shape(formula, var_specs, dtype, dot_tiling)


def _shape(formula, var_specs, dtype, dot_tiling, lin=None) -> KernelShape | None:
    F = formula.dim
    plan = plan_cpu(formula, max([v.index + 1 for v in var_specs] + [0]), dot_tiling)
    L = Layout(var_specs, plan, dtype=dtype)
    if lin is not None and L.wide:
        return None  # the narrow part still reads a wide vector pair by pair
    size = 4 if dtype == "float32" else 8
    tj = max(tile_size(F, dtype), 64) if L.dots else tile_size(F, dtype)
    chunk = DOT_CHUNK_BYTES if L.dots else L2_CHUNK_BYTES
    jch = max(tj, chunk // L.j_bytes(size) // tj * tj)
    functions = [("lt_formula", (plan.formula,), tuple(L.formula_specs))]
    if L.n_row_values:
        functions.append(("lt_rowvals", tuple(d.node for d in plan.rows),
                          tuple(v for v in L.orig if v.cat in ("i", "p"))))
    for d in plan.cols:
        functions.append((f"lt_col{d.var.index}", (d.node,),
                          (next(v for v in L.orig if v.index == d.source),)))
    return KernelShape(plan, L, lin, tj, jch, tuple(functions), dtype)


def render_cpu_kernel(formula, var_specs, reduction: str, opts: dict, dtype: str,
                      dot_tiling: bool | None = None, ranged: bool = False) -> str:
    """Complete C++ source of the CPU kernel ``lt_run`` (see the module docstring).

    A Sum of wide terms that are weights times j-variables runs its narrow part in the
    pair loop and the rest as weighted sums of the j-vectors (:mod:`lazytensor.codegen.cpu.wide`).
    ``ranged``: the kernel of block-sparse calls, which stages the columns of consecutive
    intervals together when the pair loop allows it (see :func:`lazytensor.codegen.cpu.gather.gather_loop`)."""
    return _render(cpu_kernel_shape(formula, var_specs, reduction, dtype, dot_tiling),
                   reduction, opts, dtype, ranged)


def _render(shape: KernelShape, reduction, opts, dtype, ranged=False, jside=None) -> str:
    """The kernel's source; ``jside`` = (definitions, statement): only the code up to
    ``lt_rows``, the statement run after each row block's weighted sums (the j-side sums
    of :mod:`lazytensor.codegen.cpu.twosided`, which brings its own skeleton)."""
    plan, L, lin, tj, jch = shape.plan, shape.layout, shape.lin, shape.tj, shape.jch
    F = plan.formula.dim
    R = "LT_R" if L.dots else "1"  # rows per block: LT_R depends on the vector width
    heap_len = shape.heap_elements
    storage = CPU_STORAGE
    defs = prelude_defs() + (heap_defs() if heap_len else "")
    nv = max(1, L.n_orig)
    if lin is None:
        src = [render_shared(plan.formula, L.formula_specs, reduction, opts, dtype, tj=tj,
                             rename=cpu_renames, backend_defs=defs, storage=storage)]
    else:  # the narrow formula, and the weighted sums' Acc (after the vector types)
        acc_dtype = reductions.get(reduction).acc_dtype(dtype, opts)
        src = [prelude(dtype, acc_dtype, defs) + f"static const int TJ = {tj};\n"
               + render_formula(plan.formula, L.formula_specs, dtype, cpu_renames, storage)]
    src.append("#ifdef _OPENMP\n#include <omp.h>\n#endif\n")
    src.append(vector_header())
    if lin is not None:
        red = reductions.get(reduction)
        src.append(wide_acc_code(lin, opts) if red.wide == "sum"
                   else wide_softmax_acc_code(lin, red))
    src.append(f"static const int64_t JCH = {jch};  // columns per staged chunk\n")
    if L.n_row_values:
        row_in = [v for v in L.orig if v.cat in ("i", "p")]
        src.append(render_function("lt_rowvals", [d.node for d in plan.rows], row_in, dtype,
                                   cpu_renames, "static LT_INLINE", storage))
    for d in plan.cols:
        s = next(v for v in L.orig if v.index == d.source)
        src.append(render_function(f"lt_col{d.var.index}", [d.node], [s], dtype, cpu_renames,
                                   "static LT_INLINE", storage))
    if L.dots:
        src.append(dot_micro())
    for D in sorted({d.dim for d in L.dots}):
        src.append(dot_kernel(D))
    for D in sorted({d.dim for d in L.dots if d.kind == "sqdist"}):
        src.append(sqdist_fix(D))
    src.append(_ACC_TMP)
    red = reductions.get(reduction)
    lanes = 0
    if lin is None and not L.dots and not L.wide and tj >= 64 and red.lanes_add(opts):
        lanes = max(1, LANE_TERMS // tj)  # tj >= 64: whole vectors (lt_vec) of lanes
    if lin is not None and L.dots and red.wide == "sum":
        # several rows' weights against each tile of B at once (wide.lt_wblock)
        defs, more = jside or ("", "")
        src.append(defs + _row_block(L, F, R, heap_len=heap_len, after_rows="\n        "
                                     + wide_block_call(lin, f"{F} * TJ", "A") + more))
    else:
        # Block-sparse calls of the plain pair loop stage several intervals per chunk, unless
        # the reduction outputs indices (the tiles then need their global column numbers).
        gather = None
        if (ranged and lin is None and not L.dots and not L.wide
                and all(o.kind == "value" for o in red.outputs(F, opts))):
            gather = {v.index for v in ir.variables(plan.formula)}
        after = "" if lin is None else "\n          " + wide_call(lin, "A[i - i0]")
        src.append(_row_block(L, F, R, after, lanes, heap_len=heap_len, gather=gather))
    if jside:
        return "".join(src)
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
  // block-sparse: npieces pieces (i0, i1, first interval, end of intervals) of at most IB
  // rows each, the same in every batch element; pieces == 0 without ranges
  int64_t npieces;
  const int64_t* pieces;
  const int64_t* ivs;
  const int* stop;
}};

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
    if (c.nJC == 1) accs[i - i0].write(c.outs, b * c.N + i);
    else c.part[(b * c.N + i) * c.nJC + jc] = accs[i - i0];
  }}
  return 0;
}}

// The blocks (i0, i1, s0, s1) of a block-sparse call, cut into pieces of at most IB rows
// (malloc'ed, 4 words each; *n of them); null when out of memory.
static int64_t* lt_pieces(const int64_t* blocks, int64_t nblocks, int64_t IB, int64_t* n) {{
  int64_t count = 0;
  for (int64_t k = 0; k < nblocks; ++k)
    if (blocks[4 * k + 1] > blocks[4 * k]) count += (blocks[4 * k + 1] - blocks[4 * k] + IB - 1) / IB;
  int64_t* out = (int64_t*)malloc(sizeof(int64_t) * 4 * (size_t)(count > 0 ? count : 1));
  if (!out) return 0;
  int64_t* p = out;
  for (int64_t k = 0; k < nblocks; ++k) {{
    const int64_t* blk = blocks + 4 * k;
    for (int64_t i0 = blk[0]; i0 < blk[1]; i0 += IB, p += 4) {{
      p[0] = i0; p[1] = (i0 + IB < blk[1]) ? i0 + IB : blk[1]; p[2] = blk[2]; p[3] = blk[3];
    }}
  }}
  *n = count;
  return out;
}}

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
  }}
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
        for (int64_t q = 1; q < c.nJC; ++q) a.merge(c.part[r * c.nJC + q]);
        a.write(outs, r);
      }}
    }}
  }}
  free(c.part);
  free((void*)c.pieces);
  return status;
}}
""")
    return "".join(src)
