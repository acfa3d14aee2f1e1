"""Launching a CUDA kernel: the grid (1D or split-j), its packed arguments, the buffers.

:func:`launch_cuda` runs a :class:`~lazytensor.backends.cuda.loader.CudaKernel` on torch tensors
(outputs allocated by torch on the tensors' device, on torch's current stream, see
:mod:`lazytensor.backends.cuda.streams`); :func:`launch_numpy` on NumPy arrays, copied to the GPU
and back through pycuda (as ``pykeops.numpy`` does on a GPU). Both pick the scheme: one
thread per row (1D) when there are enough rows to fill the device, else the split-j
scheme (partial accumulators in a scratch buffer, then the merge kernel). Block-sparse
calls (``ranges``) launch the call's block-sparse kernel once, one block per piece of a
block of rows and batch element (:func:`ranges_plan`). See
:mod:`lazytensor.codegen.cuda.render` for the kernels and their ABI.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...codegen.cuda.render import MAX_BATCH_DIMS, args_fields
from ...core.batch import batch_layout
from . import driver, streams

_BLOCKS_PER_SM = 4  # blocks per multiprocessor the split-j scheme aims for
_MIN_CHUNK = 1024  # fewest j per chunk in the split-j scheme
_MAX_PART_BYTES = 256 << 20  # partial accumulators of the split-j scheme
_MAX_GRID = 2**31 - 1


# ---------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class LaunchGrid:
    """Grid of one reduction: ``nJC == 1`` is the 1D scheme, ``nJC > 1`` split-j."""

    threads: int
    nJC: int
    JC: int
    grid: int
    merge_grid: int
    part_bytes: int


def plan_launch(N: int, M: int, B: int, sm_count: int, threads: int, tile: int,
                acc_bytes: int, group: int = 1, merge_per_row: int = 1) -> LaunchGrid:
    """Choose the scheme: split j only when the row blocks cannot fill the device.

    >>> plan_launch(10**6, 10**6, 1, 132, 256, 256, 16).nJC
    1
    >>> p = plan_launch(100, 10**6, 1, 132, 256, 256, 16); (p.nJC > 100, p.JC % 256)
    (True, 0)
    """
    rows = max(1, threads // group)  # rows per block: ``group`` threads share a row
    n_ib = -(-N // rows)
    blocks = B * n_ib
    target = _BLOCKS_PER_SM * sm_count
    nJC, JC = 1, max(M, 1)
    if 0 < blocks < target and M >= 2 * _MIN_CHUNK:
        want = min(-(-target // blocks), M // _MIN_CHUNK,
                   max(1, _MAX_PART_BYTES // max(1, B * N * acc_bytes)))
        if want > 1:
            JC = -(-M // want)
            JC = -(-JC // tile) * tile
            nJC = -(-M // JC)
    if nJC == 1:
        JC = max(M, 1)
    grid = blocks * nJC
    if grid > _MAX_GRID:
        raise ValueError(f"too many rows for one CUDA launch ({B} x {N})")
    merge_grid = -(-B * N * merge_per_row // threads) if nJC > 1 else 0
    part_bytes = B * N * nJC * acc_bytes if nJC > 1 else 0
    return LaunchGrid(threads, nJC, JC, grid, merge_grid, part_bytes)


def ranges_plan(kernel, n_pieces: int, B: int) -> LaunchGrid:
    """The grid of a block-sparse call: the 1D scheme, one block per piece and batch
    element (``n_pieces`` pieces of at most :func:`piece_rows` rows).

    >>> class K: threads = 256
    >>> ranges_plan(K, 10, 3).grid
    30
    """
    grid = B * n_pieces
    if grid > _MAX_GRID:
        raise ValueError(f"too many blocks of rows for one CUDA launch ({B} x {n_pieces})")
    return LaunchGrid(kernel.threads, 1, 0, grid, 0, 0)


def piece_rows(kernel) -> int:
    """Rows per block of ``kernel`` (``group`` threads share a row in wide sums): the
    most rows a piece of a block-sparse call may have.

    >>> class K: threads, layout = 256, {"group": 4}
    >>> piece_rows(K)
    64
    """
    layout = getattr(kernel, "layout", {})
    return max(1, kernel.threads // int(layout.get("group", 1)))


def pack_args(n_vars: int, n_outs: int, var_ptrs: list, out_ptrs: list, part_ptr: int,
              bshape: list, vbs: list, N: int, M: int, nJC: int, JC: int,
              pieces: tuple = (0, 0, 0)) -> list:
    """The words of ``LtArgs`` (one unsigned 64-bit word per field element, in
    ``args_fields`` order): the arguments of the prepared call (format ``"Q" * n``).
    ``pieces``: (pieces pointer, intervals pointer, number of pieces) of a block-sparse
    call (:func:`ranges_plan`)."""
    B = 1
    for s in bshape:
        B *= s
    nvp = max(1, n_vars)
    flat_vbs = [0] * (nvp * MAX_BATCH_DIMS)
    for v, strides in enumerate(vbs):
        for k, s in enumerate(strides):
            flat_vbs[v * MAX_BATCH_DIMS + k] = s
    values = {
        "vars": list(var_ptrs) + [0] * (nvp - len(var_ptrs)),
        "outs": list(out_ptrs),
        "part": [part_ptr],
        "vbs": flat_vbs,
        "bshape": list(bshape) + [1] * (MAX_BATCH_DIMS - len(bshape)),
        "N": [N], "M": [M], "B": [B], "nbd": [len(bshape)], "nJC": [nJC], "JC": [JC],
        "pieces": [pieces[0]], "ivs": [pieces[1]], "npieces": [pieces[2]],
    }
    words = []
    for name, count in args_fields(n_vars, n_outs):
        vals = values[name]
        if len(vals) != count:
            raise ValueError(f"LtArgs.{name}: {len(vals)} values for {count} slots")
        words.extend(vals)
    return [w & 0xFFFFFFFFFFFFFFFF for w in words]



# ---------------------------------------------------------------------------- launch


def _plan_and_layout(kernel, shapes, cats, batch, N, M):
    bshape, vbs = batch_layout(shapes, cats, tuple(batch), MAX_BATCH_DIMS, "the CUDA backend")
    B = 1
    for s in bshape:
        B *= s
    plan = plan_launch(N, M, B, kernel.sm_count, kernel.threads, kernel.tile, kernel.acc_bytes,
                       int(kernel.layout.get("group", 1)),
                       int(kernel.layout.get("merge_per_row", 1)))
    return bshape, vbs, B, plan


def _run(kernel, plan, words, stream) -> None:
    fns = kernel.functions
    if plan.grid > 0:
        fns["reduce"].prepared_async_call((plan.grid, 1, 1), (plan.threads, 1, 1), stream,
                                          *words, shared_size=kernel.smem)
    if plan.nJC > 1:
        fns["merge"].prepared_async_call((plan.merge_grid, 1, 1), (plan.threads, 1, 1), stream,
                                         *words)


def launch_cuda(kernel, arrays: list, cats: list, batch: tuple, N: int, M: int,
                outs: list, ranges=None) -> None:
    """Run ``kernel`` on contiguous torch CUDA tensors (canonical layout) into ``outs``;
    ``ranges``: a :class:`lazytensor.scale.ranges.BlockRanges` (``kernel`` is then the call's
    block-sparse kernel), its pieces and intervals kept on the device between calls."""
    import torch

    bshape, vbs, B, plan = _plan_and_layout(kernel, [a.shape for a in arrays], cats, batch,
                                            N, M)
    part, pieces = None, (0, 0, 0)
    if ranges is not None:
        on_device, intervals = ranges.on(str(outs[0].device), piece_rows(kernel))
        plan = ranges_plan(kernel, on_device.shape[0], B)
        pieces = (on_device.data_ptr(), intervals.data_ptr(), on_device.shape[0])
    elif plan.nJC > 1:
        # from torch's allocator, on torch's current stream: it waits for our stream
        # after the launches, so reusing the buffer there is ordered after them
        part = torch.empty(plan.part_bytes, dtype=torch.uint8, device=outs[0].device)
    words = pack_args(kernel.n_vars, kernel.n_outs, [a.data_ptr() for a in arrays],
                      [o.data_ptr() for o in outs], part.data_ptr() if part is not None else 0,
                      bshape, vbs, N, M, plan.nJC, plan.JC, pieces)
    with streams.launch_scope(kernel.device, kernel.description) as stream:
        _run(kernel, plan, words, stream)


def launch_numpy(kernel, arrays: list, cats: list, batch: tuple, N: int, M: int,
                 outs: list, ranges=None) -> None:
    """Run ``kernel`` on NumPy arrays: copied to the GPU, results copied back into ``outs``
    (``ranges``: as for :func:`launch_cuda`, the pieces copied with the arrays)."""
    drv = driver.pycuda_driver()
    bshape, vbs, B, plan = _plan_and_layout(kernel, [a.shape for a in arrays], cats, batch,
                                            N, M)
    tables = []
    if ranges is not None:
        tables = [ranges.pieces(piece_rows(kernel)), ranges.intervals]
        plan = ranges_plan(kernel, tables[0].shape[0], B)
    with driver.in_context(kernel.device):
        inputs = [drv.to_device(np.ascontiguousarray(a)) for a in arrays]
        results = [drv.mem_alloc(max(o.nbytes, 1)) for o in outs]
        part = drv.mem_alloc(plan.part_bytes) if plan.nJC > 1 else None
        # an empty table still gets a (1-byte) buffer: a valid pointer, never read
        tables = [drv.to_device(t) if t.size else drv.mem_alloc(1) for t in tables]
        pieces = (int(tables[0]), int(tables[1]), plan.grid // max(B, 1)) if tables else (0, 0, 0)
        words = pack_args(kernel.n_vars, kernel.n_outs, [int(a) for a in inputs],
                          [int(r) for r in results], int(part) if part is not None else 0,
                          bshape, vbs, N, M, plan.nJC, plan.JC, pieces)
    with streams.launch_scope(kernel.device, kernel.description, torch_stream=False) as stream:
        _run(kernel, plan, words, stream)
        for o, r in zip(outs, results):
            drv.memcpy_dtoh(o, r)  # on the null stream: after the kernels
    with driver.in_context(kernel.device):
        for buf in inputs + results + tables + ([part] if part is not None else []):
            buf.free()


class CudaExecutor:
    """A call's CUDA kernels bound to its arrays' library: allocates the outputs (torch on
    the call's device, or NumPy) and launches (block-sparse calls: the call's ranged
    kernel, built on first use)."""

    __slots__ = ("call", "launch", "ranged", "spec", "specs")

    def __init__(self, call, specs: list):
        self.call, self.specs = call, specs
        self.spec, self.ranged = call.spec(), call.spec(True)
        self.launch = launch_cuda if call.library == "torch" else launch_numpy

    def _alloc(self) -> list:
        if self.call.library == "torch":
            import torch

            return [torch.empty(shape, dtype=dt, device=self.call.device)
                    for shape, dt in self.specs]
        return [np.empty(shape, dtype=dt) for shape, dt in self.specs]

    def __call__(self, arrays: list, ranges=None) -> list:
        from .loader import get_cuda_kernel

        call = self.call
        kernel = get_cuda_kernel(self.spec if ranges is None else self.ranged, call.device_index)
        outs = self._alloc()
        if call.N > 0 and all(s > 0 for s in call.batch):
            self.launch(kernel, arrays, list(call.cats), call.batch, call.N, call.M, outs, ranges)
        return outs


__all__ = ["CudaExecutor", "LaunchGrid", "launch_cuda", "launch_numpy",
           "pack_args", "piece_rows", "plan_launch", "ranges_plan"]
