"""Block-sparse row loops that stage the columns of consecutive intervals together.

In a block-sparse call whose reduction outputs no index, the intervals of a block of rows
are often a few columns each (clusters of a few points): :func:`gather_loop` copies the
columns of consecutive intervals into one chunk of up to JCH staged columns, so that the
pair loop still sees whole tiles. Used by :mod:`lazytensor.codegen.cpu.rows`.
"""

from __future__ import annotations

from .layout import Layout


def in_place(L: Layout, used: set) -> dict:
    """{index: (offset in S, dim)}: the j-variables the pair loop reads in place (dimension
    1) among ``used``, which a gathering chunk loop stages after the staged values."""
    out, at = {}, L.buffer_dims
    for v in L.formula_specs:
        k = v.index
        if (v.cat == "j" and k in used and k not in L.dot_index and k not in L.stage_offset
                and k not in L.col_source and k not in L.row_offset):
            out[k] = (at, v.dim)
            at += v.dim
    return out


def _column_blocks(k: int, off: int, d: int, s: int, ds: int) -> str:
    """Computed column k (``lt_col{k}`` of variable s, dimension ds) of an interval's
    ``take`` columns from ``off``, staged at ``S[(off + c) * JCH + nc + jj]``: by whole
    blocks of LT_TW columns into a block buffer, the last block on a copy of its source
    rows (row take - 1 again past take), so that every column goes through the same
    vector code (see :func:`lazytensor.codegen.cpu.layout.stage_chunk`)."""
    def block(row: str) -> str:
        return f"""        #pragma GCC ivdep
        #pragma GCC unroll 1
        for (int l = 0; l < LT_TW; ++l) lt_col{k}({row}, R[l]);"""
    return f"""      {{ int64_t jq = 0; T R[LT_TW][{d}];
      for (; jq < take; jq += LT_TW) {{
        const int64_t nb = take - jq < LT_TW ? take - jq : LT_TW;
        if (nb == LT_TW) {{
{block(f"P{s} + (off + jq + l) * {ds}")}
        }} else {{
          T Q[LT_TW * {ds}];
          for (int l = 0; l < LT_TW; ++l) for (int c = 0; c < {ds}; ++c)
            Q[l * {ds} + c] = P{s}[(off + jq + (l < nb ? l : nb - 1)) * {ds} + c];
{block(f"Q + l * {ds}")}
        }}
        for (int64_t l = 0; l < nb; ++l)
          for (int c = 0; c < {d}; ++c) S[({off} + c) * JCH + nc + jq + l] = R[l][c];
      }} }}"""


def gather_loop(L: Layout, gathered: dict, head: str, rows_of_chunk: str) -> str:
    """``lt_rows`` of a block-sparse kernel whose reduction outputs no index: the columns
    of consecutive intervals fill one chunk of up to JCH staged columns, so that short
    intervals (clusters of a few points) still give the pair loop whole tiles. The
    accumulators see chunk-local column numbers (no output depends on them)."""
    dims = {v.index: v.dim for v in L.orig}
    copies, columns = [], []
    for k, (off, d) in [(v.index, (L.stage_offset[v.index], v.dim)) for v in L.staged] + list(
            gathered.items()):
        if k in L.col_source:
            columns.append(_column_blocks(k, off, d, L.col_source[k], dims[L.col_source[k]]))
        else:
            copies.append(f"        {{ const T* src = P{k} + (off + jj) * {d}; "
                          f"for (int c = 0; c < {d}; ++c) S[({off} + c) * JCH + nc + jj] = src[c]; }}")
    copies = [f"      for (int64_t jj = 0; jj < take; ++jj) {{", *copies, "      }"] if copies else []
    nl = "\n"
    return f"""
// Rows [i0, i1) against the columns of the niv intervals iv[2q] <= j < iv[2q + 1], staged
// one interval after the other into chunks of up to JCH columns (a sum: the order of the
// terms does not matter). Returns 0, 1 when out of memory, 2 when *stop was set (checked
// before each chunk).{head}
  Acc* const A = accs;
  int64_t q = 0, off = iv[0];
  for (;;) {{
    if (__atomic_load_n(stop, __ATOMIC_RELAXED)) return 2;
    int64_t nc = 0;
    while (q < niv && nc < JCH) {{
      const int64_t e = iv[2 * q + 1];
      if (off >= e) {{ if (++q < niv) off = iv[2 * q]; continue; }}
      const int64_t take = (e - off < JCH - nc) ? e - off : JCH - nc;
{nl.join(copies + columns)}
      nc += take;
      off += take;
    }}
    if (nc == 0) break;
    const int64_t c0 = 0, c1 = nc;
{rows_of_chunk}
  }}
  return 0;
}}
"""
