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


def gather_loop(L: Layout, gathered: dict, head: str, rows_of_chunk: str) -> str:
    """``lt_rows`` of a block-sparse kernel whose reduction outputs no index: the columns
    of consecutive intervals fill one chunk of up to JCH staged columns, so that short
    intervals (clusters of a few points) still give the pair loop whole tiles. The
    accumulators see chunk-local column numbers (no output depends on them)."""
    dims = {v.index: v.dim for v in L.orig}
    copies = []
    for k, (off, d) in [(v.index, (L.stage_offset[v.index], v.dim)) for v in L.staged] + list(
            gathered.items()):
        if k in L.col_source:
            s = L.col_source[k]
            copies.append(f"        {{ T o[{d}]; lt_col{k}(P{s} + (off + jj) * {dims[s]}, o); "
                          f"for (int c = 0; c < {d}; ++c) S[({off} + c) * JCH + nc + jj] = o[c]; }}")
        else:
            copies.append(f"        {{ const T* src = P{k} + (off + jj) * {d}; "
                          f"for (int c = 0; c < {d}; ++c) S[({off} + c) * JCH + nc + jj] = src[c]; }}")
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
      for (int64_t jj = 0; jj < take; ++jj) {{
{nl.join(copies)}
      }}
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
