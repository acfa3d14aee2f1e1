"""CUDA emission: :class:`CudaRenderer`, the kernel schemes around the shared formula code.

The renderer is the base C renderer (:mod:`lazytensor.codegen.render_c`) with the CUDA
accumulator as its hook. One ``.cu`` per kernel holds, in ``namespace <name>``, the
per-pair formula (``lt_formula``, the same emission as the CPU kernel's), a CUDA ``Acc``
(the reduction record's accumulator of the PAIRS form, see
:mod:`lazytensor.codegen.reductions.base`) and two ``extern "C"`` kernels:

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
0 where broadcast), ``bshape``, then N, M, B, nbd, nJC, JC, then ``pieces``, ``ivs``
(device pointers) and ``npieces``, read by block-sparse kernels only. The global
``<name>_acc`` has the size of ``Acc``.

Block-sparse kernels (``ranged``, see :mod:`lazytensor.scale.ranges`) run one launch of the 1D
scheme over the pieces: block ``bid`` runs piece ``bid % npieces`` of batch element ``bid /
npieces``; a piece is four int64 ``(i0, i1, s0, s1)``: rows ``[i0, i1)`` (at most a block's
rows) reduce over the intervals ``ivs[2s] <= j < ivs[2s + 1]``, s in ``[s0, s1)``, in that
order, each walked in tiles as in the full product. A piece without intervals writes the
value of an empty reduction.

:func:`kernel_layout` tells the runtime the block size limit and the dynamic shared
memory, as a function of the block size.

>>> from lazytensor.codegen import ir, ops
>>> from lazytensor.codegen.render_c import VarSpec
>>> x, y = ir.var(0, 3, "i"), ir.var(1, 3, "j")
>>> src = render_cuda_kernel(ops.apply("sum", ops.apply("mul", x, y)),
...                          [VarSpec(0, 3, "i"), VarSpec(1, 3, "j")], "sum", {}, "float32")
>>> "lt_reduce" in src and "lt_merge" in src
True
"""

from __future__ import annotations

from .. import reductions
from ..linearize import wide_sum
from ..render_c import CRenderer, VarSpec
from . import TUNING
from .chunked import chunk_smem, chunked_kernel
from .chunks import ChunkedSums, plan_chunks
from .direct import direct_kernel
from .skeleton import (
    CHUNK_ROWS,
    HEADER,
    MAX_BATCH_DIMS,
    THREADS,
    args_fields,
    common_code,
    element_size,
    merge_code,
    tile_rows,
)
from .wide import wide_group, wide_kernel, wide_softmax_kernel


def _chunk_plan(formula, var_specs) -> ChunkedSums | None:
    n_vars = max([v.index + 1 for v in var_specs] + [0])
    return plan_chunks(formula, n_vars)


def _wide_plan(formula, reduction: str, opts: dict):
    """The weighted-sum form of a wide Sum (``K @ V``) or softmax-weighted sum, or None."""
    if reductions.get(reduction).wide is None or opts.get("sum_scheme") == "kahan_scheme":
        return None
    return wide_sum(formula, reduction, TUNING)


def kernel_layout(formula, var_specs, reduction: str, opts: dict, dtype: str) -> dict:
    """How the runtime launches the kernel: at most ``threads`` per block, ``group``
    threads per row, dynamic shared memory ``smem_fixed + smem_per_thread * threads``
    bytes, j in tiles of ``tile``, ``merge_per_row`` merge threads per row (split-j)."""
    specs = sorted(var_specs, key=lambda v: v.index)
    plan = _chunk_plan(formula, specs)
    layout = {"threads": THREADS, "group": 1, "merge_per_row": 1, "smem_per_thread": 0}
    if plan is not None:
        fixed, per_thread = chunk_smem(plan, dtype)
        return {**layout, "smem_fixed": fixed, "smem_per_thread": per_thread,
                "tile": CHUNK_ROWS, "scheme": "chunked"}
    tj = tile_rows(specs, dtype)
    fixed = tj * sum(v.dim for v in specs if v.cat == "j") * element_size(dtype) if tj else 0
    if _wide_plan(formula, reduction, opts) is not None:
        W = formula.dim - (reduction != "sum")  # the slices cover the weight alone
        return {**layout, "group": wide_group(W), "merge_per_row": W,
                "smem_fixed": fixed, "tile": tj or 256, "scheme": "wide"}
    return {**layout, "smem_fixed": fixed, "tile": tj or 256, "scheme": "direct"}


def _n_outputs(formula, reduction, opts) -> int:
    return len(reductions.get(reduction).outputs(formula.dim, opts))


def render_cuda_kernel(formula, var_specs, reduction: str, opts: dict, dtype: str,
                       name: str = "lt", ranged: bool = False) -> str:
    """Complete CUDA source of ``<name>_reduce`` and ``<name>_merge`` (module docstring);
    ``ranged``: the block-sparse variant (block ``blockIdx.x`` runs one piece, the module
    docstring says how).

    Sources rendered with distinct names can be concatenated into one ``.cu``.
    """
    return CudaRenderer(dtype).kernel(formula, var_specs, reduction, opts, name, ranged)


class CudaRenderer(CRenderer):
    """CUDA C++ for nvcc: the shared pieces, the records' PAIRS accumulators, the schemes.

    - ``functions``: none of its own, libm's names (nvcc maps them to its intrinsics
      under fast math); ``storage``: none (a wide formula is chunked instead, :mod:`.chunks`);
    - ``acc_form``: PAIRS, the reduction records' accumulators that take the pairs one at a
      time, their state in registers (a tile buffer would be local memory on a GPU).

    Wide sums are planned with the backend's tuning (:data:`lazytensor.codegen.cuda.TUNING`).
    """

    name = "cuda"
    acc_form = reductions.base.PAIRS

    def kernel(self, formula, var_specs, reduction: str, opts: dict, name: str = "lt",
               ranged: bool = False) -> str:
        """The ``.cu`` source (see :func:`render_cuda_kernel`): the header, then in the
        kernel's namespace the prelude and ``Acc``, the skeleton, and the scheme's
        kernels (chunked, wide or direct)."""
        specs = sorted(var_specs, key=lambda v: v.index)
        nvp = max([v.index + 1 for v in specs] + [1])
        n_outs = _n_outputs(formula, reduction, opts)
        plan = _chunk_plan(formula, specs)
        lin = _wide_plan(formula, reduction, opts) if plan is None else None
        shared = (self.prelude(self.acc_dtype(reduction, opts))
                  + self.accumulator(formula, reduction, opts) + "\n")
        common = common_code(name, nvp, n_outs, ranged)
        if plan is not None:
            body = (chunked_kernel(self, plan, formula, specs, reduction, opts, name, ranged)
                    + merge_code(name))
        elif lin is not None:
            body = (wide_kernel(self, lin, formula, specs, opts, name, ranged)
                    if reduction == "sum" else
                    wide_softmax_kernel(self, lin, formula, specs, reduction, name, ranged))
        else:
            body = (direct_kernel(self, formula, specs, reduction, opts, name, ranged)
                    + merge_code(name))
        variant = ", block-sparse" if ranged else ""
        return (f"{HEADER}// kernel {name}: {reduction}, {self.dtype}{variant}\n"
                f"namespace {name} {{\n{shared}{common}{body}}}  // namespace {name}\n")


__all__ = [
    "CudaRenderer",
    "MAX_BATCH_DIMS",
    "THREADS",
    "VarSpec",
    "args_fields",
    "kernel_layout",
    "render_cuda_kernel",
    "tile_rows",
]
