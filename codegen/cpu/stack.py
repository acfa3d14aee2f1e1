"""The CPU kernel's memory per thread, sized before it is compiled.

Each thread that runs ``lt_run`` holds on its stack the formula functions' node arrays
(those :mod:`lazytensor.codegen.footprint` leaves there), the pair loop's tile of terms
``fb`` (F x TJ), one pair's value, the dot products' tiles, the row values, and the
accumulators of its work item (at most 64 KB of them, or one block of rows of a larger
``Acc``). Values too large for the stack live in a per-thread heap buffer instead.
:func:`kernel_memory` adds these up from the kernel's shape (the one the renderer
emits: planned once, :func:`lazytensor.codegen.cpu.kernel.cpu_kernel_shape`), as an upper
bound: the tests compare it with what g++ reports (``-fstack-usage``) for the same source.
:func:`cpu_kernel_memory` plans the shape first.

>>> from lazytensor.codegen import ir, ops
>>> from lazytensor.codegen.render_c import VarSpec
>>> x, y = ir.var(0, 3, "i"), ir.var(1, 3, "j")
>>> mem = cpu_kernel_memory(ops.apply("sum", ops.apply("mul", x, y)),
...                         [VarSpec(0, 3, "i"), VarSpec(1, 3, "j")], "sum", {}, "float32")
>>> mem.stack < 200_000, mem.heap
(True, 0)
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import reductions
from ..footprint import element_size
from .kernel import KernelShape, cpu_kernel_shape

ACC_BLOCK_BYTES = 65536  # the accumulators of a work item (LT_MAX_IB in the kernel)
MAX_ROW_BLOCK = 12  # LT_R: rows per block with dot products (AVX-512; 6 below)
FIXED_BYTES = 32768  # frames, spills, LtCtx, the transposes of lt_pack


@dataclass(frozen=True)
class KernelMemory:
    """Bytes per thread: ``stack`` (upper bound, with ``parts`` naming what it holds) and
    ``heap`` (the buffer of formula values too large for the stack)."""

    stack: int
    heap: int
    parts: dict

    def largest_part(self) -> str:
        return max(self.parts, key=self.parts.get)


def acc_bytes(reduction: str, F: int, opts: dict) -> int:
    """An upper bound of ``sizeof(Acc)``: per output component a value or sum and an
    index or compensation (8 bytes each at most), the running maximum of the LSE family."""
    red = reductions.get(reduction)
    widest = max([o.dim for o in red.outputs(F, opts)] + [F])
    return 16 * widest + 64


def cpu_kernel_memory(formula, var_specs, reduction: str, opts: dict, dtype: str,
                      dot_tiling: bool | None = None, ranged: bool = False) -> KernelMemory:
    """The memory per thread of the kernel ``render_cpu_kernel`` emits for these arguments
    (planned here: where the shape is at hand, :func:`kernel_memory` reads it)."""
    shape = cpu_kernel_shape(formula, var_specs, reduction, dtype, dot_tiling)
    return kernel_memory(shape, reduction, opts, ranged)


def kernel_memory(shape: KernelShape, reduction: str, opts: dict,
                  ranged: bool = False) -> KernelMemory:
    """The memory per thread of the kernel of ``shape`` (``ranged``: the block-sparse
    kernel, whose gathering chunk loop holds one column's value of each staged column
    function)."""
    size = element_size(shape.dtype)
    L, tj = shape.layout, shape.tj
    F = shape.plan.formula.dim  # what the pair loop evaluates (the narrow part of a lin)
    acc = acc_bytes(reduction, shape.dim, opts)
    rows = MAX_ROW_BLOCK if L.dots else 1
    multi_row_tiles = (shape.lin is not None and bool(L.dots)
                       and reductions.get(reduction).wide == "sum")
    parts = {
        "formula values": sum(f.stack for f in shape.footprints().values()),
        # several rows' tiles at once where weighted sums take row blocks (rows.row_block)
        "tile of terms": 0 if L.wide else (rows if multi_row_tiles else 1) * F * tj * size,
        "pair value and j-values": (F + sum(v.dim for v in L.formula_specs if v.cat == "j")) * size,
        "dot product tiles": len(L.dots) * rows * tj * size + rows * size,
        "row values": 0 if L.dots else L.n_row_values * size,
        "accumulators": max(ACC_BLOCK_BYTES, rows * acc) + 2 * acc,
        "weighted sums": (2 * tj + shape.dim) * size if shape.lin is not None else 0,
        "kernel frames": FIXED_BYTES,
        "gathered column": (max([d.var.dim for d in shape.plan.cols] + [0]) * size
                            if ranged else 0),
    }
    return KernelMemory(sum(parts.values()), shape.heap_elements * size, parts)


__all__ = ["KernelMemory", "acc_bytes", "cpu_kernel_memory", "kernel_memory"]
