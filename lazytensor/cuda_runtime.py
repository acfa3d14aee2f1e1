"""CUDA kernels: build (nvcc, through the disk cache), load (driver API), plan, launch.

``get_cuda_kernel(spec, "cuda:0")`` returns the kernel of a :class:`~lazytensor.runtime.
KernelSpec` loaded on that device: from the in-process table, else from the disk cache
(the key covers the device's ``sm_XX`` and nvcc's identity), else rendered by
:func:`codegen.render_cuda.render_cuda_kernel`, compiled and stored.
:func:`launch_cuda` runs it on torch's current stream, with torch-allocated outputs, and
picks the scheme: one thread per row (1D) when there are enough rows to fill the
device, else the split-j scheme (partial accumulators in a torch-allocated buffer,
then a merge kernel). See :mod:`codegen.render_cuda` for the kernels and their ABI.

Nothing CUDA-related is loaded until the first CUDA tensor reaches a reduction; the
driver is reached through ctypes (:mod:`lazytensor.cuda_driver`), so a CPU-only install
needs nothing more. ``LAZYTENSOR_CUDA_SYNC=1`` synchronizes after every launch so that
an error in a kernel is reported by the call that caused it.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

from .codegen import reductions
from .codegen.render_cuda import MAX_BATCH_DIMS, THREADS, args_fields, tile_rows
from .kernels import Backend, KernelSpec, kernel_binary, load_once

KERNEL_NAME = "lt"  # symbols lt_reduce, lt_merge, lt_acc
_BLOCKS_PER_SM = 4  # blocks per multiprocessor the split-j scheme aims for
_MIN_CHUNK = 1024  # fewest j per chunk in the split-j scheme
_MAX_PART_BYTES = 256 << 20  # partial accumulators of the split-j scheme
_MAX_GRID = 2**31 - 1


# ---------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class LaunchPlan:
    """Grid of one reduction: ``nJC == 1`` is the 1D scheme, ``nJC > 1`` split-j."""

    threads: int
    nJC: int
    JC: int
    grid: int
    merge_grid: int
    part_bytes: int


def plan_launch(N: int, M: int, B: int, sm_count: int, threads: int, tile: int,
                acc_bytes: int) -> LaunchPlan:
    """Choose the scheme: split j only when the row blocks cannot fill the device.

    >>> plan_launch(10**6, 10**6, 1, 132, 256, 256, 16).nJC
    1
    >>> p = plan_launch(100, 10**6, 1, 132, 256, 256, 16); (p.nJC > 100, p.JC % 256)
    (True, 0)
    """
    n_ib = -(-N // threads)
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
    merge_grid = -(-B * N // threads) if nJC > 1 else 0
    part_bytes = B * N * nJC * acc_bytes if nJC > 1 else 0
    return LaunchPlan(threads, nJC, JC, grid, merge_grid, part_bytes)


def batch_layout(shapes: list, cats: list, batch: tuple) -> tuple[list, list]:
    """``(bshape, vbs)`` for variables of canonical contiguous ``shapes``.

    ``vbs[v][k]`` is variable v's element stride along batch dim k (0 where it is
    broadcast). Batch dims of size 1 are dropped and neighbours that every variable
    walks alike are merged, so that at most ``MAX_BATCH_DIMS`` remain.

    >>> batch_layout([(2, 3, 5, 4), (1, 3, 7, 4)], ["i", "j"], (2, 3))
    ([2, 3], [[60, 20], [0, 28]])
    >>> batch_layout([(2, 3, 5, 4), (2, 3, 7, 4)], ["i", "j"], (2, 3))
    ([6], [[20], [28]])
    """
    nbd = len(batch)
    vbs = []
    for shape, cat in zip(shapes, cats):
        shape = tuple(shape)
        tail = 2 if cat in ("i", "j") else 1
        own = shape[: len(shape) - tail]
        own = (1,) * (nbd - len(own)) + tuple(own)
        stride = 1
        for s in shape[len(shape) - tail:]:
            stride *= s
        strides = [0] * nbd
        for k in range(nbd - 1, -1, -1):
            strides[k] = 0 if own[k] == 1 else stride
            stride *= own[k]
        vbs.append(strides)
    dims = [k for k in range(nbd) if batch[k] != 1]
    bshape = [batch[k] for k in dims]
    vbs = [[s[k] for k in dims] for s in vbs]
    k = len(bshape) - 2
    while k >= 0:  # merge dim k+1 into dim k where every variable allows it
        if all(s[k] == s[k + 1] * bshape[k + 1] for s in vbs):
            bshape[k] *= bshape.pop(k + 1)
            for s in vbs:
                s[k] = s.pop(k + 1)
        k -= 1
    if len(bshape) > MAX_BATCH_DIMS:
        raise ValueError(f"the CUDA backend takes at most {MAX_BATCH_DIMS} batch dimensions "
                         f"that cannot be merged, got batch shape {tuple(batch)}")
    return bshape, vbs


def pack_args(n_vars: int, n_outs: int, var_ptrs: list, out_ptrs: list, part_ptr: int,
              bshape: list, vbs: list, N: int, M: int, nJC: int, JC: int,
              pieces: tuple = (0, 0, 0)) -> ctypes.Array:
    """The bytes of ``LtArgs`` (one 8-byte word per field element, in ``args_fields`` order);
    ``pieces``: ``(pieces pointer, intervals pointer, number of pieces)`` of a
    block-sparse call."""
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
    return (ctypes.c_uint64 * len(words))(*words)


# ---------------------------------------------------------------------------- kernels


class CudaKernel:
    """A kernel loaded on one device: its functions and what the planner needs."""

    def __init__(self, spec: KernelSpec, device: int, image: bytes):
        from .cuda_driver import CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, driver

        self.spec, self.device = spec, device
        self.drv = drv = driver()
        self.n_vars = max([v.index + 1 for v in spec.var_specs] + [1])
        self.n_outs = len(reductions.get(spec.reduction).outputs(spec.formula.dim,
                                                                 spec.opts_dict))
        self.tile = tile_rows(spec.var_specs, spec.dtype) or 256
        self.sm_count = drv.sm_count(device)
        with drv.in_context(device):
            self.module = drv.load_module(image)
            self.functions = {k: drv.function(self.module, f"{KERNEL_NAME}_{k}")
                              for k in ("reduce", "merge")}
            self.acc_bytes = drv.global_size(self.module, f"{KERNEL_NAME}_acc")
            limit = min(drv.function_attribute(f, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
                        for f in self.functions.values())
        self.threads = max(32, min(THREADS, limit) // 32 * 32)

    def launch(self, which: str, grid: int, threads: int, args) -> None:
        """Launch ``<which>`` on torch's current stream of this device."""
        import torch

        stream = torch.cuda.current_stream(self.device).cuda_stream
        what = f"the {self.spec.reduction} kernel ({which})"
        with self.drv.in_context(self.device):
            self.drv.launch(self.functions[which], grid, threads, stream, args, what)
            if os.environ.get("LAZYTENSOR_CUDA_SYNC", "") not in ("", "0"):
                self.drv.synchronize(stream, what)


_table: dict = {}


def device_index(device) -> int:
    """``"cuda:1"`` -> 1; ``"cuda"`` -> torch's current device."""
    text = str(device)
    if ":" in text:
        return int(text.split(":", 1)[1])
    import torch

    return torch.cuda.current_device()


def get_cuda_kernel(spec: KernelSpec, device) -> CudaKernel:
    """The kernel of ``spec`` loaded on ``device`` (built and cached on first use)."""
    index = device_index(device)
    return load_once(_table, (spec, index), lambda: CudaKernel(spec, index, _cubin(spec, index)))


def _cubin(spec: KernelSpec, index: int) -> bytes:
    from .codegen.compilers import CompilerNotFound, compile_cuda, cuda_identity
    from .cuda_driver import driver

    major, minor = driver().compute_capability(index)
    arch = f"sm_{major}{minor}"
    try:
        identity = cuda_identity(arch)
    except CompilerNotFound as e:
        raise RuntimeError(f"{e}: the CUDA backend compiles its kernels with nvcc; install "
                           "the CUDA toolkit, or move the inputs to the CPU with .cpu()") from e
    from .codegen.render_cuda import render_cuda_kernel

    backend = Backend(
        "cuda", "kernel.cubin", identity,
        render=lambda spec: render_cuda_kernel(spec.formula, list(spec.var_specs), spec.reduction,
                                               spec.opts_dict, spec.dtype, name=KERNEL_NAME),
        compile=lambda source, tmpdir, what: compile_cuda(source, tmpdir, arch, "kernel", what=what),
        meta={"arch": arch}, label="CUDA kernel", detail=f" for {arch}")
    return kernel_binary(backend, spec).data  # exactly the bytes the cache verified


# ---------------------------------------------------------------------------- launch


def launch_cuda(kernel, arrays: list, cats: list, batch: tuple, N: int, M: int,
                outs: list, ranges=None) -> None:
    """Run ``kernel`` on contiguous torch tensors (canonical layout) into ``outs``.

    ``kernel`` is a :class:`CudaKernel` (or anything with its attributes and ``launch``:
    the tests run the skeleton on the host that way). ``ranges``: a
    :class:`lazytensor.ranges.BlockRanges` (block-sparse; one block of threads per piece
    of a block of rows, the 1D scheme).
    """
    import torch

    bshape, vbs = batch_layout([a.shape for a in arrays], cats, tuple(batch))
    B = 1
    for s in bshape:
        B *= s
    if ranges is not None:
        return _launch_ranges(kernel, arrays, bshape, vbs, B, N, M, outs, ranges)
    plan = plan_launch(N, M, B, kernel.sm_count, kernel.threads, kernel.tile,
                       kernel.acc_bytes)
    part = None
    if plan.nJC > 1:
        part = torch.empty(plan.part_bytes, dtype=torch.uint8, device=outs[0].device)
    args = pack_args(kernel.n_vars, kernel.n_outs, [a.data_ptr() for a in arrays],
                     [o.data_ptr() for o in outs], part.data_ptr() if part is not None else 0,
                     bshape, vbs, N, M, plan.nJC, plan.JC)
    kernel.launch("reduce", plan.grid, plan.threads, args)
    if plan.nJC > 1:
        kernel.launch("merge", plan.merge_grid, plan.threads, args)
    # `part` goes back to torch's caching allocator, which reuses it only for work
    # queued after these kernels on the same stream.


def _launch_ranges(kernel, arrays, bshape, vbs, B, N, M, outs, ranges) -> None:
    pieces, ivs = ranges.on(str(outs[0].device), kernel.threads)
    n = pieces.shape[0]
    if B * n > _MAX_GRID:
        raise ValueError(f"too many blocks of rows for one CUDA launch ({B} x {n})")
    args = pack_args(kernel.n_vars, kernel.n_outs, [a.data_ptr() for a in arrays],
                     [o.data_ptr() for o in outs], 0, bshape, vbs, N, M, 1, max(M, 1),
                     (pieces.data_ptr(), ivs.data_ptr(), n))
    if B * n > 0:
        kernel.launch("reduce", B * n, kernel.threads, args)


__all__ = [
    "CudaKernel",
    "LaunchPlan",
    "batch_layout",
    "get_cuda_kernel",
    "launch_cuda",
    "pack_args",
    "plan_launch",
]
