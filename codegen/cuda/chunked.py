"""The chunked CUDA kernel: vector sums of large dimension through shared memory.

j goes by in register tiles of ``CHUNK_ROWS`` rows; for each vector sum of the plan
(:mod:`.chunks`), the vector dimension goes by in chunks of C components: the chunk of the
block's rows (transposed, padded by one row: conflict-free) and of the tile's j-rows are
staged in shared memory, and each thread adds the sum's terms for its row and the tile's
rows into registers. Then the narrow rest of the formula runs per pair.
"""

from __future__ import annotations

from .. import ir
from ..render_c import VarSpec, acc_call, array, formula_call, loop
from .chunks import ChunkedSums
from .skeleton import CHUNK_BYTES, CHUNK_ROWS, element_size, kernel_entry, row_registers, tile_loop


def chunk_smem(plan: ChunkedSums, dtype: str) -> tuple[int, int]:
    """(fixed, per thread) bytes of a chunked kernel's shared memory: per vector sum, the
    row chunks of its i-leaves (padded by one row) and the R j-rows of its j-leaves."""
    C = CHUNK_BYTES // element_size(dtype)
    fixed = per_thread = 0
    for s in plan.sums:
        n_i = sum(1 for v in s.leaves if v.cat == "i" and v.dim > 1)
        n_j = sum(1 for v in s.leaves if v.cat == "j" and v.dim > 1)
        f = (n_i * C + n_j * CHUNK_ROWS * C) * element_size(dtype)
        p = n_i * C * element_size(dtype)
        fixed, per_thread = max(fixed, f), max(per_thread, p)
    return fixed, per_thread


def chunked_kernel(r, plan: ChunkedSums, formula, specs, reduction, opts, name,
                   ranged: bool = False) -> str:
    """``<name>_reduce`` of the chunked scheme (``r``: the CUDA renderer): the rest of
    the formula and each vector sum's term as functions, then the kernel."""
    C = CHUNK_BYTES // element_size(r.dtype)
    R = CHUNK_ROWS
    rest = plan.formula
    used = {v.index for v in ir.variables(rest)}
    decls, loads, args = row_registers(specs, only=used)
    # the rest: the formula's variables and one scalar per vector sum
    rest_specs = [v for v in specs if v.index in used]
    rest_specs += [VarSpec(s.var.index, 1, "j") for s in plan.sums]
    pieces = [r.formula(rest, rest_specs)]
    sums_code = []
    for n, s in enumerate(plan.sums):
        term_specs = [VarSpec(p.index, 1, p.cat) for p in s.scalars]
        pieces.append(r.function(f"lt_term{n}", [s.term], term_specs))
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
    loop_open, loop_close = tile_loop("R", ranged)
    entry = kernel_entry(name, 1, decls, loads, rows="nt", row="tid",
                         before=("const int nt = blockDim.x;",),
                         after=("const int tid = threadIdx.x;",))
    return "\n".join(pieces) + f"""
static const int R = {R};  // j-rows per register tile
static const int C = {C};  // components per chunk of the vector dimension

{entry}  Acc acc;
  {acc_call("acc", "init")}
  {loop_open}
{"".join(sums_code)}
    if (active) {{
#pragma unroll
      {loop("r", "R")} {{
        if (r < nj) {{
          {array("o", formula.dim)}
          {formula_call(call)}
          {acc_call("acc", "push", "o", "j0 + r")}
        }}
      }}
      {acc_call("acc", "flush")}
    }}
  {loop_close}
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
            f"          xs[d * (nt + 1) + t] = (row < k.i1 && c0 + d < {s.dim}) ? "
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



__all__ = ["chunk_smem", "chunked_kernel"]
