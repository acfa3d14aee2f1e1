"""What every CUDA kernel of lazytensor shares: its ABI (``LtArgs``), the block decode,
the kernel's opening (:func:`kernel_entry`), the finish and merge kernels, the j-tile of
shared memory (:func:`stage_tile`), the row registers.

See :mod:`lazytensor.codegen.cuda.render` for the renderer and the kernel schemes built
on these.

>>> [name for name, _ in args_fields(2, 1)][:3]
['vars', 'outs', 'part']
"""

from __future__ import annotations

from ..render_c import acc_call

MAX_BATCH_DIMS = 8  # batch dimensions a kernel takes, after merging compatible ones
THREADS = 256  # largest block (rows per block), the __launch_bounds__
LOCAL_DIM = 16  # i-variables up to this dimension are copied to registers
TILE_BYTES = 16384  # shared memory per block for the j-tiles of direct kernels
MAX_ROW_BYTES = 4096  # above this (bytes of one j-row), j-data is read from global memory
CHUNK_ROWS = 32  # R: j-rows per register tile of chunked kernels
WIDE_SLICE = 16  # output components per thread of a wide sum
CHUNK_BYTES = 128  # C * sizeof(T): a chunk of the vector dimension (32 floats, 16 doubles)
HEADER = ("#include <math.h>\n#include <stdint.h>\n#include <stdlib.h>\n#include <string.h>\n"
           "extern __shared__ __align__(16) unsigned char lt_smem[];  // dynamic shared memory\n")


def args_fields(n_vars: int, n_outs: int) -> list[tuple[str, int]]:
    """``LtArgs``'s fields in order, as (name, number of 8-byte words)."""
    nv = max(1, n_vars)
    return [("vars", nv), ("outs", n_outs), ("part", 1), ("vbs", nv * MAX_BATCH_DIMS),
            ("bshape", MAX_BATCH_DIMS), ("N", 1), ("M", 1), ("B", 1), ("nbd", 1),
            ("nJC", 1), ("JC", 1), ("pieces", 1), ("ivs", 1), ("npieces", 1)]


def element_size(dtype: str) -> int:
    return 4 if dtype == "float32" else 8


def tile_rows(var_specs, dtype: str) -> int:
    """Rows of a direct kernel's j-tile in shared memory; 0 when j-data stays in global
    memory (rows too wide, or no j-variable)."""
    row = sum(v.dim for v in var_specs if v.cat == "j") * element_size(dtype)
    if row == 0 or row > MAX_ROW_BYTES:
        return 0
    rows = 256
    while rows > 1 and rows * row > TILE_BYTES:
        rows //= 2
    return rows


def min_blocks(formula, opts: dict, dtype: str) -> int:
    """The second __launch_bounds__ argument (always given: without it nvcc 13 caps a
    256-thread kernel at 64 registers and spills): 4 blocks of 256 threads (64 registers)
    for narrow float32 kernels whose accumulator is small, 2 in float64, else 1."""
    state = formula.dim * int(opts.get("K", 1))
    if formula.dim <= LOCAL_DIM and state <= 16:
        return 4 if dtype == "float32" else 2
    return 1


def common_code(name: str, nvp: int, n_outs: int, ranged: bool = False) -> str:
    """``LtArgs``, ``LtBlock`` and its decode ``lt_block``, ``lt_interval``, ``lt_finish``
    (``ranged``: the block-sparse variant, a block of threads per piece)."""
    return (_args_struct(nvp, n_outs) + _block_decode(nvp, ranged) + _INTERVAL
            + f"""
extern "C" {{ __device__ Acc {name}_acc; }}  // sizeof(Acc), read by the runtime
""")


def _args_struct(nvp: int, n_outs: int) -> str:
    words = sum(n for _, n in args_fields(nvp, n_outs))
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
  const int64_t* pieces;  // block-sparse kernels: (i0, i1, s0, s1) per piece
  const int64_t* ivs;  // their intervals [start, end) of j
  int64_t npieces;
}};
static_assert(sizeof(LtArgs) == {words} * 8, "LtArgs layout");
"""


_RANGED_DECODE = """  const int64_t* p = a.pieces + 4 * (bid % a.npieces);
  int64_t q = bid / a.npieces;
  k.b = q;
  k.i0 = p[0]; k.i1 = p[1];
  k.iv = a.ivs + 2 * p[2]; k.niv = p[3] - p[2];
  k.jc = 0; k.jb = 0; k.je = 0;
  (void)rows;"""

_FULL_DECODE = """  const int64_t nIB = (a.N + rows - 1) / rows;
  k.jc = bid % a.nJC;
  int64_t q = bid / a.nJC;
  k.i0 = (q % nIB) * rows;
  k.i1 = (k.i0 + rows < a.N) ? k.i0 + rows : a.N;
  k.b = q / nIB;
  k.jb = k.jc * a.JC;
  k.je = (k.jb + a.JC < a.M) ? k.jb + a.JC : a.M;
  k.iv = 0; k.niv = 1;
  q = k.b;"""


def _block_decode(nvp: int, ranged: bool) -> str:
    """``LtBlock`` and ``lt_block``: block ``bid``'s batch element, rows and columns (or
    piece), and the variables' base pointers in that batch element."""
    offsets = "\n".join(
        f"      off[{v}] += idx * a.vbs[{v} * MAX_BD + d];" for v in range(nvp))
    return f"""
// What one block works on: batch b, rows [i0, i1), columns [jb, je) (full product) or
// the niv intervals at iv (block-sparse).
struct LtBlock {{
  int64_t b, i0, i1, jb, je, jc, niv;
  const int64_t* iv;
  const T* base[NVP];
}};

__device__ __forceinline__ LtBlock lt_block(const LtArgs& a, int64_t bid, int64_t rows) {{
  LtBlock k;
{_RANGED_DECODE if ranged else _FULL_DECODE}
  int64_t off[NVP];
#pragma unroll
  for (int v = 0; v < NVP; ++v) off[v] = 0;
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
"""


_INTERVAL = f"""
// The s-th range of columns of block k: [jb, je).
__device__ __forceinline__ void lt_interval(const LtBlock& k, int64_t s, int64_t& jb,
                                            int64_t& je) {{
  if (k.iv) {{ jb = k.iv[2 * s]; je = k.iv[2 * s + 1]; }}
  else {{ jb = k.jb; je = k.je; }}
}}

__device__ __forceinline__ void lt_finish(const LtArgs& a, const LtBlock& k, int64_t i,
                                          const Acc& acc) {{
  const int64_t row = k.b * a.N + i;
  if (a.nJC == 1) {acc_call("acc", "write", "a.outs", "row")}
  else a.part[k.jc * (a.B * a.N) + row] = acc;
}}
"""


def kernel_entry(name: str, min_blocks: int, decls: list, loads: list, rows: str = "blockDim.x",
                 row: str = "threadIdx.x", before: tuple = (), after: tuple = ()) -> str:
    """The opening of ``<name>_reduce`` that every kernel scheme shares: its launch
    bounds (``min_blocks``: :func:`min_blocks`), the block's work (``lt_block`` of
    ``rows`` rows), the thread's row ``i`` (``row``: its offset in the block) and whether
    it is ``active``, and the narrow i-variables in registers (``decls`` and ``loads``,
    from :func:`row_registers`); ``before`` / ``after``: the scheme's own lines before and
    after ``lt_block``.

    >>> print(kernel_entry("lt", 1, ["T x0[2];"], ["x0[0] = 1;"]))  # doctest: +ELLIPSIS
    extern "C" __global__ void __launch_bounds__(256, 1) lt_reduce(const LtArgs a) {
      const LtBlock k = lt_block(a, blockIdx.x, blockDim.x);
      const int64_t i = k.i0 + threadIdx.x;
      const bool active = i < k.i1;
      T x0[2];
      if (active) {
        x0[0] = 1;
      }
    """
    lines = [f'extern "C" __global__ void __launch_bounds__({THREADS}, {min_blocks}) '
             f"{name}_reduce(const LtArgs a) {{"]
    lines += [f"  {t}" for t in before]
    lines.append(f"  const LtBlock k = lt_block(a, blockIdx.x, {rows});")
    lines += [f"  {t}" for t in after]
    lines += [f"  const int64_t i = k.i0 + {row};", "  const bool active = i < k.i1;"]
    lines += [f"  {d}" for d in decls]
    lines += ["  if (active) {"] + [f"    {t}" for t in loads] + ["  }"]
    return "\n".join(lines) + "\n"


def stage_tile(specs, tj: int) -> tuple[dict, list]:
    """({j-variable index: its offset in the tile}, the copies of a tile of ``nj`` j-rows
    from ``j0`` into shared memory, coalesced); nothing when ``tj`` is 0 (j-data read from
    global memory)."""
    tile_off, off, copies = {}, 0, []
    for v in specs:
        if v.cat == "j" and tj > 0:
            tile_off[v.index] = off
            copies.append(
                f"for (int t = threadIdx.x; t < nj * {v.dim}; t += blockDim.x) "
                f"tile[{off} + t] = k.base[{v.index}][j0 * {v.dim} + t];")
            off += tj * v.dim
    return tile_off, copies


def tile_loop(step: str, ranged: bool) -> tuple[str, str]:
    """The opening and closing text of a kernel's loop over its tiles of j: ``j0`` the
    first column, ``nj`` (at most ``step``) the columns of the tile. Block-sparse kernels
    walk their block's intervals in order, each in tiles; the bounds are the same for
    every thread of a block, so the loop body may hold barriers.

    >>> opening, closing = tile_loop("TJC", ranged=True)
    >>> "lt_interval(k, si, jb, je)" in opening, closing
    (True, '}}')
    """
    tile = (f"for (int64_t j0 = jb; j0 < je; j0 += {step}) {{\n"
            f"    const int nj = (int)((je - j0) < {step} ? (je - j0) : {step});")
    if not ranged:
        return "const int64_t jb = k.jb, je = k.je;\n  " + tile, "}"
    return ("for (int64_t si = 0; si < k.niv; ++si) {\n  int64_t jb, je;\n"
            "  lt_interval(k, si, jb, je);\n  " + tile), "}}"


def merge_code(name: str) -> str:
    return f"""
extern "C" __global__ void __launch_bounds__({THREADS}, 1) {name}_merge(const LtArgs a) {{
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= a.B * a.N) return;
  const int64_t R = a.B * a.N;
  Acc acc = a.part[r];
  for (int64_t c = 1; c < a.nJC; ++c) {acc_call("acc", "merge", "a.part[c * R + r]")}
  {acc_call("acc", "write", "a.outs", "r")}
}}
"""


def row_registers(specs, only=None) -> tuple[list, list, dict]:
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



__all__ = ["CHUNK_BYTES", "CHUNK_ROWS", "HEADER", "LOCAL_DIM", "MAX_BATCH_DIMS", "THREADS",
           "WIDE_SLICE", "args_fields", "common_code", "element_size", "kernel_entry",
           "merge_code", "min_blocks", "row_registers", "stage_tile", "tile_loop", "tile_rows"]
