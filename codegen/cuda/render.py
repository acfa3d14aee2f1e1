"""CUDA emission: the kernel skeletons around the shared formula code (see render_c.py).

One ``.cu`` per kernel holds, in ``namespace <name>``, the per-pair formula
(``lt_formula``, the same emission as the CPU kernel's), a CUDA ``Acc``
(:mod:`.accumulators`) and two ``extern "C"`` kernels:

``<name>_reduce(LtArgs a)``
    One thread per row i, ``blockDim.x`` rows per block; block ``blockIdx.x`` covers
    (batch b, i-block, j-chunk jc), flattened as ``(b * nIB + ib) * nJC + jc``. With
    ``nJC == 1`` (the 1D scheme) a thread writes its row's outputs; with ``nJC > 1`` (the
    split-j scheme, for small N) it stores its flushed ``Acc`` in ``part[jc * B * N +
    row]`` and ``<name>_merge`` (one thread per row) folds the partials.

    *Direct* kernels (every node narrow, or no vector sum to chunk) walk j in tiles of
    ``TJC`` rows copied, coalesced, into dynamic shared memory (``lt_smem``), and read by
    every thread as broadcasts; i-variables up to ``LOCAL_DIM`` live in registers.
    *Chunked* kernels (:mod:`.chunks`: vector sums of large dimension) walk j in register
    tiles of ``R`` rows; for each vector sum, the vector dimension goes by in chunks of
    ``C``: the chunk of the block's rows (transposed, padded: conflict-free) and of the R
    j-rows are staged in shared memory, and each thread adds the sum's terms for its row
    and the R rows into R registers. Then the narrow rest of the formula runs per pair.

``LtArgs`` is passed by value (one kernel parameter, all fields 8 bytes wide, laid out by
:func:`args_fields`): ``vars`` (device pointers, canonical contiguous layout), ``outs``,
``part``, ``vbs[v * MAX_BATCH_DIMS + k]`` (element stride of variable v along batch dim k,
0 where broadcast), ``bshape``, then N, M, B, nbd, nJC, JC. The global ``<name>_acc`` has
the size of ``Acc``. :func:`kernel_layout` tells the runtime the block size limit and the
dynamic shared memory, as a function of the block size.

>>> from lazytensor.codegen import ir, ops
>>> from lazytensor.codegen.render_c import VarSpec
>>> x, y = ir.var(0, 3, "i"), ir.var(1, 3, "j")
>>> src = render_cuda_kernel(ops.apply("sum", ops.apply("mul", x, y)),
...                          [VarSpec(0, 3, "i"), VarSpec(1, 3, "j")], "sum", {}, "float32")
>>> "lt_reduce" in src and "lt_merge" in src
True
"""

from __future__ import annotations

from .. import ir, reductions
from ..render_c import VarSpec, _prelude, render_formula, render_function
from ..render_wide import wide_sum
from .accumulators import acc_code
from .chunks import ChunkPlan, plan_chunks

MAX_BATCH_DIMS = 8  # batch dimensions a kernel takes, after merging compatible ones
THREADS = 256  # largest block (rows per block), the __launch_bounds__
LOCAL_DIM = 16  # i-variables up to this dimension are copied to registers
TILE_BYTES = 16384  # shared memory per block for the j-tiles of direct kernels
_MAX_ROW_BYTES = 4096  # above this (bytes of one j-row), j-data is read from global memory
CHUNK_ROWS = 32  # R: j-rows per register tile of chunked kernels
WIDE_SLICE = 16  # output components per thread of a wide sum
_CHUNK_BYTES = 128  # C * sizeof(T): a chunk of the vector dimension (32 floats, 16 doubles)
_HEADER = ("#include <math.h>\n#include <stdint.h>\n#include <stdlib.h>\n#include <string.h>\n"
           "extern __shared__ __align__(16) unsigned char lt_smem[];  // dynamic shared memory\n")


def args_fields(n_vars: int, n_outs: int) -> list[tuple[str, int]]:
    """``LtArgs``'s fields in order, as (name, number of 8-byte words)."""
    nv = max(1, n_vars)
    return [("vars", nv), ("outs", n_outs), ("part", 1), ("vbs", nv * MAX_BATCH_DIMS),
            ("bshape", MAX_BATCH_DIMS), ("N", 1), ("M", 1), ("B", 1), ("nbd", 1),
            ("nJC", 1), ("JC", 1)]


def _size(dtype: str) -> int:
    return 4 if dtype == "float32" else 8


def tile_rows(var_specs, dtype: str) -> int:
    """Rows of a direct kernel's j-tile in shared memory; 0 when j-data stays in global
    memory (rows too wide, or no j-variable)."""
    row = sum(v.dim for v in var_specs if v.cat == "j") * _size(dtype)
    if row == 0 or row > _MAX_ROW_BYTES:
        return 0
    rows = 256
    while rows > 1 and rows * row > TILE_BYTES:
        rows //= 2
    return rows


def _chunk_plan(formula, var_specs) -> ChunkPlan | None:
    n_vars = max([v.index + 1 for v in var_specs] + [0])
    return plan_chunks(formula, n_vars)


def _wide_plan(formula, reduction: str, opts: dict):
    """The weighted-sum form of a wide Sum (``K @ V``), or None."""
    if reduction != "sum" or opts.get("sum_scheme") == "kahan_scheme":
        return None
    return wide_sum(formula, reduction)


def _wide_group(F: int) -> int:
    """Threads per row of a wide sum: a power of two, each with <= WIDE_SLICE outputs."""
    g = 1
    while g * WIDE_SLICE < F and g < 32:
        g *= 2
    return g


def kernel_layout(formula, var_specs, reduction: str, opts: dict, dtype: str) -> dict:
    """How the runtime launches the kernel: at most ``threads`` per block, ``group``
    threads per row, dynamic shared memory ``smem_fixed + smem_per_thread * threads``
    bytes, j in tiles of ``tile``, ``merge_per_row`` merge threads per row (split-j)."""
    specs = sorted(var_specs, key=lambda v: v.index)
    plan = _chunk_plan(formula, specs)
    layout = {"threads": THREADS, "group": 1, "merge_per_row": 1, "smem_per_thread": 0}
    if plan is not None:
        fixed, per_thread = _chunk_smem(plan, dtype)
        return {**layout, "smem_fixed": fixed, "smem_per_thread": per_thread,
                "tile": CHUNK_ROWS, "scheme": "chunked"}
    tj = tile_rows(specs, dtype)
    fixed = tj * sum(v.dim for v in specs if v.cat == "j") * _size(dtype) if tj else 0
    if _wide_plan(formula, reduction, opts) is not None:
        return {**layout, "group": _wide_group(formula.dim), "merge_per_row": formula.dim,
                "smem_fixed": fixed, "tile": tj or 256, "scheme": "wide"}
    return {**layout, "smem_fixed": fixed, "tile": tj or 256, "scheme": "direct"}


def _n_outputs(formula, reduction, opts) -> int:
    return len(reductions.get(reduction).outputs(formula.dim, opts))


def _acc_dtype(reduction: str, opts: dict, dtype: str) -> str:
    return opts.get("dtype_acc") or ("float64" if reduction == "sum" else dtype)


def _min_blocks(formula, opts: dict, dtype: str) -> int:
    """The second __launch_bounds__ argument (always given: without it nvcc 13 caps a
    256-thread kernel at 64 registers and spills): 4 blocks of 256 threads (64 registers)
    for narrow float32 kernels whose accumulator is small, 2 in float64, else 1."""
    state = formula.dim * int(opts.get("K", 1))
    if formula.dim <= LOCAL_DIM and state <= 16:
        return 4 if dtype == "float32" else 2
    return 1


def render_cuda_kernel(formula, var_specs, reduction: str, opts: dict, dtype: str,
                       name: str = "lt") -> str:
    """Complete CUDA source of ``<name>_reduce`` and ``<name>_merge`` (module docstring).

    Sources rendered with distinct names can be concatenated into one ``.cu``.
    """
    specs = sorted(var_specs, key=lambda v: v.index)
    nvp = max([v.index + 1 for v in specs] + [1])
    n_outs = _n_outputs(formula, reduction, opts)
    plan = _chunk_plan(formula, specs)
    lin = _wide_plan(formula, reduction, opts) if plan is None else None
    shared = (_prelude(dtype, _acc_dtype(reduction, opts, dtype))
              + acc_code(reduction, formula.dim, opts) + "\n")
    common = _common(name, nvp, n_outs)
    if plan is not None:
        body = _chunked(plan, formula, specs, reduction, opts, dtype, name) + _merge(name)
    elif lin is not None:
        body = _wide(lin, formula, specs, opts, dtype, name)
    else:
        body = _direct(formula, specs, reduction, opts, dtype, name) + _merge(name)
    return (f"{_HEADER}// kernel {name}: {reduction}, {dtype}\nnamespace {name} {{\n"
            f"{shared}{common}{body}}}  // namespace {name}\n")


def _common(name: str, nvp: int, n_outs: int) -> str:
    words = sum(n for _, n in args_fields(nvp, n_outs))
    offsets = "\n".join(
        f"      off[{v}] += idx * a.vbs[{v} * MAX_BD + d];" for v in range(nvp))
    return f"""
// ------------------------------------------------------------------ CUDA skeleton
static const int MAX_BD = {MAX_BATCH_DIMS};
static const int NVP = {nvp};

// All fields are 8 bytes wide: the host packs them as an array of {words} words.
struct LtArgs {{
  const T* vars[NVP];
  void* outs[{n_outs}];
  Acc* part;
  int64_t vbs[NVP * MAX_BD];
  int64_t bshape[MAX_BD];
  int64_t N, M, B, nbd, nJC, JC;
}};
static_assert(sizeof(LtArgs) == {words} * 8, "LtArgs layout");

// What one block works on: batch b, rows [i0, i0 + rows), columns [jb, je).
struct LtBlock {{
  int64_t b, i0, jb, je, jc;
  const T* base[NVP];
}};

__device__ __forceinline__ LtBlock lt_block(const LtArgs& a, int64_t bid, int64_t rows) {{
  LtBlock k;
  const int64_t nIB = (a.N + rows - 1) / rows;
  k.jc = bid % a.nJC;
  int64_t q = bid / a.nJC;
  k.i0 = (q % nIB) * rows;
  k.b = q / nIB;
  k.jb = k.jc * a.JC;
  k.je = (k.jb + a.JC < a.M) ? k.jb + a.JC : a.M;
  int64_t off[NVP];
#pragma unroll
  for (int v = 0; v < NVP; ++v) off[v] = 0;
  q = k.b;
#pragma unroll
  for (int d = MAX_BD - 1; d >= 0; --d) {{
    if (d < a.nbd) {{
      const int64_t idx = q % a.bshape[d];
      q /= a.bshape[d];
{offsets}
    }}
  }}
#pragma unroll
  for (int v = 0; v < NVP; ++v) k.base[v] = a.vars[v] + off[v];
  return k;
}}

__device__ __forceinline__ void lt_finish(const LtArgs& a, const LtBlock& k, int64_t i,
                                          const Acc& acc) {{
  const int64_t row = k.b * a.N + i;
  if (a.nJC == 1) acc.write(a.outs, row);
  else a.part[k.jc * (a.B * a.N) + row] = acc;
}}

extern "C" {{ __device__ Acc {name}_acc; }}  // sizeof(Acc), read by the runtime
"""


def _merge(name: str) -> str:
    return f"""
extern "C" __global__ void __launch_bounds__({THREADS}, 1) {name}_merge(const LtArgs a) {{
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= a.B * a.N) return;
  const int64_t R = a.B * a.N;
  Acc acc = a.part[r];
  for (int64_t c = 1; c < a.nJC; ++c) acc.merge(a.part[c * R + r]);
  acc.write(a.outs, r);
}}
"""


def _row_registers(specs, only=None) -> tuple[list, list, dict]:
    """Declarations and loads of the narrow i-variables kept in registers, and the
    argument text of each variable index for ``lt_formula``."""
    decls, loads, args = [], [], {}
    for v in specs:
        if v.cat != "i" or (only is not None and v.index not in only):
            continue
        k = v.index
        if v.dim <= LOCAL_DIM:
            decls.append(f"T x{k}[{v.dim}];")
            loads.append(f"for (int c = 0; c < {v.dim}; ++c) x{k}[c] = k.base[{k}][i * {v.dim} + c];")
            args[k] = f"x{k}"
        else:
            decls.append(f"const T* x{k} = 0;")
            loads.append(f"x{k} = k.base[{k}] + i * {v.dim};")
            args[k] = f"x{k}"
    return decls, loads, args


def _direct(formula, specs, reduction, opts, dtype, name) -> str:
    tj = tile_rows(specs, dtype)
    staged = tj > 0
    tjc = tj if staged else 256
    decls, loads, args = _row_registers(specs)
    tile_off, off, copies = {}, 0, []
    for v in specs:
        if v.cat == "j" and staged:
            tile_off[v.index] = off
            copies.append(
                f"for (int t = threadIdx.x; t < nj * {v.dim}; t += blockDim.x) "
                f"tile[{off} + t] = k.base[{v.index}][j0 * {v.dim} + t];")
            off += tj * v.dim
    call = []
    for v in specs:
        if v.cat == "i":
            call.append(args[v.index])
        elif v.cat == "j" and staged:
            call.append(f"tile + {tile_off[v.index]} + jj * {v.dim}")
        elif v.cat == "j":
            call.append(f"k.base[{v.index}] + (j0 + jj) * {v.dim}")
        else:
            call.append(f"k.base[{v.index}]")
    nl = "\n    "
    formula_code = render_formula(formula, list(specs), dtype)
    minb = _min_blocks(formula, opts, dtype)
    return f"""{formula_code}
static const int TJC = {tjc};  // j-rows per tile

extern "C" __global__ void __launch_bounds__({THREADS}, {minb}) {name}_reduce(const LtArgs a) {{
  T* tile = (T*)lt_smem;
  (void)tile;
  const LtBlock k = lt_block(a, blockIdx.x, blockDim.x);
  const int64_t i = k.i0 + threadIdx.x;
  const bool active = i < a.N;
  {nl.join(decls)}
  if (active) {{
    {nl.join(loads)}
  }}
  Acc acc;
  acc.init();
  for (int64_t j0 = k.jb; j0 < k.je; j0 += TJC) {{
    const int nj = (int)((k.je - j0) < TJC ? (k.je - j0) : TJC);
    {"__syncthreads();  // the previous tile is read" if staged else ""}
    {nl.join(copies)}
    {"__syncthreads();" if staged else ""}
    if (active) acc.tile([&](int jj, T* o) {{ lt_formula({", ".join(call)}, o); }}, nj, j0);
  }}
  if (active) lt_finish(a, k, i, acc);
}}
"""


def _chunk_smem(plan: ChunkPlan, dtype: str) -> tuple[int, int]:
    """(fixed, per thread) bytes of a chunked kernel's shared memory: per vector sum, the
    row chunks of its i-leaves (padded by one row) and the R j-rows of its j-leaves."""
    C = _CHUNK_BYTES // _size(dtype)
    fixed = per_thread = 0
    for s in plan.sums:
        n_i = sum(1 for v in s.leaves if v.cat == "i" and v.dim > 1)
        n_j = sum(1 for v in s.leaves if v.cat == "j" and v.dim > 1)
        f = (n_i * C + n_j * CHUNK_ROWS * C) * _size(dtype)
        p = n_i * C * _size(dtype)
        fixed, per_thread = max(fixed, f), max(per_thread, p)
    return fixed, per_thread


def _chunked(plan: ChunkPlan, formula, specs, reduction, opts, dtype, name) -> str:
    C = _CHUNK_BYTES // _size(dtype)
    R = CHUNK_ROWS
    rest = plan.formula
    used = {v.index for v in ir.variables(rest)}
    decls, loads, args = _row_registers(specs, only=used)
    # the rest: the formula's variables and one scalar per vector sum
    rest_specs = [v for v in specs if v.index in used]
    rest_specs += [VarSpec(s.var.index, 1, "j") for s in plan.sums]
    pieces = [render_formula(rest, rest_specs, dtype)]
    sums_code = []
    for n, s in enumerate(plan.sums):
        term_specs = [VarSpec(p.index, 1, p.cat) for p in s.scalars]
        pieces.append(render_function(f"lt_term{n}", [s.term], term_specs, dtype))
        sums_code.append(_sum_loop(n, s, C, R))
    call = []
    for v in rest_specs:
        if any(v.index == s.var.index for s in plan.sums):
            n = next(q for q, s in enumerate(plan.sums) if s.var.index == v.index)
            call.append(f"&s{n}[r]")
        elif v.cat == "i":
            call.append(args[v.index])
        elif v.cat == "j":
            call.append(f"k.base[{v.index}] + (j0 + r) * {v.dim}")
        else:
            call.append(f"k.base[{v.index}]")
    nl = "\n  "
    return "\n".join(pieces) + f"""
static const int R = {R};  // j-rows per register tile
static const int C = {C};  // components per chunk of the vector dimension

extern "C" __global__ void __launch_bounds__({THREADS}, 1) {name}_reduce(const LtArgs a) {{
  const int nt = blockDim.x;
  const LtBlock k = lt_block(a, blockIdx.x, nt);
  const int tid = threadIdx.x;
  const int64_t i = k.i0 + tid;
  const bool active = i < a.N;
  {nl.join(decls)}
  if (active) {{
    {nl.join(loads)}
  }}
  Acc acc;
  acc.init();
  for (int64_t j0 = k.jb; j0 < k.je; j0 += R) {{
    const int nj = (int)((k.je - j0) < R ? (k.je - j0) : R);
{"".join(sums_code)}
    if (active) {{
#pragma unroll
      for (int r = 0; r < R; ++r) {{
        if (r < nj) {{
          T o[{formula.dim}];
          lt_formula({", ".join(call)}, o);
          acc.push(o, j0 + r);
        }}
      }}
      acc.flush();
    }}
  }}
  if (active) lt_finish(a, k, i, acc);
}}
"""


def _sum_loop(n: int, s, C: int, R: int) -> str:
    """The chunk loop of vector sum ``n``: stage, barrier, accumulate into ``s{n}[R]``."""
    stage, reads, args = [], [], []
    i_leaves = [v for v in s.leaves if v.cat == "i" and v.dim > 1]
    j_leaves = [v for v in s.leaves if v.cat == "j" and v.dim > 1]
    # layout: i-chunks [C][nt + 1] each, then j-chunks [R][C] each
    for q, v in enumerate(i_leaves):
        base = f"(T*)lt_smem + {q} * C * (nt + 1)"
        stage.append(
            f"      {{ T* xs = {base};\n"
            f"        for (int e = tid; e < nt * C; e += nt) {{\n"
            f"          const int t = e / C, d = e % C;\n"
            f"          const int64_t row = k.i0 + t;\n"
            f"          xs[d * (nt + 1) + t] = (row < a.N && c0 + d < {s.dim}) ? "
            f"k.base[{v.index}][row * {s.dim} + c0 + d] : (T)0;\n"
            f"        }} }}")
    for q, v in enumerate(j_leaves):
        base = f"(T*)lt_smem + {len(i_leaves)} * C * (nt + 1) + {q} * R * C"
        stage.append(
            f"      {{ T* ys = {base};\n"
            f"        for (int e = tid; e < R * C; e += nt) {{\n"
            f"          const int r = e / C, d = e % C;\n"
            f"          ys[e] = (r < nj && c0 + d < {s.dim}) ? "
            f"k.base[{v.index}][(j0 + r) * {s.dim} + c0 + d] : (T)0;\n"
            f"        }} }}")
    for v, p in zip(s.leaves, s.scalars):
        if v.cat == "i" and v.dim > 1:
            q = i_leaves.index(v)
            reads.append(f"const T a{p.index} = ((const T*)lt_smem)[{q} * C * (nt + 1) + "
                         f"d * (nt + 1) + tid];")
            args.append(f"&a{p.index}")
        elif v.cat == "j" and v.dim > 1:
            q = j_leaves.index(v)
            args.append(f"((const T*)lt_smem) + {len(i_leaves)} * C * (nt + 1) + {q} * R * C "
                        "+ r * C + d")
        elif v.dim > 1:  # a parameter vector
            args.append(f"k.base[{v.index}] + c0 + d")
        elif v.cat == "i":
            reads.append(f"const T a{p.index} = active ? k.base[{v.index}][i] : (T)0;")
            args.append(f"&a{p.index}")
        elif v.cat == "j":
            args.append(f"k.base[{v.index}] + (j0 + (r < nj ? r : 0))")
        else:
            args.append(f"k.base[{v.index}]")
    nl = "\n"
    reads_text = "\n          ".join(reads)
    return f"""    T s{n}[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s{n}[r] = 0;
    for (int c0 = 0; c0 < {s.dim}; c0 += C) {{
      __syncthreads();  // the previous chunk is read
{nl.join(stage)}
      __syncthreads();
      const int cw = {s.dim} - c0 < C ? {s.dim} - c0 : C;
      if (active) {{
        for (int d = 0; d < cw; ++d) {{
          {reads_text}
#pragma unroll
          for (int r = 0; r < R; ++r) {{
            T v;
            lt_term{n}({", ".join(args)}, &v);
            s{n}[r] += v;
          }}
        }}
      }}
    }}
"""


def _wide(lin, formula, specs, opts, dtype, name) -> str:
    """``Σ_j F_ij`` with F wide (``K @ V``): ``group`` threads share a row, each owning a
    slice of WIDE_SLICE output components; per pair each evaluates the narrow weights
    and adds ``coef * weight * B_j[...]`` for its slice, B_j read from the staged tile."""
    from ..linearize import column_source

    F = formula.dim
    G = _wide_group(F)
    EC = -(-F // G)
    tj = tile_rows(specs, dtype)
    staged = tj > 0
    tjc = tj if staged else 256
    decls, loads, args = _row_registers(specs)
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


__all__ = [
    "MAX_BATCH_DIMS",
    "THREADS",
    "VarSpec",
    "args_fields",
    "kernel_layout",
    "render_cuda_kernel",
    "tile_rows",
]
