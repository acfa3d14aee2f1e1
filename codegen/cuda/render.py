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

``LtArgs`` is passed by value (one kernel parameter, all fields 8 bytes wide, laid out
by :func:`args_fields`): ``vars`` (device pointers, canonical contiguous layout as for
``lt_run``), ``outs``, ``part``, ``vbs[v * MAX_BATCH_DIMS + k]`` (element stride of
variable v along batch dim k, 0 where broadcast), ``bshape``, then N, M, B, nbd, nJC, JC.
The global ``<name>_acc`` has the size of ``Acc`` (read with ``cuModuleGetGlobal``).


>>> from lazytensor.codegen import ir, ops
>>> from lazytensor.codegen.render_c import VarSpec
>>> x, y = ir.var(0, 3, "i"), ir.var(1, 3, "j")
>>> src = render_cuda_kernel(ops.apply("sum", ops.apply("mul", x, y)),
...                          [VarSpec(0, 3, "i"), VarSpec(1, 3, "j")], "sum", {}, "float32")
>>> "lt_reduce" in src and "lt_merge" in src
True
"""

from __future__ import annotations

from ..render_c import VarSpec, render_shared

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
            ("nJC", 1), ("JC", 1)]


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


def kernel_layout(formula, var_specs, reduction: str, opts: dict, dtype: str) -> dict:
    """How the runtime launches the kernel: at most ``threads`` per block, dynamic shared
    memory ``smem_fixed + smem_per_thread * threads`` bytes, j in tiles of ``tile``."""
    tj = tile_rows(sorted(var_specs, key=lambda v: v.index), dtype)
    return {"threads": THREADS, "smem_fixed": 0, "smem_per_thread": 0, "tile": tj or 256}


def _n_outputs(formula, reduction, opts) -> int:
    from .. import reductions

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
}};
static_assert(sizeof(LtArgs) == {words} * 8, "LtArgs layout");

// What one block works on: batch b, rows [i0, i0 + rows), columns [jb, je).
struct LtBlock {{
  int64_t b, i0, jb, je, jc;
  const T* base[NVP];
}};

LT_HD LT_INLINE LtBlock lt_block(const LtArgs& a, int64_t bid, int64_t rows) {{
  LtBlock k;
  const int64_t nIB = (a.N + rows - 1) / rows;
  k.jc = bid % a.nJC;
  int64_t q = bid / a.nJC;
  k.i0 = (q % nIB) * rows;
  k.b = q / nIB;
  k.jb = k.jc * a.JC;
  k.je = (k.jb + a.JC < a.M) ? k.jb + a.JC : a.M;
  int64_t off[NVP];
  for (int v = 0; v < NVP; ++v) off[v] = 0;
  q = k.b;
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
  const bool active = i < a.N;
  LtRow r;
  if (active) lt_row_load(r, k, i);
  Acc acc;
  acc.init();
  for (int64_t j0 = k.jb; j0 < k.je; j0 += TJC) {{
    const int nj = (int)((k.je - j0) < TJC ? (k.je - j0) : TJC);
    if (STAGED) {{
      lt_tile_load(tile, k, j0, nj, threadIdx.x, blockDim.x);
      __syncthreads();
    }}
    if (active) lt_tile_push(acc, r, k, tile, j0, nj);
    if (STAGED) __syncthreads();
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


__all__ = [
    "MAX_BATCH_DIMS",
    "THREADS",
    "VarSpec",
    "args_fields",
    "kernel_layout",
    "render_cuda_kernel",
    "tile_rows",
]
