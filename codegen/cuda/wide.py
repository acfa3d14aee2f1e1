"""The wide-sum CUDA kernel: ``K @ V`` and other sums of wide weighted j-vectors.

A formula ``Σ_t coef_t s_t(i, j) B_t(j)`` (:mod:`lazytensor.codegen.linearize`) of
dimension F is summed by ``G`` threads per row, each owning a slice of at most
``WIDE_SLICE`` output components: per pair each evaluates the narrow weights and adds
``coef * weight * B_j[...]`` for its slice, B_j read from the staged j-tile; a float
partial per tile, one TA add per tile and component. Split-j partials are merged by one
thread per (row, component). Softmax-weighted sums (attention) and weighted log-sum-exps
with a wide weight work the same way, each thread of a row also keeping the row's max.
"""

from __future__ import annotations

from .. import reductions
from ..linearize import column_source
from .skeleton import (
    THREADS,
    WIDE_SLICE,
    kernel_entry,
    row_registers,
    stage_tile,
    tile_loop,
    tile_rows,
)


def wide_group(F: int) -> int:
    """Threads per row of a wide sum: a power of two, each with <= WIDE_SLICE outputs."""
    g = 1
    while g * WIDE_SLICE < F and g < 32:
        g *= 2
    return g


def _staging(lin, specs, dtype):
    """The j-tile, the narrow formula's arguments, and the code that sets ``w`` to output
    component ``C0 + lo + e`` of the formula for pair jj (weights ``o``)."""
    tj = tile_rows(specs, dtype)
    staged = tj > 0
    decls, loads, args = row_registers(specs)
    tile_off, copies = stage_tile(specs, tj)

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
    terms = ["T w = 0;"]
    for q, off_q in lin.direct:
        terms.append(f"if (C0 + lo + e == {off_q}) w += o[{q}];")
    for t in lin.col_terms:
        var, start, ld = column_source(t.factor)
        coef = "" if t.coef == 1.0 else f"(T){float.hex(t.coef)} * "
        terms.append(
            f"if (C0 + lo + e >= {t.offset} && C0 + lo + e < {t.offset + t.dim}) "
            f"w += {coef}o[{t.weight}] * ({row_of(var, ld)})[{start} + C0 + lo + e - {t.offset}];")
    return {"tjc": tj if staged else 256, "staged": staged, "decls": decls, "loads": loads,
            "copies": copies, "call": call, "terms": terms}


def _frame(name, st, narrow_dim, G, EC, C0, state, pair, flush, finish, merge,
           narrow_code, ranged) -> str:
    """``<name>_reduce`` of a wide sum: ``state``, ``pair`` (each pair's own statements),
    ``flush`` (end of a tile) and ``finish`` (the row's outputs) are the reduction's, the
    rest is shared; ``merge``: the merge kernel."""
    nl = "\n    "
    loop_open, loop_close = tile_loop("TJC", ranged)
    terms = "\n          ".join(st["terms"])
    entry = kernel_entry(name, 1, st["decls"], st["loads"], rows="blockDim.x / G",
                         row="threadIdx.x / G", before=("T* tile = (T*)lt_smem;", "(void)tile;"),
                         after=("const int lo = (threadIdx.x % G) * EC;  // this thread's first "
                                "component (after C0)",))
    return f"""{narrow_code}
static const int TJC = {st["tjc"]};  // j-rows per tile
static const int G = {G};  // threads per row
static const int EC = {EC};  // output components per thread
static const int C0 = {C0};  // the first output component the slices cover

{entry}  {state}
  {loop_open}
    {"__syncthreads();  // the previous tile is read" if st["staged"] else ""}
    {nl.join(st["copies"])}
    {"__syncthreads();" if st["staged"] else ""}
    if (active) {{
      for (int jj = 0; jj < nj; ++jj) {{
        T o[{narrow_dim}];
        lt_formula({", ".join(st["call"])}, o);
        {pair}
#pragma unroll
        for (int e = 0; e < EC; ++e) {{
          {terms}
          ACCUMULATE(e, w);
        }}
      }}
      {flush}
    }}
  {loop_close}
  if (!active) return;
  const int64_t row = k.b * a.N + i;
  {finish}
}}
{merge}"""


def wide_kernel(r, lin, formula, specs, opts, name, ranged: bool = False) -> str:
    """``Σ_j F_ij`` with F wide (``K @ V``): each thread sums its slice of components,
    a float partial per tile added to the TA totals once per tile (``r``: the renderer)."""
    F = formula.dim
    G = wide_group(F)
    EC = -(-F // G)
    st = _staging(lin, specs, r.dtype)
    state = ("TA s[EC]; T p[EC];\n#pragma unroll\n  for (int e = 0; e < EC; ++e) "
             "{ s[e] = 0; p[e] = 0; }\n#define ACCUMULATE(e, w) p[e] += w")
    flush = ("#pragma unroll\n      for (int e = 0; e < EC; ++e) { s[e] += (TA)p[e]; "
             "p[e] = 0; }")
    finish = f"""#pragma unroll
  for (int e = 0; e < EC; ++e) {{
    if (lo + e >= {F}) break;
    if (a.nJC == 1) ((T*)a.outs[0])[row * {F} + lo + e] = (T)s[e];
    else {{ Acc* acc = a.part + k.jc * (a.B * a.N) + row; acc->s[lo + e] = s[e]; acc->c[lo + e] = 0; }}
  }}
#undef ACCUMULATE"""
    merge = f"""
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
    narrow_code = r.formula(lin.narrow, list(specs))
    return _frame(name, st, lin.narrow.dim, G, EC, 0, state, "", flush, finish, merge,
                  narrow_code, ranged)


def wide_softmax_kernel(r, lin, formula, specs, reduction, name,
                        ranged: bool = False) -> str:
    """Softmax-weighted sums (attention) and weighted log-sum-exps with a wide weight: the
    threads of a row all follow the row's max and ``Σ exp(f - max)`` (the same arithmetic,
    so the same values), each its slice of the weighted sums; one exp per pair."""
    W = formula.dim - 1
    G = wide_group(W)
    EC = -(-W // G)
    softmax = reductions.get(reduction).total_sum
    f_comp = next(q for q, off in lin.direct if off == 0)
    st = _staging(lin, specs, r.dtype)
    pair = f"""const T x = o[{f_comp}];
        if (x == -(T)INFINITY) continue;
        const bool up = x > pm;
        const T ex = x == pm ? (T)1 : exp(-fabs(x - pm));
        sc = up ? ex : (T)1;
        et = up ? (T)1 : ex;
        p0 = p0 * sc + et;
        pm = up || x != x ? x : pm;"""
    narrow_code = r.formula(lin.narrow, list(specs))
    return _frame(name, st, lin.narrow.dim, G, EC, 1, _SOFTMAX_STATE, pair, _SOFTMAX_FLUSH,
                  _softmax_finish(W, softmax), _softmax_merge(name, W, softmax), narrow_code,
                  ranged)


# The row's running max m and Σ exp(f - m) (s0), and the slice's weighted sums s, in TA;
# per tile the same in T (pm, p0, ps), rescaled by sc when the max grows.
_SOFTMAX_STATE = """TA m = -(TA)INFINITY, s0 = 0; TA s[EC];
  T pm = -(T)INFINITY, p0 = 0, sc = 1, et = 0; T ps[EC];
#pragma unroll
  for (int e = 0; e < EC; ++e) { s[e] = 0; ps[e] = 0; }
#define ACCUMULATE(e, w) ps[e] = ps[e] * sc + et * (w)"""

# The tile's partial joins the totals under their common max.
_SOFTMAX_FLUSH = """if (pm != -(T)INFINITY || pm != pm) {
        TA f = 1, g = 1;  // scales of the totals and of the tile's partial
        if (pm != pm) { m = pm; f = pm; }
        else if ((TA)pm > m) { f = exp(m - (TA)pm); m = pm; }
        else if ((TA)pm < m) g = exp((TA)pm - m);
        s0 = s0 * f + (TA)p0 * g;
#pragma unroll
        for (int e = 0; e < EC; ++e) { s[e] = s[e] * f + (TA)ps[e] * g; ps[e] = 0; }
        pm = -(T)INFINITY; p0 = 0;
      }"""


def _softmax_finish(W: int, softmax: bool) -> str:
    """A row's outputs (the weighted sums over Σ exp, and the lse, or the weighted lse),
    or its partial accumulator (split-j)."""
    if softmax:
        write = f"((T*)a.outs[0])[row * {W} + lo + e] = (T)(s[e] / s0);"
        write_lse = "if (lo == 0) ((T*)a.outs[1])[row] = (T)(m + log(s0));"
    else:
        write = f"((T*)a.outs[0])[row * {W} + lo + e] = (T)(m + log(s[e]));"
        write_lse = ""
    base = 1 if softmax else 0
    return f"""if (a.nJC == 1) {{
#pragma unroll
    for (int e = 0; e < EC; ++e) if (lo + e < {W}) {write}
    {write_lse}
  }} else {{
    Acc* acc = a.part + k.jc * (a.B * a.N) + row;
#pragma unroll
    for (int e = 0; e < EC; ++e) if (lo + e < {W}) acc->s[{base} + lo + e] = s[e];
    if (lo == 0) {{ acc->m = m; {"acc->s[0] = s0;" if softmax else ""} }}
  }}
#undef ACCUMULATE"""


def _softmax_merge(name: str, W: int, softmax: bool) -> str:
    """The merge kernel: one thread per (row, weight component), the chunks' partials
    under their common max."""
    base = 1 if softmax else 0
    total = "s0" if softmax else "t"
    merge_write = (f"((T*)a.outs[0])[r * {W} + c] = (T)(t / s0);\n"
                   "  if (c == 0) ((T*)a.outs[1])[r] = (T)(m + log(s0));" if softmax else
                   f"((T*)a.outs[0])[r * {W} + c] = (T)(m + log(t));")
    return f"""
// one thread per (row, weight component): the chunks' partials under their common max
extern "C" __global__ void __launch_bounds__({THREADS}, 1) {name}_merge(const LtArgs a) {{
  const int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t R = a.B * a.N;
  if (q >= R * {W}) return;
  const int64_t r = q / {W};
  const int c = (int)(q % {W});
  TA m = -(TA)INFINITY;
  for (int64_t ch = 0; ch < a.nJC; ++ch) {{
    const TA mc = a.part[ch * R + r].m;
    m = (mc != mc || mc > m) ? mc : m;
  }}
  TA t = 0, s0 = 0;
  for (int64_t ch = 0; ch < a.nJC; ++ch) {{
    const Acc& p = a.part[ch * R + r];
    const TA f = p.m == m ? (TA)1 : exp(p.m - m);
    t += p.s[{base} + c] * f;
    {"s0 += p.s[0] * f;" if softmax else ""}
  }}
  (void){total};
  {merge_write}
}}
"""


__all__ = ["wide_group", "wide_kernel", "wide_softmax_kernel"]
