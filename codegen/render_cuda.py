"""CUDA emission: the skeleton around the shared formula and ``Acc`` (see render_c.py).

One ``.cu`` per kernel holds, in ``namespace <name>``, what :func:`render_shared` emits
(``lt_formula``, ``struct Acc``) and two ``extern "C"`` kernels:

``<name>_reduce(LtArgs a)``
    One thread per row i, ``blockDim.x`` rows per block. The block walks its range of
    j in tiles of ``TJC`` rows; each tile of every j-variable is a contiguous run of
    global memory, copied as given (row-major) into shared memory by the whole block,
    so the copy is coalesced and the reads that follow are warp-wide broadcasts. Each
    thread pushes the tile's terms into its own ``Acc``. Block ``blockIdx.x`` covers
    (batch b, i-block, j-chunk jc), flattened as ``(b * nIB + ib) * nJC + jc``.
    With ``nJC == 1`` (the 1D scheme) a thread writes its row's outputs. With
    ``nJC > 1`` (the split-j scheme, for small N) it stores its partial ``Acc`` in
    ``part[jc * B * N + row]``, and ``<name>_merge`` (one thread per row) folds the
    ``nJC`` partials with ``Acc::merge`` and writes the outputs.
    Block-sparse calls (``npieces > 0``, see :mod:`lazytensor.ranges`): block ``bid``
    runs piece ``bid % npieces`` of batch element ``bid / npieces``; a piece is four
    int64 ``(i0, i1, s0, s1)``: rows ``[i0, i1)`` (at most ``blockDim.x``) reduce over
    the intervals ``ivs[2s] <= j < ivs[2s + 1]``, s in ``[s0, s1)``, in that order,
    each walked in tiles as above (1D scheme only).

``LtArgs`` is passed by value (one kernel parameter, all fields 8 bytes wide, laid out
by :func:`args_fields`): ``vars`` (device pointers, canonical contiguous layout as for
``lt_run``), ``outs``, ``part``, ``vbs[v * MAX_BATCH_DIMS + k]`` (element stride of
variable v along batch dim k, 0 where broadcast), ``bshape``, then N, M, B, nbd, nJC, JC, then ``pieces``, ``ivs`` (device pointers) and
``npieces`` (0: the full product).
The global ``<name>_acc`` has the size of ``Acc`` (read with ``cuModuleGetGlobal``).

The block-level phases (decode a block, load a row, copy a tile, push a tile, finish,
merge a row) are ``LT_HD`` functions, so :func:`render_cuda_emulator` can run the same
skeleton on the host, thread by thread, to test it without a GPU.

>>> from lazytensor.codegen import ir, ops
>>> from lazytensor.codegen.render_c import VarSpec
>>> x, y = ir.var(0, 3, "i"), ir.var(1, 3, "j")
>>> src = render_cuda_kernel(ops.apply("sum", ops.apply("mul", x, y)),
...                          [VarSpec(0, 3, "i"), VarSpec(1, 3, "j")], "sum", {}, "float32")
>>> "lt_reduce" in src and "lt_merge" in src
True
"""

from __future__ import annotations

from .render_c import VarSpec, render_shared

MAX_BATCH_DIMS = 8  # batch dimensions a kernel takes, after merging compatible ones
THREADS = 256  # threads per block (rows per block), the __launch_bounds__
LOCAL_DIM = 16  # i-variables up to this dimension are copied to registers
_TILE_BYTES = 16384  # shared memory per block for j-tiles
_MAX_ROW_BYTES = 4096  # above this (bytes of one j-row), j-data is read from global memory
_HEADER = "#include <math.h>\n#include <stdint.h>\n#include <stdlib.h>\n#include <string.h>\n"


def args_fields(n_vars: int, n_outs: int) -> list[tuple[str, int]]:
    """``LtArgs``'s fields in order, as (name, number of 8-byte words)."""
    nv = max(1, n_vars)
    return [("vars", nv), ("outs", n_outs), ("part", 1), ("vbs", nv * MAX_BATCH_DIMS),
            ("bshape", MAX_BATCH_DIMS), ("N", 1), ("M", 1), ("B", 1), ("nbd", 1),
            ("nJC", 1), ("JC", 1), ("pieces", 1), ("ivs", 1), ("npieces", 1)]


def tile_rows(var_specs, dtype: str) -> int:
    """Rows of a j-tile in shared memory; 0 when j-data stays in global memory."""
    size = 4 if dtype == "float32" else 8
    row = sum(v.dim for v in var_specs if v.cat == "j") * size
    if row == 0 or row > _MAX_ROW_BYTES:
        return 0
    rows = 256
    while rows > 1 and rows * row > _TILE_BYTES:
        rows //= 2
    return rows


def _n_outputs(formula, reduction, opts) -> int:
    from . import reductions

    return len(reductions.get(reduction).outputs(formula.dim, opts))


def render_cuda_kernel(formula, var_specs, reduction: str, opts: dict, dtype: str,
                       name: str = "lt") -> str:
    """Complete CUDA source of ``<name>_reduce`` and ``<name>_merge`` (module docstring).

    Sources rendered with distinct names can be concatenated into one ``.cu``.
    """
    specs = sorted(var_specs, key=lambda v: v.index)
    nvp = max([v.index + 1 for v in specs] + [1])
    n_outs = _n_outputs(formula, reduction, opts)
    words = sum(n for _, n in args_fields(nvp, n_outs))
    tj = tile_rows(specs, dtype)
    staged = tj > 0
    tjc = tj if staged else 256
    tile_off, off = {}, 0
    for v in specs:
        if v.cat == "j":
            tile_off[v.index] = off
            off += tj * v.dim
    tile_len = max(off, 1)
    shared = render_shared(formula, list(var_specs), reduction, opts, dtype)

    row_fields, row_loads, call_args, tile_copies = [], [], [], []
    for v in specs:
        k = v.index
        if v.cat == "i" and v.dim <= LOCAL_DIM:
            row_fields.append(f"T x{k}[{v.dim}];")
            row_loads.append(f"for (int c = 0; c < {v.dim}; ++c) r.x{k}[c] = k.base[{k}][i * {v.dim} + c];")
            call_args.append(f"r.x{k}")
        elif v.cat == "i":
            row_fields.append(f"const T* x{k};")
            row_loads.append(f"r.x{k} = k.base[{k}] + i * {v.dim};")
            call_args.append(f"r.x{k}")
        elif v.cat == "j" and staged:
            tile_copies.append(
                f"for (int64_t t = tid; t < (int64_t)nj * {v.dim}; t += nthreads) "
                f"tile[{tile_off[k]} + t] = k.base[{k}][j0 * {v.dim} + t];")
            call_args.append(f"tile + {tile_off[k]} + jj * {v.dim}")
        elif v.cat == "j":
            call_args.append(f"k.base[{k}] + (j0 + jj) * {v.dim}")
        else:
            call_args.append(f"k.base[{k}]")
    if not row_fields:
        row_fields.append("char unused;")
    nl = "\n  "
    offsets = "\n".join(
        f"      off[{v}] += idx * a.vbs[{v} * MAX_BD + d];" for v in range(nvp))
    skeleton = f"""
// ------------------------------------------------------------------ CUDA skeleton
static const int MAX_BD = {MAX_BATCH_DIMS};
static const int NVP = {nvp};
static const int TJC = {tjc};  // j-rows per tile
static const int TILE_LEN = {tile_len};  // elements of the shared j-tile
static const bool STAGED = {"true" if staged else "false"};

// All fields are 8 bytes wide: the host packs them as an array of {words} words.
struct LtArgs {{
  const T* vars[NVP];
  void* outs[{n_outs}];
  Acc* part;
  int64_t vbs[NVP * MAX_BD];
  int64_t bshape[MAX_BD];
  int64_t N, M, B, nbd, nJC, JC;
  const int64_t* pieces;  // block-sparse calls: (i0, i1, s0, s1) per piece
  const int64_t* ivs;  // their intervals [start, end)
  int64_t npieces;  // 0: the full product
}};
static_assert(sizeof(LtArgs) == {words} * 8, "LtArgs layout");

// What one block works on: batch b, rows [i0, i1), columns [jb, je) (full product) or
// the niv intervals at iv (block-sparse).
struct LtBlock {{
  int64_t b, i0, i1, jb, je, jc, niv;
  const int64_t* iv;
  const T* base[NVP];
}};

LT_HD LT_INLINE LtBlock lt_block(const LtArgs& a, int64_t bid, int64_t rows) {{
  LtBlock k;
  int64_t q;
  if (a.npieces > 0) {{
    const int64_t* p = a.pieces + 4 * (bid % a.npieces);
    k.b = q = bid / a.npieces;
    k.i0 = p[0]; k.i1 = p[1];
    k.iv = a.ivs + 2 * p[2]; k.niv = p[3] - p[2];
    k.jc = 0; k.jb = 0; k.je = 0;
  }} else {{
    const int64_t nIB = (a.N + rows - 1) / rows;
    k.jc = bid % a.nJC;
    q = bid / a.nJC;
    k.i0 = (q % nIB) * rows;
    k.i1 = (k.i0 + rows < a.N) ? k.i0 + rows : a.N;
    k.b = q = q / nIB;
    k.jb = k.jc * a.JC;
    k.je = (k.jb + a.JC < a.M) ? k.jb + a.JC : a.M;
    k.iv = 0; k.niv = 1;
  }}
  int64_t off[NVP];
  for (int v = 0; v < NVP; ++v) off[v] = 0;
#ifdef __CUDACC__
#pragma unroll
#endif
  for (int d = MAX_BD - 1; d >= 0; --d) {{
    if (d < a.nbd) {{
      const int64_t idx = q % a.bshape[d];
      q /= a.bshape[d];
{offsets}
    }}
  }}
  for (int v = 0; v < NVP; ++v) k.base[v] = a.vars[v] + off[v];
  return k;
}}

// The s-th range of columns of block k.
LT_HD LT_INLINE void lt_interval(const LtBlock& k, int64_t s, int64_t& jb, int64_t& je) {{
  if (k.iv) {{ jb = k.iv[2 * s]; je = k.iv[2 * s + 1]; }}
  else {{ jb = k.jb; je = k.je; }}
}}

// A thread's row: small i-variables in registers, large ones by pointer.
struct LtRow {{
  {nl.join(row_fields)}
}};

LT_HD LT_INLINE void lt_row_load(LtRow& r, const LtBlock& k, int64_t i) {{
  {nl.join(row_loads)}
}}

// The block copies rows [j0, j0 + nj) of each j-variable; thread tid of nthreads.
LT_HD LT_INLINE void lt_tile_load(T* tile, const LtBlock& k, int64_t j0, int nj, int tid,
                                  int nthreads) {{
  {nl.join(tile_copies)}
}}

LT_HD LT_INLINE void lt_tile_push(Acc& acc, const LtRow& r, const LtBlock& k, const T* tile,
                                  int64_t j0, int nj) {{
  for (int jj = 0; jj < nj; ++jj) {{
    T o[{formula.dim}];
    lt_formula({", ".join(call_args)}, o);
    acc.push(o, j0 + jj);
  }}
}}

LT_HD LT_INLINE void lt_finish(const LtArgs& a, const LtBlock& k, int64_t i, const Acc& acc) {{
  const int64_t row = k.b * a.N + i;
  if (a.nJC == 1) acc.write(a.outs, row);
  else a.part[k.jc * (a.B * a.N) + row] = acc;
}}

LT_HD LT_INLINE void lt_merge_row(const LtArgs& a, int64_t r) {{
  const int64_t R = a.B * a.N;
  Acc acc = a.part[r];
  for (int64_t c = 1; c < a.nJC; ++c) acc.merge(a.part[c * R + r]);
  acc.write(a.outs, r);
}}

#ifdef __CUDACC__
extern "C" {{ __device__ Acc {name}_acc; }}  // sizeof(Acc), read by the runtime

extern "C" __global__ void __launch_bounds__({THREADS}) {name}_reduce(const LtArgs a) {{
  __shared__ T tile[TILE_LEN];
  const LtBlock k = lt_block(a, blockIdx.x, blockDim.x);
  const int64_t i = k.i0 + threadIdx.x;
  const bool active = i < k.i1;
  LtRow r;
  if (active) lt_row_load(r, k, i);
  Acc acc;
  acc.init();
  for (int64_t s = 0; s < k.niv; ++s) {{
    int64_t jb, je;
    lt_interval(k, s, jb, je);
    for (int64_t j0 = jb; j0 < je; j0 += TJC) {{
      const int nj = (int)((je - j0) < TJC ? (je - j0) : TJC);
      if (STAGED) {{
        lt_tile_load(tile, k, j0, nj, threadIdx.x, blockDim.x);
        __syncthreads();
      }}
      if (active) lt_tile_push(acc, r, k, tile, j0, nj);
      if (STAGED) __syncthreads();
    }}
  }}
  if (active) lt_finish(a, k, i, acc);
}}

extern "C" __global__ void __launch_bounds__({THREADS}) {name}_merge(const LtArgs a) {{
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r < a.B * a.N) lt_merge_row(a, r);
}}
#endif
"""
    return (f"{_HEADER}// kernel {name}: {reduction}, {dtype}\nnamespace {name} {{\n"
            f"{shared}{skeleton}}}  // namespace {name}\n")


def render_cuda_emulator(name: str = "lt") -> str:
    """Host code running ``<name>``'s kernels block by block, thread by thread (tests only).

    Appended to :func:`render_cuda_kernel`'s source and compiled with a C++ compiler, it
    exports ``<name>_emulate_reduce(args, grid, threads)``,
    ``<name>_emulate_merge(args, grid, threads)`` and ``<name>_acc_bytes()``: the same
    phases as the CUDA kernels, with each ``__syncthreads`` a loop over all threads.
    """
    return f"""
#ifndef __CUDACC__
namespace {name} {{
extern "C" int64_t {name}_acc_bytes() {{ return (int64_t)sizeof(Acc); }}

extern "C" int {name}_emulate_reduce(const void* args, int64_t grid, int threads) {{
  const LtArgs& a = *(const LtArgs*)args;
  T* tile = (T*)malloc(sizeof(T) * TILE_LEN);
  LtRow* rows = (LtRow*)malloc(sizeof(LtRow) * threads);
  Acc* accs = (Acc*)malloc(sizeof(Acc) * threads);
  for (int64_t bid = 0; bid < grid; ++bid) {{
    const LtBlock k = lt_block(a, bid, threads);
    for (int t = 0; t < threads; ++t) {{
      if (k.i0 + t < k.i1) lt_row_load(rows[t], k, k.i0 + t);
      accs[t].init();
    }}
    for (int64_t s = 0; s < k.niv; ++s) {{
      int64_t jb, je;
      lt_interval(k, s, jb, je);
      for (int64_t j0 = jb; j0 < je; j0 += TJC) {{
        const int nj = (int)((je - j0) < TJC ? (je - j0) : TJC);
        if (STAGED) {{
          for (int t = 0; t < threads; ++t) lt_tile_load(tile, k, j0, nj, t, threads);
        }}
        for (int t = 0; t < threads; ++t)
          if (k.i0 + t < k.i1) lt_tile_push(accs[t], rows[t], k, tile, j0, nj);
      }}
    }}
    for (int t = 0; t < threads; ++t)
      if (k.i0 + t < k.i1) lt_finish(a, k, k.i0 + t, accs[t]);
  }}
  free(tile); free(rows); free(accs);
  return 0;
}}

extern "C" int {name}_emulate_merge(const void* args, int64_t grid, int threads) {{
  const LtArgs& a = *(const LtArgs*)args;
  for (int64_t r = 0; r < grid * threads; ++r)
    if (r < a.B * a.N) lt_merge_row(a, r);
  return 0;
}}
}}  // namespace {name}
#endif
"""


__all__ = [
    "MAX_BATCH_DIMS",
    "THREADS",
    "VarSpec",
    "args_fields",
    "render_cuda_emulator",
    "render_cuda_kernel",
    "tile_rows",
]
