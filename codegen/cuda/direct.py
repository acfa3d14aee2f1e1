"""The direct CUDA kernel: j in tiles staged in shared memory, the whole formula per pair.

One thread per row; narrow i-variables in registers; each tile of j-rows is copied,
coalesced, into dynamic shared memory and read by every thread as broadcasts; the
accumulator takes the tile through ``Acc::tile`` (see :mod:`.accumulators`).
"""

from __future__ import annotations

from ..render_c import render_formula
from .skeleton import THREADS, min_blocks, row_registers, tile_loop, tile_rows


def direct_kernel(formula, specs, reduction, opts, dtype, name, ranged: bool = False) -> str:
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
    minb = min_blocks(formula, opts, dtype)
    loop_open, loop_close = tile_loop("TJC", ranged)
    return f"""{formula_code}
static const int TJC = {tjc};  // j-rows per tile

extern "C" __global__ void __launch_bounds__({THREADS}, {minb}) {name}_reduce(const LtArgs a) {{
  T* tile = (T*)lt_smem;
  (void)tile;
  const LtBlock k = lt_block(a, blockIdx.x, blockDim.x);
  const int64_t i = k.i0 + threadIdx.x;
  const bool active = i < k.i1;
  {nl.join(decls)}
  if (active) {{
    {nl.join(loads)}
  }}
  Acc acc;
  acc.init();
  {loop_open}
    {"__syncthreads();  // the previous tile is read" if staged else ""}
    {nl.join(copies)}
    {"__syncthreads();" if staged else ""}
    if (active) acc.tile([&](int jj, T* o) {{ lt_formula({", ".join(call)}, o); }}, nj, j0);
  {loop_close}
  if (active) lt_finish(a, k, i, acc);
}}
"""



__all__ = ["direct_kernel"]
