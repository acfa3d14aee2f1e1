"""The CPU kernel: its shape (the plan, worked out once) and its renderer, ``CpuRenderer``.

The formula is first planned (:mod:`lazytensor.codegen.cpu.plan`): values that depend on i
only become per-row values, costly values of one j-variable become columns, large dot
products become small matrix products (:mod:`lazytensor.codegen.cpu.gemm`). Then:

- *work items* (batch b, block of rows, chunk of j for split-j) go to OpenMP threads,
  dynamically; one thread, or a small problem, runs them without OpenMP;
- *a work item* walks its j-range in chunks of ``JCH`` columns that stay in L2. It first
  stages the chunk (:mod:`lazytensor.codegen.cpu.layout`): the j-variables of dimension
  > 1 and the columns, one component after the other (``S[k * JCH + j]``, zero-padded to
  whole tiles), in a per-thread buffer -- a GPU's shared-memory tile, here so that the
  pair loop reads every component with unit stride. There is no O(M) set-up pass and no
  O(M) buffer, so one query against 10^7 points is split over threads from its first
  byte. Then, for each block of ``LT_R`` rows (1 without dot products): the row values
  and, per tile of ``TJ`` columns, the dot products and, for each row, a vectorizable
  loop over the tile that evaluates the formula into ``fb``, handed to ``Acc::tile``.
  Accumulators stay per row across tiles and chunks, so every row sees its j in
  increasing order;
- a Sum of wide terms that are weights times j-variables runs its narrow part in the
  pair loop and the rest as weighted sums of the j-vectors
  (:mod:`lazytensor.codegen.cpu.wide`);
- split-j partial accumulators are merged with ``Acc::merge``;
- block-sparse calls (``ranges``) are work items too: a piece of a block of rows against
  its list of j-intervals, the same accumulators and merges.

The kernel runs with denormals flushed to zero (``LtFtz``, as CUDA's fast math does):
an underflowing exp would otherwise cost a hundred cycles per pair.

The pieces are named functions: ``lt_rows`` in :mod:`lazytensor.codegen.cpu.rows`, the
work items and ``lt_run`` (whose calling convention is there) in
:mod:`lazytensor.codegen.cpu.entry`, around the shared formula and ``Acc``
(:mod:`lazytensor.codegen.render_c`). :func:`cpu_kernel_shape` decides everything the
text depends on (:class:`KernelShape`): the stack check
(:mod:`lazytensor.codegen.cpu.stack`) and the renderer read the same shape, so that a
kernel is planned once.

>>> from lazytensor.codegen import ir, ops
>>> from lazytensor.codegen.render_c import VarSpec
>>> x, y = ir.var(0, 3, "i"), ir.var(1, 3, "j")
>>> src = render_cpu_kernel(ops.apply("sum", ops.apply("mul", x, y)),
...                         [VarSpec(0, 3, "i"), VarSpec(1, 3, "j")], "sum", {}, "float32")
>>> "lt_run" in src and "lt_formula" in src
True
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir, reductions
from ..footprint import FUNCTION_STACK_BYTES, Storage, check_dims, function_footprint
from ..linearize import Linear, wide_sum
from ..render_c import CRenderer
from . import TUNING
from .entry import ACC_TMP, work_items
from .gemm import dot_kernel, dot_micro, sqdist_fix
from .layout import Layout
from .plan import LoopForm, plan_cpu
from .rows import row_block
from .simd import heap_defs, prelude_defs, vector_header
from .wide import wide_acc_code, wide_block_call, wide_call, wide_softmax_acc_code

L2_CHUNK_BYTES = 262144  # staged j-data of one chunk, reused by every row block of an item
# With dot products every micro-kernel call streams its panel from the chunk, so the chunk
# must stay in L2 next to the row block: half of the smallest common L2 (256 KB). The same
# speed as 256 KB where L2 is 2 MB (measured, D = 256).
DOT_CHUNK_BYTES = 131072
# Sums add the terms of several tiles lane by lane before summing the lanes (a float sum
# of LANE_TERMS / TJ terms per lane, then of the TJ lanes, then into the wide accumulator):
# one pass over the tile buffer per 2048 terms instead of per tile, whose serial sums were
# a quarter of the instructions of a 4-component sum (fused gradient of a Gaussian, D = 3).
LANE_TERMS = 2048
# Node values: the largest in the per-thread heap (simd.heap_defs), arrays aligned for AVX.
CPU_STORAGE = Storage("lt_heap.p", 64)


def tile_size(F: int, dtype: str) -> int:
    """j-tile length: the tile buffer F x TJ stays within 16 KB of L1."""
    size = 4 if dtype == "float32" else 8
    tj = 256
    while tj > 8 and F * tj * size > 16384:
        tj //= 2
    return tj


@dataclass(frozen=True)
class KernelShape:
    """What :func:`render_cpu_kernel` decides before it emits code: the planned formula
    (``lin.narrow`` when ``lin``, the weighted-sum form, is taken), its layout, the tile
    and chunk lengths, and the generated functions that evaluate IR (name, roots,
    variables), whose values may live in the per-thread heap (:mod:`..footprint`)."""

    plan: LoopForm
    layout: Layout
    lin: Linear | None
    tj: int
    jch: int
    functions: tuple
    dtype: str

    def footprints(self) -> dict:
        """{function name: its :class:`~lazytensor.codegen.footprint.Footprint`}."""
        return {name: function_footprint(roots, specs, self.dtype, FUNCTION_STACK_BYTES)
                for name, roots, specs in self.functions}

    @property
    def dim(self) -> int:
        """The dimension of the kernel's formula (the values its reduction reduces)."""
        return self.lin.dim if self.lin is not None else self.plan.formula.dim

    @property
    def heap_elements(self) -> int:
        """Length of the per-thread heap buffer the functions share (0: none): they never
        run nested, so each uses it from its start."""
        return max([f.heap_elements for f in self.footprints().values()] + [0])


def cpu_kernel_shape(formula, var_specs, reduction: str, dtype: str,
                     dot_tiling: bool | None = None) -> KernelShape:
    """The shape of the kernel :func:`render_cpu_kernel` emits for these arguments (the
    plan: call it once per kernel, and hand the shape to :func:`render_planned` and
    :func:`lazytensor.codegen.cpu.stack.kernel_memory`)."""
    check_dims(formula)
    lin = wide_sum(formula, reduction, TUNING)
    if lin is not None:
        shape = plan_shape(lin.narrow, var_specs, dtype, dot_tiling, lin)
        if shape is not None:
            return shape
    return plan_shape(formula, var_specs, dtype, dot_tiling)


def plan_shape(formula, var_specs, dtype, dot_tiling, lin=None) -> KernelShape | None:
    """The shape of the kernel whose pair loop evaluates ``formula`` (``lin``: the weighted
    sums it is the narrow part of; None when that narrow part still reads a wide vector
    pair by pair)."""
    F = formula.dim
    plan = plan_cpu(formula, max([v.index + 1 for v in var_specs] + [0]), dot_tiling)
    L = Layout(var_specs, plan, dtype=dtype)
    if lin is not None and L.wide:
        return None  # the narrow part still reads a wide vector pair by pair
    size = 4 if dtype == "float32" else 8
    tj = max(tile_size(F, dtype), 64) if L.dots else tile_size(F, dtype)
    chunk = DOT_CHUNK_BYTES if L.dots else L2_CHUNK_BYTES
    jch = max(tj, chunk // L.j_bytes(size) // tj * tj)
    functions = [("lt_formula", (plan.formula,), tuple(L.formula_specs))]
    if L.n_row_values:
        functions.append(("lt_rowvals", tuple(d.node for d in plan.rows),
                          tuple(v for v in L.orig if v.cat in ("i", "p"))))
    for d in plan.cols:
        functions.append((f"lt_col{d.var.index}", (d.node,),
                          (next(v for v in L.orig if v.index == d.source),)))
    return KernelShape(plan, L, lin, tj, jch, tuple(functions), dtype)


def render_cpu_kernel(formula, var_specs, reduction: str, opts: dict, dtype: str,
                      dot_tiling: bool | None = None, ranged: bool = False) -> str:
    """Complete C++ source of the CPU kernel ``lt_run`` (see the module docstring).

    A Sum of wide terms that are weights times j-variables runs its narrow part in the
    pair loop and the rest as weighted sums of the j-vectors (:mod:`lazytensor.codegen.cpu.wide`).
    ``ranged``: the kernel of block-sparse calls, which stages the columns of consecutive
    intervals together when the pair loop allows it (see :func:`lazytensor.codegen.cpu.gather.gather_loop`)."""
    return render_planned(cpu_kernel_shape(formula, var_specs, reduction, dtype, dot_tiling),
                          reduction, opts, ranged)


def render_planned(shape: KernelShape, reduction: str, opts: dict, ranged: bool = False,
                   jside: tuple | None = None) -> str:
    """The source of the kernel of ``shape`` (from :func:`cpu_kernel_shape`): see
    :meth:`CpuRenderer.kernel`."""
    renderer = CpuRenderer(shape.dtype, heap=shape.heap_elements > 0)
    return renderer.kernel(shape, reduction, opts, ranged, jside)


class CpuRenderer(CRenderer):
    """C++ for g++: the shared pieces with the CPU's tables and hooks, and the skeleton.

    - ``functions``: ``exp`` is ``lt_exp`` (:mod:`.simd`: branch-free, so that the pair
      loop vectorizes through it, where libmvec's ``expf`` leaves its vector path for
      every lane that underflows);
    - ``storage``: the largest node values in the per-thread heap ``lt_heap``, arrays
      aligned for AVX (:data:`CPU_STORAGE`);
    - :meth:`prelude_defs`: the declarations that let g++ vectorize calls to libmvec,
      ``lt_exp``, and the heap where a function uses it (``heap``).

    The shape it renders was planned with the backend's tuning
    (:data:`lazytensor.codegen.cpu.TUNING`, handed to the shared passes).
    """

    name = "cpu"
    functions = {"exp": "lt_exp"}
    storage = CPU_STORAGE

    def __init__(self, dtype: str, heap: bool = False):
        super().__init__(dtype)
        self.heap = heap

    def prelude_defs(self) -> str:
        return prelude_defs() + (heap_defs() if self.heap else "")

    def kernel(self, shape: KernelShape, reduction: str, opts: dict, ranged: bool = False,
               jside: tuple | None = None) -> str:
        """The kernel's source: definitions, ``lt_rows``, the work items and ``lt_run``.

        ``jside`` = (definitions, statement): only the code up to ``lt_rows``, the
        statement run after each row block's weighted sums (the j-side sums of
        :mod:`lazytensor.codegen.cpu.twosided`, which brings its own skeleton)."""
        src = [self.definitions(shape, reduction, opts), ACC_TMP,
               self.rows(shape, reduction, opts, ranged, jside)]
        if jside is None:
            src.append(work_items(shape.layout, _rows_per_block(shape.layout)))
        return "".join(src)

    def definitions(self, shape: KernelShape, reduction: str, opts: dict) -> str:
        """Everything before ``lt_rows``: the prelude, the formula, the accumulator (the
        reduction's, or the weighted sums' after the vector types), the row and column
        functions, the dot products' micro-kernels."""
        plan, L, lin = shape.plan, shape.layout, shape.lin
        if lin is None:
            src = [self.shared(plan.formula, L.formula_specs, reduction, opts, shape.tj)]
        else:
            src = [self.prelude(self.acc_dtype(reduction, opts))
                   + f"static const int TJ = {shape.tj};\n"
                   + self.formula(plan.formula, L.formula_specs)]
        src.append("#ifdef _OPENMP\n#include <omp.h>\n#endif\n")
        src.append(vector_header())
        if lin is not None:
            red = reductions.get(reduction)
            src.append(wide_acc_code(lin, opts) if red.wide == "sum"
                       else wide_softmax_acc_code(lin, red))
        src.append(f"static const int64_t JCH = {shape.jch};  // columns per staged chunk\n"
                   "// columns of a tile (and of a chunk) the pair loops compute at once\n"
                   "enum { LT_TW = TJ < LT_W ? TJ : LT_W };\n")
        if L.n_row_values:
            row_in = [v for v in L.orig if v.cat in ("i", "p")]
            src.append(self.function("lt_rowvals", [d.node for d in plan.rows], row_in,
                                     "static LT_INLINE"))
        for d in plan.cols:
            s = next(v for v in L.orig if v.index == d.source)
            src.append(self.function(f"lt_col{d.var.index}", [d.node], [s], "static LT_INLINE"))
        if L.dots:
            src.append(dot_micro())
        for D in sorted({d.dim for d in L.dots}):
            src.append(dot_kernel(D))
        for D in sorted({d.dim for d in L.dots if d.kind == "sqdist"}):
            src.append(sqdist_fix(D))
        return "".join(src)

    def rows(self, shape: KernelShape, reduction: str, opts: dict, ranged: bool,
             jside: tuple | None) -> str:
        """``lt_rows`` in the form the kernel takes: the weighted sums of a row block's
        rows at once (dot products, a wide Sum), or the pair loop with its tiles handed
        over one by one, lane by lane (narrow sums), or gathered (block-sparse)."""
        L, lin, tj = shape.layout, shape.lin, shape.tj
        F = shape.plan.formula.dim
        R = _rows_per_block(L)
        heap_len = shape.heap_elements
        red = reductions.get(reduction)
        if lin is not None and L.dots and red.wide == "sum":
            # several rows' weights against each tile of B at once (wide.lt_wblock)
            defs, more = jside or ("", "")
            return defs + row_block(L, F, R, heap_len=heap_len, after_rows="\n        "
                                    + wide_block_call(lin, f"{F} * TJ", "A") + more)
        lanes = 0
        if lin is None and not L.dots and not L.wide and tj >= 64 and red.lanes_add(opts):
            lanes = max(1, LANE_TERMS // tj)  # tj >= 64: whole vectors (lt_vec) of lanes
        # Block-sparse calls of the plain pair loop stage several intervals per chunk, unless
        # the reduction outputs indices (the tiles then need their global column numbers).
        gather = None
        if (ranged and lin is None and not L.dots and not L.wide
                and all(o.kind == "value" for o in red.outputs(F, opts))):
            gather = {v.index for v in ir.variables(shape.plan.formula)}
        after = "" if lin is None else "\n          " + wide_call(lin, "A[i - i0]")
        return row_block(L, F, R, after, lanes, heap_len=heap_len, gather=gather)


def _rows_per_block(L: Layout) -> str:
    return "LT_R" if L.dots else "1"  # LT_R depends on the vector width (simd.vector_header)
