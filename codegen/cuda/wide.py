"""The wide-sum CUDA kernel: ``K @ V`` and other sums of wide weighted j-vectors.

A formula ``Σ_t coef_t s_t(i, j) B_t(j)`` (:mod:`lazytensor.codegen.linearize`) of
dimension F is summed by ``G`` threads per row, each owning a slice of at most
``WIDE_SLICE`` output components: per pair each evaluates the narrow weights and adds
``coef * weight * B_j[...]`` for its slice, B_j read from the staged j-tile; a float
partial per tile, one TA add per tile and component. Split-j partials are merged by one
thread per (row, component).
"""

from __future__ import annotations

from ..render_c import render_formula
from .skeleton import THREADS, WIDE_SLICE, row_registers, tile_rows


def wide_group(F: int) -> int:
    """Threads per row of a wide sum: a power of two, each with <= WIDE_SLICE outputs."""
    g = 1
    while g * WIDE_SLICE < F and g < 32:
        g *= 2
    return g


def wide_kernel(lin, formula, specs, opts, dtype, name) -> str:
    """``Σ_j F_ij`` with F wide (``K @ V``): ``group`` threads share a row, each owning a
    slice of WIDE_SLICE output components; per pair each evaluates the narrow weights
    and adds ``coef * weight * B_j[...]`` for its slice, B_j read from the staged tile."""
    from ..linearize import column_source

    F = formula.dim
    G = wide_group(F)
    EC = -(-F // G)
    tj = tile_rows(specs, dtype)
    staged = tj > 0
    tjc = tj if staged else 256
    decls, loads, args = row_registers(specs)
    tile_off, off, copies = {}, 0, []
    for v in specs:
        if v.cat == "j" and staged:
            tile_off[v.index] = off
            copies.append(
                f"for (int t = threadIdx.x; t < nj * {v.dim}; t += blockDim.x) "
                f"tile[{off} + t] = k.base[{v.index}][j0 * {v.dim} + t];")
            off += tj * v.dim

    def row_of(index, dim):
        if staged:
            return f"tile + {tile_off[index]} + jj * {dim}"
        return f"k.base[{index}] + (j0 + jj) * {dim}"

    call = []
    for v in specs:
        if v.cat == "i":
            call.append(args[v.index])
        elif v.cat == "j":
            call.append(row_of(v.index, v.dim))
        else:
            call.append(f"k.base[{v.index}]")
    narrow = lin.narrow
    terms = []
    for q, off_q in lin.direct:
        terms.append(f"if (lo + e == {off_q}) p[e] += o[{q}];")
    for t in lin.col_terms:
        var, start, ld = column_source(t.factor)
        coef = "" if t.coef == 1.0 else f"(T){float.hex(t.coef)} * "
        terms.append(
            f"if (lo + e >= {t.offset} && lo + e < {t.offset + t.dim}) p[e] += {coef}o[{t.weight}] * "
            f"({row_of(var, ld)})[{start} + lo + e - {t.offset}];")
    nl = "\n    "
    body = "\n          ".join(terms)
    return f"""{render_formula(narrow, list(specs), dtype)}
static const int TJC = {tjc};  // j-rows per tile
static const int G = {G};  // threads per row
static const int EC = {EC};  // output components per thread

extern "C" __global__ void __launch_bounds__({THREADS}, 1) {name}_reduce(const LtArgs a) {{
  T* tile = (T*)lt_smem;
  (void)tile;
  const LtBlock k = lt_block(a, blockIdx.x, blockDim.x / G);
  const int lo = (threadIdx.x % G) * EC;  // this thread's first output component
  const int64_t i = k.i0 + threadIdx.x / G;
  const bool active = i < a.N;
  {nl.join(decls)}
  if (active) {{
    {nl.join(loads)}
  }}
  TA s[EC]; T p[EC];
#pragma unroll
  for (int e = 0; e < EC; ++e) {{ s[e] = 0; p[e] = 0; }}
  for (int64_t j0 = k.jb; j0 < k.je; j0 += TJC) {{
    const int nj = (int)((k.je - j0) < TJC ? (k.je - j0) : TJC);
    {"__syncthreads();  // the previous tile is read" if staged else ""}
    {nl.join(copies)}
    {"__syncthreads();" if staged else ""}
    if (active) {{
      for (int jj = 0; jj < nj; ++jj) {{
        T o[{narrow.dim}];
        lt_formula({", ".join(call)}, o);
#pragma unroll
        for (int e = 0; e < EC; ++e) {{
          {body}
        }}
      }}
#pragma unroll
      for (int e = 0; e < EC; ++e) {{ s[e] += (TA)p[e]; p[e] = 0; }}
    }}
  }}
  if (!active) return;
  const int64_t row = k.b * a.N + i;
#pragma unroll
  for (int e = 0; e < EC; ++e) {{
    if (lo + e >= {F}) break;
    if (a.nJC == 1) ((T*)a.outs[0])[row * {F} + lo + e] = (T)s[e];
    else {{ Acc* acc = a.part + k.jc * (a.B * a.N) + row; acc->s[lo + e] = s[e]; acc->c[lo + e] = 0; }}
  }}
}}

// one thread per (row, component): the sum of the chunks' partials
extern "C" __global__ void __launch_bounds__({THREADS}, 1) {name}_merge(const LtArgs a) {{
  const int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t R = a.B * a.N;
  if (q >= R * {F}) return;
  const int64_t r = q / {F};
  const int c = (int)(q % {F});
  TA t = 0;
  for (int64_t ch = 0; ch < a.nJC; ++ch) t += a.part[ch * R + r].s[c];
  ((T*)a.outs[0])[r * {F} + c] = (T)t;
}}
"""



__all__ = ["wide_group", "wide_kernel"]
