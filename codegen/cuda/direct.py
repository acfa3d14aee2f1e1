"""The direct CUDA kernel: j in tiles staged in shared memory, the whole formula per pair.

One thread per row; narrow i-variables in registers; each tile of j-rows is copied,
coalesced, into dynamic shared memory and read by every thread as broadcasts; the
accumulator (the record's PAIRS form) takes the tile through ``Acc::tile``.
"""

from __future__ import annotations

from ..render_c import acc_call, formula_call
from .skeleton import kernel_entry, min_blocks, row_registers, stage_tile, tile_loop, tile_rows


def direct_kernel(r, formula, specs, reduction, opts, name, ranged: bool = False) -> str:
    """``<name>_reduce`` of the direct scheme (``r``: the CUDA renderer)."""
    tj = tile_rows(specs, r.dtype)
    staged = tj > 0
    decls, loads, args = row_registers(specs)
    tile_off, copies = stage_tile(specs, tj)
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
    loop_open, loop_close = tile_loop("TJC", ranged)
    entry = kernel_entry(name, min_blocks(formula, opts, r.dtype), decls, loads,
                         before=("T* tile = (T*)lt_smem;", "(void)tile;"))
    return f"""{r.formula(formula, list(specs))}
static const int TJC = {tj if staged else 256};  // j-rows per tile

{entry}  Acc acc;
  {acc_call("acc", "init")}
  {loop_open}
    {"__syncthreads();  // the previous tile is read" if staged else ""}
    {nl.join(copies)}
    {"__syncthreads();" if staged else ""}
    if (active) {acc_call("acc", "tile", f"[&](int jj, T* o) {{ {formula_call(call)} }}", "nj", "j0")}
  {loop_close}
  if (active) lt_finish(a, k, i, acc);
}}
"""


__all__ = ["direct_kernel"]
