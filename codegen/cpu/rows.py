"""``lt_rows``, the CPU kernel's loop over a block of rows, as named pieces of C++.

``lt_rows`` reduces rows [i0, i1) against a list of column intervals into one accumulator
per row (:mod:`lazytensor.codegen.cpu.kernel` describes the whole kernel). Its pieces, in
the order of the text:

- :func:`_buffers`: the tile of terms ``fb``, the per-thread staging buffer ``S`` (the
  chunk's staged and packed j-data; with dot products also the item's rows, packed once);
- :func:`_dot_buffers` and :func:`_row_values`: the packed rows of the dot products, their
  norms and tiles, and the rows' values, with the pointers of a block of rows;
- :func:`_pair_operands`: how the formula reads each variable in the pair loop;
- :func:`_pair_loop`: the pair loop itself, in one of three forms: along the vector for
  wide formulas (:func:`_vector_pairs`), whole vectors of pairs into registers for sums
  (:func:`_lane_pairs`), or a vectorized loop over a tile (:func:`_tile_loop`);
- :func:`_rows_of_chunk`: the row blocks of a staged chunk and their tiles;
- :func:`_interval_loop`: the intervals, chunk by chunk, with the accumulators of an
  interval out of order kept apart and merged (block-sparse calls whose reduction outputs
  no index gather their intervals instead, :mod:`lazytensor.codegen.cpu.gather`).
"""

from __future__ import annotations

from ..render_c import acc_call, array, formula_call, loop
from .gather import gather_loop, in_place
from .layout import NORM_ACC, Layout, stage_chunk

_NL = "\n"
_ROWS = loop("i", "i1", "i0", "int64_t")  # the rows of lt_rows, each with its accumulator


def row_block(L: Layout, F: int, R: str, after_tile: str = "", lanes: int = 0,
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
    gathered = in_place(L, gather) if gather is not None else {}
    decl = _buffers(L, F, R, lanes, bool(after_rows), heap_len, gathered)
    dot_decl, block_ptrs, pack, at = _dot_buffers(L, R)
    decl += dot_decl
    if L.n_row_values:
        h_decl, h_ptr = _row_values(L, R, at)
        decl.append(h_decl)
        block_ptrs.insert(0, h_ptr)
    prep_item, prep_block = _preparation(L, R, block_ptrs, pack)
    row_ptrs, jloads, call, unstaged = _pair_operands(L, gathered)
    if after_rows:
        row_ptrs.append(f"          T* const fbr = fb + (size_t)r * {F} * TJ;")
    pair_loop = _pair_loop(L, F, (jloads, unstaged), call, lanes, "fbr" if after_rows else "fb",
                           after_tile)
    rows = _rows_of_chunk(R, block_ptrs, prep_block, _dot_calls(L), row_ptrs, pair_loop,
                          after_rows)
    ptr_args = ", ".join(f"const T* __restrict__ P{v.index}" for v in L.orig)
    head = f"""
static int lt_rows({ptr_args}, int64_t i0, int64_t i1, const int64_t* iv, int64_t niv,
                   Acc* accs, const int* stop) {{
  {_ROWS} {acc_call("accs[i - i0]", "init")}
  if (niv == 0) return 0;
{_NL.join(decl)}
{prep_item}"""
    if gather is not None:
        return gather_loop(L, gathered, head, rows)
    return _interval_loop(L, head, rows)


def _buffers(L: Layout, F: int, R: str, lanes: int, multi_row: bool, heap_len: int,
             gathered: dict) -> list:
    """The declarations of the tile of terms and of the work buffer ``S``: the chunk's
    staged and packed j-data; with dot products, also the item's rows, packed once (not
    once per chunk) in blocks of R, their norms and their row values, which could be too
    large for the stack."""
    decl = ["  " + array("fb", f"{R if multi_row else 1} * {F} * TJ", align=64)]
    if lanes:
        decl.append(f"  for (int q = 0; q < {F} * TJ; ++q) fb[q] = 0;")
    if heap_len:
        decl.append(f"  if (!lt_heap.reserve({heap_len})) return 1;")
    extra = [f"ni * {d.dim}" + (" + ni" if d.kind == "sqdist" else "") for d in L.dots]
    if L.dots and L.n_row_values:
        extra.append(f"ni * {L.n_row_values}")
    if L.dots:
        decl.append(f"  const int64_t ni = (i1 - i0 + {R} - 1) / {R} * {R};")
    staged_dims = L.buffer_dims + sum(d for _, d in gathered.values())
    if staged_dims or extra:
        size = " + ".join([f"(size_t){staged_dims} * JCH"] + extra)
        decl.append(f"  T* const S = lt_stage.get({size});")
        decl.append("  if (!S) return 1;")
    return decl


def _dot_buffers(L: Layout, R: str) -> tuple:
    """(declarations, pointers of a block of rows, packing of a block, end of the buffers)
    for the dot products: the item's rows packed k-major (and their norms), and the tile
    ``G`` of each product."""
    decl, block_ptrs, pack = [], [], []
    at = f"S + (size_t){L.buffer_dims} * JCH"
    for n, d in enumerate(L.dots):
        decl.append(f"  T* const A{n} = {at};")
        at = f"A{n} + ni * {d.dim}"
        if d.kind == "sqdist":
            decl.append(f"  T* const nA{n} = {at};")
            at = f"nA{n} + ni"
        decl.append("  " + array(f"G{n}", f"{R} * TJ", align=64))
        block_ptrs.append(f"      const T* const Ab{n} = A{n} + (ig - i0) * {d.dim};")
        if d.kind == "sqdist":
            block_ptrs.append(f"      const T* const nAb{n} = nA{n} + (ig - i0);")
        pack.append(_pack_rows(L, n, d, R))
    return decl, block_ptrs, pack, at


def _pack_rows(L: Layout, n: int, d, R: str) -> str:
    """The rows of block ig, operand of dot product n, packed k-major (zero-padded to R
    rows); for a squared distance, their norms, summed across the block's rows at once
    (each row in the order of k, in ``NORM_ACC``: see :func:`stage_chunk`)."""
    if d.a.op == "var":
        src = f"P{d.a.index} + (ig + r) * {d.a.dim}"
    else:
        src = f"Hb[r] + {L.row_offset[L.row_of_node[d.a]]}"
    norm = ""
    if d.kind == "sqdist":
        norm = f"""
        {NORM_ACC} s[{R}] = {{}};
        for (int k = 0; k < {d.dim}; ++k)
          for (int r = 0; r < {R}; ++r) {{ const {NORM_ACC} v = Ab[k * {R} + r]; s[r] += v * v; }}
        for (int r = 0; r < nr; ++r) nA{n}[ig - i0 + r] = (T)s[r];"""
    return f"""      {{ T* const Ab = A{n} + (ig - i0) * {d.dim};
        for (int r = 0; r < {R}; ++r) {{
          if (r < nr) {{ const T* a = {src}; for (int k = 0; k < {d.dim}; ++k) Ab[k * {R} + r] = a[k]; }}
          else for (int k = 0; k < {d.dim}; ++k) Ab[k * {R} + r] = 0;
        }}{norm}
      }}"""


def _row_values(L: Layout, R: str, at: str) -> tuple:
    """(declaration, pointer of block ig) of the rows' values: all the item's rows after
    the packed rows with dot products, a block of rows on the stack without."""
    nrv = L.n_row_values
    if L.dots:
        decl = f"  T (* const H)[{nrv}] = (T (*)[{nrv}])({at});"
    else:
        decl = f"  alignas(64) T H[{R}][{nrv}];"
    return decl, f"      T (* const Hb)[{nrv}] = H{' + (ig - i0)' if L.dots else ''};"


def _preparation(L: Layout, R: str, block_ptrs: list, pack: list) -> tuple:
    """(before the chunks, before each block's tiles): the rows' values and the packed
    rows; with dot products once per item, for all its rows."""
    row_in = [v for v in L.orig if v.cat in ("i", "p")]
    row_args = ", ".join(
        [f"P{v.index} + (ig + r) * {v.dim}" if v.cat == "i" else f"P{v.index}" for v in row_in]
        + ["Hb[r]"])
    rowvals = (f"      for (int r = 0; r < nr; ++r) lt_rowvals({row_args});"
               if L.n_row_values else "")
    prep = _NL.join([p for p in [rowvals] + pack if p])
    if not L.dots:
        return "", prep
    return f"""  for (int64_t ig = i0; ig < i1; ig += {R}) {{
      const int nr = (int)((i1 - ig) < {R} ? (i1 - ig) : {R});
{block_ptrs[0] if L.n_row_values else ""}
{prep}
  }}""", ""


def _dot_calls(L: Layout) -> list:
    """The dot products (and squared distances) of a block of rows and a tile."""
    dots = []
    for n, d in enumerate(L.dots):
        b = f"S + {L.pack_offset[d.b]} * JCH + t0 * {d.dim}"
        dots.append(f"        lt_dot{d.dim}(Ab{n}, {b}, nr, nj, G{n});")
        if d.kind == "sqdist":
            nb = f"S + {L.stage_offset[d.norm_b]} * JCH + t0"
            dots.append(f"        lt_sqdist{d.dim}(Ab{n}, nAb{n}, {b}, {nb}, nr, nj, G{n});")
    return dots


def _pair_operands(L: Layout, gathered: dict) -> tuple:
    """(pointers of a row, loads of a pair, arguments of ``lt_formula``, {index: dim} of
    the j-variables read in place): a dot product's tile, a row value, an i-variable or
    parameter in place, a staged j-variable or column, a gathered j-variable, or a
    j-variable of dimension 1 read in place."""
    row_ptrs, jloads, call, in_place = [], [], [], {}
    for v in L.formula_specs:
        k = v.index
        if k in L.dot_index:
            n = next(q for q, d in enumerate(L.dots) if d.var.index == k)
            row_ptrs.append(f"          const T* g{k} = G{n} + r * TJ;")
            jloads.append(f"            const T y{k}[1] = {{g{k}[jj]}};")
        elif k in L.row_offset:
            row_ptrs.append(f"          const T* v{k} = Hb[r] + {L.row_offset[k]};")
        elif v.cat == "i":
            row_ptrs.append(f"          const T* v{k} = P{k} + i * {v.dim};")
        elif v.cat == "p":
            call.append(f"P{k}")
            continue
        elif k in L.stage_offset and (k in L.col_source or not L.wide):
            row_ptrs.append(f"          const T* Y{k} = S + {L.stage_offset[k]} * JCH + t0;")
            jloads.append(f"            T y{k}[{v.dim}]; for (int c = 0; c < {v.dim}; ++c) "
                          f"y{k}[c] = Y{k}[c * JCH + jj];")
        elif k in L.col_source:  # a dot product's operand only: the formula does not read it
            jloads.append(f"            const T* y{k} = 0;")
        elif k in gathered:  # staged after the others by the gathering chunk loop
            row_ptrs.append(f"          const T* Y{k} = S + {gathered[k][0]} * JCH + t0;")
            jloads.append(f"            const T y{k}[1] = {{Y{k}[jj]}};")
        else:  # a j-variable of dimension 1 (or one the formula does not read): in place
            jloads.append(_in_place_load(k, v.dim))
            if v.dim == 1:  # (a wider one is not read)
                in_place[k] = v.dim
        row_value = k not in L.dot_index and (k in L.row_offset or v.cat == "i")
        call.append(f"v{k}" if row_value else f"y{k}")
    return row_ptrs, jloads, call, in_place


def _in_place_load(k: int, dim: int) -> str:
    return f"            const T* y{k} = P{k} + (j0 + jj) * {dim};"


def _pair_loop(L: Layout, F: int, loads: tuple, call: list, lanes: int, fbuf: str,
               after_tile: str) -> str:
    """The pairs of one row and one tile, and the tile handed to the accumulator
    (``loads``: the loads of a pair and the j-variables they read in place)."""
    jloads = loads[0]
    if L.wide:
        return _vector_pairs(F, jloads, call)
    if lanes:
        store = "fb[k * TJ + jp] += jp < nj ? o[k] : (T)0"
        hand_over = f"""          if ((j0 - c0) / TJ % {lanes} == {lanes - 1} || j0 + TJ >= c1) {{
            {acc_call("A[i - i0]", "tile", "fb", "TJ", "j0")}
            for (int q = 0; q < {F} * TJ; ++q) fb[q] = 0;
          }}"""
        rest = _tile_loop(F, loads, call, store, "jv", whole=False)
        return _lane_pairs(F, jloads, call, rest, hand_over)
    store = f"{fbuf}[k * TJ + jp] = o[k]"
    hand_over = f"          {acc_call('A[i - i0]', 'tile', fbuf, 'nj', 'j0')}{after_tile}"
    return _tile_loop(F, loads, call, store, "0") + "\n" + hand_over


def _vector_pairs(F: int, jloads: list, call: list) -> str:
    """Vectors wider than WIDE: one pair at a time, each op of the formula a loop that
    vectorizes along the vector, and the reduction's push (also a vector loop)."""
    return f"""          {loop("jj", "nj")} {{
{_NL.join(jloads)}
            {array("o", F, align=64)}
            {formula_call(call)}
            {acc_call("A[i - i0]", "push", "o", "j0 + jj")}
          }}"""


def _tile_loop(F: int, loads: tuple, call: list, store: str, start: str,
               whole: bool = True) -> str:
    """The pairs [start, nj) of a tile, vectorized across j, each value stored by ``store``
    (``jp``: the pair's column in the tile).

    By whole blocks of LT_TW columns: every column goes through the same vector code,
    never through a scalar remainder loop, whose libm functions differ from the vector
    ones (libmvec) in the last bit; equal pairs then have equal values wherever they are
    (ties go to the lowest index). A last block past nj reads the staged columns' zero
    padding, and the j-variables read in place from a copy of its columns (column nj - 1
    past nj); its values past nj are not stored, or stored where nothing reads them.
    ``whole`` false: [start, nj) is less than a block (the rest of a sum's lanes)."""
    jloads, in_place = loads
    copies = [f"            T Q{k}[LT_TW * {d}];\n"
              f"            for (int l = 0; l < LT_TW; ++l) for (int c = 0; c < {d}; ++c) "
              f"Q{k}[l * {d} + c] = P{k}[(j0 + (jq + l < nj ? jq + l : nj - 1)) * {d} + c];"
              for k, d in in_place.items()]
    last = {_in_place_load(k, d): f"            const T* y{k} = Q{k} + l * {d};"
            for k, d in in_place.items()}
    last_loads = [last.get(j, j) for j in jloads]
    # the whole blocks as one loop (a loop of blocks cost 9% of a D = 3 argKmin's time)
    blocks = _block(F, jloads, call, store, start, "jq") if whole else ""
    return f"""          const int jq = {f"{start} + (nj - {start}) / LT_TW * LT_TW" if whole else start};
{blocks}
          if (jq < nj) {{
{_NL.join(copies)}
{_block(F, last_loads, call, store, "0", "LT_TW", "jq + ")}
          }}"""


def _block(F: int, jloads: list, call: list, store: str, lo: str, hi: str,
           at: str = "") -> str:
    """The pairs ``at`` + l, l in [lo, hi)."""
    return f"""          // GCC ivdep, not omp simd: omp simd privatizes the local arrays before inlining
          // and then fails to vectorize; with ivdep they are scalarized and it vectorizes.
          // unroll 1: a loop of LT_TW scalar calls unrolled before it is vectorized.
          #pragma GCC ivdep
          #pragma GCC unroll 1
          for (int l = {lo}; l < {hi}; ++l) {{
            const int jp = {at}l, jj = jp;
{_NL.join(jloads)}
            {array("o", F)}
            {formula_call(call)}
            for (int k = 0; k < {F}; ++k) {store};
          }}"""


def _lane_pairs(F: int, jloads: list, call: list, rest: str, hand_over: str) -> str:
    """A sum's pairs: whole vectors of pairs add into F vector accumulators kept in
    registers across the tile, the ``rest`` into fb; the accumulators then join fb's
    first lanes."""
    # fb's load, add and store per term were a fifth of a fused gradient's time (Gaussian
    # D = 3, AVX-512: 8.6 -> 8.3 ms, 7.9 without LT_ROUNDED). LT_ROUNDED: each term rounded
    # before it is added, in every kernel alike (GCC would contract a last product into the
    # sum where nothing else reads it: a fused forward would then differ from the plain one
    # in the last bits).
    vec_loads = _NL.join(["    " + j for j in jloads])
    return f"""#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
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
            #pragma GCC unroll 1
            for (int l = 0; l < LT_W; ++l) {{
              const int jj = jv + l;
{vec_loads}
              {array("o", F)}
              {formula_call(call)}
              for (int k = 0; k < {F}; ++k) ob[k][l] = o[k];
            }}
            for (int k = 0; k < {F}; ++k) {{ lt_vec t; memcpy(&t, ob[k], sizeof t); LT_ROUNDED(t); la[k] += t; }}
          }}
{rest}
          for (int k = 0; k < {F}; ++k) {{
            lt_vec t; memcpy(&t, fb + k * TJ, sizeof t); t += la[k]; memcpy(fb + k * TJ, &t, sizeof t);
          }}
{hand_over}"""


def _rows_of_chunk(R: str, block_ptrs: list, prep_block: str, dots: list, row_ptrs: list,
                   pair_loop: str, after_rows: str) -> str:
    """The row blocks of a staged chunk [c0, c1): per block its preparation, then per tile
    the dot products and each row's pair loop."""
    return f"""    for (int64_t ig = i0; ig < i1; ig += {R}) {{
      const int nr = (int)((i1 - ig) < {R} ? (i1 - ig) : {R});
{_NL.join(block_ptrs)}
{prep_block}
      for (int64_t j0 = c0; j0 < c1; j0 += TJ) {{
        const int nj = (int)((c1 - j0) < TJ ? (c1 - j0) : TJ);
        const int64_t t0 = j0 - c0;
        (void)t0;
{_NL.join(dots)}
        for (int r = 0; r < nr; ++r) {{
          const int64_t i = ig + r;
{_NL.join(row_ptrs)}
{pair_loop}
        }}{after_rows}
      }}
    }}"""


def _interval_loop(L: Layout, head: str, rows_of_chunk: str) -> str:
    """``lt_rows``'s walk over its intervals, chunk by chunk, staging each chunk."""
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
    {_ROWS} {acc_call("A[i - i0]", "init")}
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
    {_ROWS} {acc_call("accs[i - i0]", "merge", "A[i - i0]")}
  if (je > seen) seen = je;
  }}
  return 0;
}}
"""
