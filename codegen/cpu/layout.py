"""Where the CPU kernel keeps each value: staged chunks of j, packed panels, row values.

:class:`Layout` decides, from the variables and the plan (:mod:`lazytensor.codegen.cpu.plan`),
which j-data a work item copies into its per-thread buffer for each chunk of ``JCH``
columns (component after component, ``S[k * JCH + j]``), which j-operands of dot products
it packs in panels (:mod:`lazytensor.codegen.cpu.gemm`), and where the row values go;
:func:`stage_chunk` emits the copies.

>>> from lazytensor.codegen import ir, ops
>>> from lazytensor.codegen.render_c import VarSpec
>>> from lazytensor.codegen.cpu.plan import plan_cpu
>>> x, y = ir.var(0, 3, "i"), ir.var(1, 3, "j")
>>> L = Layout([VarSpec(0, 3, "i"), VarSpec(1, 3, "j")],
...            plan_cpu(ops.apply("sum", ops.apply("mul", x, y)), 2))
>>> [v.index for v in L.staged], L.wide
([1], False)
"""

from __future__ import annotations

from .. import ir
from ..footprint import FUNCTION_STACK_BYTES, function_footprint
from ..render_c import VarSpec
from . import WIDE
from .plan import LoopForm

# The type the squared norms |A_i|², |B_j|² of the squared distances through dot products
# are summed in: each rounding error of a norm is shared by a whole row or column of pairs.
NORM_ACC = "double"


def _offsets(specs: list, start: int) -> tuple:
    """({index: first component}, end) of variables laid out one after the other."""
    offsets = {}
    for v in specs:
        offsets[v.index] = start
        start += v.dim
    return offsets, start


class Layout:
    """Which values are staged per chunk and how each variable is addressed."""

    def __init__(self, var_specs: list, plan: LoopForm, jch: int | None = None,
                 dtype: str = "float64"):
        self.orig = sorted(var_specs, key=lambda v: v.index)
        self.n_orig = max([v.index + 1 for v in self.orig] + [0])
        self.rows = [VarSpec(d.var.index, d.var.dim, "i") for d in plan.rows]
        self.cols = [VarSpec(d.var.index, d.var.dim, "j") for d in plan.cols]
        self.col_source = {d.var.index: d.source for d in plan.cols}
        self.dots = list(plan.dots)
        self.dot_index = {d.var.index for d in plan.dots}
        used = {v.index for v in ir.variables(plan.formula)}
        used |= {d.norm_b for d in plan.dots}
        dot_b = {d.b for d in plan.dots}
        self.formula_specs = self.orig + self.rows + self.cols + [
            VarSpec(d.var.index, 1, "j") for d in plan.dots]
        # values of the formula kept in the per-thread heap (codegen.footprint): one
        # buffer for the whole pair loop, so pairs go one at a time
        self.heap_formula = function_footprint(
            [plan.formula], self.formula_specs, dtype, FUNCTION_STACK_BYTES).heap_elements > 0
        # wide: the pair loop is vectorized along the vector dimension (see kernel.py)
        self.wide = plan.formula.dim > WIDE or self.heap_formula or any(
            v.dim > WIDE for v in self.orig if v.index in used)
        # staged: j-variables read component-wise by the pair loop (unless wide), and the
        # columns it reads (S[k * JCH + j])
        self.staged = [v for v in self.orig if v.cat == "j" and v.dim > 1
                       and v.index in used and not self.wide]
        self.staged += [v for v in self.cols if v.index in used]
        self.stage_offset, self.stage_dims = _offsets(self.staged, 0)
        # packed: the j-side operands of dot products, in panels of LT_NR columns, each
        # panel k-major (see lt_dot), after the staged values in the same buffer
        self.packed = [v for v in self.orig + self.cols if v.index in dot_b]
        self.pack_offset, self.buffer_dims = _offsets(self.packed, self.stage_dims)
        self.row_offset, self.n_row_values = _offsets(self.rows, 0)
        self.row_of_node = {d.node: d.var.index for d in plan.rows}

    def j_bytes(self, size: int) -> int:
        """Bytes of j-data per column: staged, plus the dimension-1 j-variables read in place."""
        raw = sum(v.dim for v in self.orig if v.cat == "j" and v.index not in self.stage_offset
                  and v.index not in self.pack_offset)
        return max(1, (self.buffer_dims + raw) * size)


def _column_loop(k: int, d: int, writes: str, col: tuple | None) -> str:
    """The loop of the chunk's columns jj < nc running ``writes`` (which write column
    ``jp`` of variable k, dimension d, from ``src``). ``col`` = (source, its dimension) of
    a computed column (``lt_col{k}``): by whole blocks of LT_TW columns, the last block on a copy of its
    source rows (row nc - 1 past nc; its values past nc land in the padding, zeroed
    after), so that every column goes through the same vector code, none through a
    scalar remainder loop, whose libm functions differ from the vector ones in the last
    bit (equal points, equal values)."""
    if col is None:
        return (f"    for (int64_t jj = 0; jj < nc; ++jj) {{ const int64_t jp = jj; "
                f"const T* src = P{k} + (c0 + jj) * {d}; {writes} }}")
    s, ds = col

    def block(row: str) -> str:
        return f"""      #pragma GCC ivdep
      #pragma GCC unroll 1
      for (int l = 0; l < LT_TW; ++l) {{
        const int64_t jp = jq + l;
        T src[{d}]; lt_col{k}({row}, src); {writes}
      }}"""
    return f"""    {{ int64_t jq = 0;
    for (; jq + LT_TW <= nc; jq += LT_TW) {{
{block(f"P{s} + (c0 + jq + l) * {ds}")}
    }}
    if (jq < nc) {{
      T Q[LT_TW * {ds}];
      for (int l = 0; l < LT_TW; ++l) for (int c = 0; c < {ds}; ++c)
        Q[l * {ds} + c] = P{s}[(c0 + (jq + l < nc ? jq + l : nc - 1)) * {ds} + c];
{block(f"Q + l * {ds}")}
    }} }}"""


def stage_chunk(L: Layout) -> str:
    """Copies (and columns) of the chunk [c0, c1) into S, zero-padded to ncp columns:
    staged ones at ``S[(off + k) * JCH + j]``, packed ones in panels of LT_NR columns
    (variables by ``lt_pack``, columns as they are computed).

    The columns |B_j|² of the sqdist products are summed from B's packed panels, across a
    panel's columns at once (vectorized along j instead of a chain of dependent additions
    per column), in double (:data:`NORM_ACC`): the rounding error of |B_j|² is the same for
    every row, so in float32 it does not average out over the rows -- softmax weights' column
    sums at D = 64 were off by 13x dense float32's error -- where the product's and the
    subtraction's are independent from pair to pair."""
    dims = {v.index: v.dim for v in L.orig}
    norms = {d.norm_b: d for d in L.dots if d.kind == "sqdist"}
    out = []
    for v in L.staged + [v for v in L.packed if v.index not in L.stage_offset]:
        k, d = v.index, v.dim
        if k in norms:
            continue
        col = (L.col_source[k], dims[L.col_source[k]]) if k in L.col_source else None
        src = "src"
        writes, pads = [], []
        if k in L.stage_offset:
            writes.append(f"T* Y = S + {L.stage_offset[k]} * JCH + jp; "
                          f"for (int q = 0; q < {d}; ++q) Y[q * JCH] = {src}[q];")
            pads.append(f"{{ T* Y = S + {L.stage_offset[k]} * JCH; for (int q = 0; q < {d}; ++q) "
                        f"for (int64_t jj = nc; jj < ncp; ++jj) Y[q * JCH + jj] = 0; }}")
        if k in L.pack_offset and k in L.col_source:
            writes.append(f"T* Z = S + {L.pack_offset[k]} * JCH + jp / LT_NR * (LT_NR * {d}) "
                          f"+ jp % LT_NR; for (int q = 0; q < {d}; ++q) Z[q * LT_NR] = src[q];")
            pads.append(f"for (int64_t jj = nc; jj < ncp; ++jj) {{ T* Z = S + {L.pack_offset[k]} "
                        f"* JCH + jj / LT_NR * (LT_NR * {d}) + jj % LT_NR; "
                        f"for (int q = 0; q < {d}; ++q) Z[q * LT_NR] = 0; }}")
        elif k in L.pack_offset:
            pads.append(f"lt_pack<{d}>(P{k} + c0 * {d}, nc, ncp, S + {L.pack_offset[k]} * JCH);")
        if writes:
            out.append(_column_loop(k, d, " ".join(writes), col))
        out.extend(f"    {p}" for p in pads)
    for k, dot in norms.items():
        D = dot.dim
        out.append(f"""    for (int64_t p = 0; p < ncp; p += LT_NR) {{
      const T* z = S + {L.pack_offset[dot.b]} * JCH + p * {D};
      {NORM_ACC} s[LT_NR] = {{}};
      for (int k = 0; k < {D}; ++k)
        for (int q = 0; q < LT_NR; ++q) {{
          const {NORM_ACC} v = z[k * LT_NR + q];
          s[q] += v * v;
        }}
      for (int q = 0; q < LT_NR; ++q) S[{L.stage_offset[k]} * JCH + p + q] = (T)s[q];
    }}""")
    return "\n".join(out)
