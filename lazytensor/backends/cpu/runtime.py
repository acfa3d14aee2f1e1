"""The CPU runtime: kernels built with the system C++ compiler, loaded with ctypes, launched.

``get_cpu_kernel(spec)`` returns a loaded kernel: from the in-process table, else from
the disk cache (verified), else rendered, compiled and stored (:mod:`lazytensor.core.kernels`
holds that sequence for every backend). Before that, its memory per thread is checked
against the threads' stacks (:func:`check_stack`): for a kernel on disk from the entry's
metadata, else from the kernel's shape (:func:`planned_shape`, worked out once per spec
and read by the render too). :class:`CpuLaunch` binds a kernel to one layout of its
arguments, so that a repeated call only fills one array of words.

``LAZYTENSOR_DEBUG=1`` prints the cache key and the generated source when a kernel is built.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import math
import os
import re
import sys

import numpy as np

from ... import forks
from ...codegen import reductions
from ...codegen.cpu import HEADER_WORDS, dot_tiling_enabled
from ...core import interrupt
from ...core.batch import batch_layout
from ...core.kernels import KernelSpec, Toolchain, entry_metadata, kernel_binary, load_once


class CpuKernel:
    """A loaded ``lt_run`` with its calling convention (``binary``: a cache.VerifiedBinary)."""

    def __init__(self, binary, spec: KernelSpec):
        self.lib = binary.load(ctypes.CDLL)  # exactly the bytes the cache verified
        fn = self.lib.lt_run
        fn.argtypes = [ctypes.c_void_p]  # one array of words, see codegen.cpu.entry
        fn.restype = ctypes.c_int
        self.fn = fn
        self.spec = spec
        self.outputs = reductions.get(spec.reduction).outputs(spec.formula.dim, spec.opts_dict)
        self.path = str(binary.path)


_table: dict = {}  # KernelSpec -> CpuKernel: the kernels this process has loaded


def get_cpu_kernel(spec: KernelSpec) -> "CpuKernel":
    """The loaded kernel of ``spec`` (built and cached on first use)."""
    return load_once(_table, spec, lambda: _load_or_build_cpu(spec))


# Each thread that runs a CPU kernel holds its work on its stack (the tile of terms, the
# formula's node arrays that fit, the accumulators; see codegen.cpu.stack): beyond the
# thread's stack (8 MB by default for the main thread, Python threads and OpenMP workers
# alike; less where ulimit -s, threading.stack_size or OMP_STACKSIZE say so) the process
# dies. Such formulas are refused before compiling, with a message that says why. The
# values too large for the stack live in a per-thread heap buffer, within _HEAP_BUDGET.
_STACK_BUDGET = 6 << 20
_HEAP_BUDGET = 1 << 30


_STACKSIZE = re.compile(r"\s*(\d+)\s*([bkmgBKMG]?)\s*")
_STACKSIZE_UNITS = {"b": 0, "k": 10, "": 10, "m": 20, "g": 30}


def _omp_stacksize() -> int | None:
    """Bytes of stack of an OpenMP thread as libgomp reads them: ``$OMP_STACKSIZE``, else
    ``$GOMP_STACKSIZE``: a positive number with an optional B/K/M/G suffix, kilobytes by
    default. libgomp ignores (with a warning) an invalid value, a negative one among them,
    and so do we: None when neither variable holds a valid value."""
    for name in ("OMP_STACKSIZE", "GOMP_STACKSIZE"):
        match = _STACKSIZE.fullmatch(os.environ.get(name, ""))
        if match:
            size = int(match[1]) << _STACKSIZE_UNITS[match[2].lower()]
            if size > 0:
                return size
    return None


def stack_budget() -> int:
    """Bytes of stack a CPU kernel may use per thread: 3/4 of the smallest stack its threads
    can have (``ulimit -s``, ``threading.stack_size()``, ``$OMP_STACKSIZE``), at most 6 MB."""
    sizes = [_STACK_BUDGET * 4 // 3]
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
        if soft != resource.RLIM_INFINITY and soft > 0:
            sizes.append(soft)
    except (ImportError, OSError, ValueError):  # pragma: no cover - not POSIX
        pass
    import threading

    if threading.stack_size():
        sizes.append(threading.stack_size())
    omp = _omp_stacksize()
    if omp:
        sizes.append(omp)
    return min(sizes) * 3 // 4


@functools.lru_cache(maxsize=256)
def planned_shape(spec: KernelSpec, dot_tiling: bool):
    """The shape of ``spec``'s kernel (:func:`lazytensor.codegen.cpu.kernel.cpu_kernel_shape`):
    planned once per spec and setting, read by the stack check and by the render."""
    from ...codegen.cpu import kernel

    return kernel.cpu_kernel_shape(spec.formula, list(spec.var_specs), spec.reduction,
                                   spec.dtype, dot_tiling)


def kernel_memory(spec: KernelSpec) -> dict:
    """``{"stack", "heap", "largest"}``: the bytes per thread ``spec``'s kernel needs on its
    stack and in its heap buffer, and what takes most of the stack (from its shape)."""
    from ...codegen.cpu.stack import kernel_memory as memory

    mem = memory(planned_shape(spec, dot_tiling_enabled()), spec.reduction, spec.opts_dict,
                 spec.ranged)
    return {"stack": mem.stack, "heap": mem.heap, "largest": mem.largest_part()}


def check_stack(spec: KernelSpec, tools: Toolchain | None = None) -> dict:
    """Raise ValueError for a kernel too large for a thread's stack, or whose intermediate
    values need more than 1 GB per thread (before anything is compiled). Returns the
    kernel's :func:`kernel_memory`: with ``tools`` (its toolchain), that of a kernel on
    disk is read from its entry's metadata (nothing planned), else it is planned."""
    stored = entry_metadata(tools, spec).get("memory") if tools is not None else None
    mem = stored if _is_memory(stored) else kernel_memory(spec)
    budget = stack_budget()
    opts = f" with {', '.join(f'{k}={v}' for k, v in spec.opts)}" if spec.opts else ""
    what = (f"formula too large for a CPU kernel: {spec.reduction}{opts} of a formula of "
            f"dimension {spec.formula.dim}")
    if mem["stack"] > budget:
        raise ValueError(
            f"{what} needs about {-(-mem['stack'] >> 20)} MB of stack per thread (at most "
            f"{budget / (1 << 20):.1f} MB here; most of it for its {mem['largest']}); "
            "reduce fewer components at once (slice the formula, or use a smaller K)")
    if mem["heap"] > _HEAP_BUDGET:
        raise ValueError(
            f"{what} needs {mem['heap'] >> 20} MB per thread for its intermediate values (at "
            f"most {_HEAP_BUDGET >> 20} MB); split it into smaller pieces")
    return mem


def _is_memory(value) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("stack"), int)
            and isinstance(value.get("heap"), int) and isinstance(value.get("largest"), str))


def cpu_toolchain(render=None, key_extra: dict | None = None, label: str = "kernel") -> Toolchain:
    """The CPU backend: the system C++ compiler, ``lt_run`` in ``kernel.so``. ``render``
    (spec -> C++ source; default: the reduction kernel of the spec's planned shape),
    ``key_extra`` (more settings in the key) and ``label`` serve other kernels built the
    same way (the two-sided one)."""
    from ...codegen.compilers import cpu_compiler
    from ...codegen.cpu.kernel import render_planned

    compiler = cpu_compiler()
    if not compiler.available:
        raise compiler.not_found()
    dot_tiling = dot_tiling_enabled()
    if render is None:
        def render(spec):
            return render_planned(planned_shape(spec, dot_tiling), spec.reduction,
                                  spec.opts_dict, spec.ranged)
    return Toolchain(
        "cpu", "kernel.so", compiler.identity(), render=render,
        compile=lambda source, workdir, what: compiler.compile(source, workdir, "kernel", what),
        key_extra={"dot_tiling": dot_tiling, **(key_extra or {})}, label=label)


def _load_or_build_cpu(spec: KernelSpec) -> CpuKernel:
    tools = cpu_toolchain()
    memory = check_stack(spec, tools)  # kept in the entry: a later process plans nothing
    tools = dataclasses.replace(tools, meta={**tools.meta, "memory": memory})
    return CpuKernel(kernel_binary(tools, spec), spec)


def _threads_for_launch() -> int:
    """``num_threads()``, remembering that OpenMP threads exist from now on."""
    threads = num_threads()
    if threads > 1:
        forks.note_threads_started()
    return threads


def num_threads() -> int:
    """Threads per kernel: ``$LAZYTENSOR_NUM_THREADS``, torch's setting, or the CPUs we may use;
    1 in a child forked where an OpenMP pool may have existed (:mod:`lazytensor.forks`)."""
    if forks.forked_where_pool_may_exist():
        return 1
    env = os.environ.get("LAZYTENSOR_NUM_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"LAZYTENSOR_NUM_THREADS must be an integer, got {env!r}") from None
    torch = sys.modules.get("torch")
    if torch is not None:
        return max(1, torch.get_num_threads())
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


_SMALL_WORK = 1 << 18  # pairs (~0.1 ms on one core) below which threads cost more than they give


class CpuLaunch:
    """A kernel bound to one layout of its arguments: all of ``lt_run``'s arguments but
    the data pointers, the thread count and the block-sparse pattern are computed once,
    so a repeated call only fills one array of words.

    ``tables``: the header words after ``jchunk`` for a full product (``&bshape, &vbs,
    &vnb, nblocks = -1, 0, 0, &stop`` with a stop word that is never set)."""

    __slots__ = ("B", "M", "N", "_keep", "args_type", "fn", "nbd", "rows", "tables", "work")

    def __init__(self, kernel: CpuKernel, shapes: list, cats: list, batch: tuple, N: int,
                 M: int):
        nv = len(shapes)
        dims, strides = batch_layout(shapes, cats, tuple(batch))
        nbd = len(dims)
        vbs = (ctypes.c_int64 * max(1, nv * nbd))()
        vnb = (ctypes.c_int64 * max(1, nv))()
        for v, (shape, cat) in enumerate(zip(shapes, cats)):
            tail = 2 if cat in ("i", "j") else 1
            block = math.prod(shape[len(shape) - tail:])  # the kernel counts (rows, dim) blocks
            for k in range(nbd):
                vbs[v * nbd + k] = strides[v][k] // max(block, 1)
            vnb[v] = math.prod(shape[:len(shape) - tail])
        bshape = (ctypes.c_int64 * max(1, nbd))(*(dims if dims else (1,)))
        B = 1
        for s in batch:
            B *= s
        self.fn = kernel.fn
        self.N, self.M, self.nbd, self.B = N, M, nbd, B
        self.work, self.rows = B * N * max(M, 1), B * N
        self.args_type = ctypes.c_int64 * (HEADER_WORDS + nv + len(kernel.outputs))
        self._keep = (bshape, vbs, vnb)
        self.tables = tuple(ctypes.addressof(t) for t in (bshape, vbs, vnb)) + (
            -1, 0, 0, interrupt.NEVER)

    def __call__(self, arrays: list, outs: list, ptr, ranges=None) -> None:
        """Run on contiguous ``arrays`` into preallocated ``outs`` (``ptr``: data address),
        block-sparse with ``ranges`` (:class:`lazytensor.scale.ranges.BlockRanges`)."""
        threads, jchunk, tables = 1, 0, self.tables
        if ranges is None:
            work = self.work
        else:
            work = self.B * max(ranges.pairs, self.N)
            tables = tables[:3] + (len(ranges.blocks), ranges.blocks.ctypes.data,
                                   ranges.intervals.ctypes.data, interrupt.NEVER)
        if work >= _SMALL_WORK:
            threads = _threads_for_launch()
            # split j when there are too few rows to share out (one query vs many points)
            if threads > 1 and self.rows < 8 * threads and self.M >= 8192:
                pieces = -(-8 * threads // max(self.rows, 1))
                jchunk = max(2048, -(-self.M // pieces))
        words = (self.N, self.M, self.nbd, threads, jchunk)
        pointers = [ptr(a) for a in arrays] + [ptr(o) for o in outs]
        if work >= interrupt.INTERRUPTIBLE_WORK and interrupt.can_interrupt():
            status = interrupt.run(self.fn, lambda stop: self.args_type(
                *words, *tables[:6], stop, *pointers))
        else:
            args = self.args_type(*words, *tables, *pointers)
            status = self.fn(ctypes.addressof(args))
        if status & 1:
            raise MemoryError("a CPU kernel could not allocate its work buffers")
        if status:
            raise KeyboardInterrupt


class CpuExecutor:
    """A CPU kernel bound to one layout of its arrays: allocates the outputs and launches
    (block-sparse calls: the call's ranged kernel, loaded on first use)."""

    __slots__ = ("call", "empty", "launch", "ptr", "ranged", "shapes", "specs")

    def __init__(self, call, shapes: list, specs: list):
        self.call, self.shapes, self.specs = call, shapes, specs
        self.launch, self.ranged = self._launch(False), None
        if call.library == "torch":
            import torch

            self.empty, self.ptr = torch.empty, _torch_ptr
        else:
            self.empty, self.ptr = np.empty, _numpy_ptr

    def _launch(self, ranged: bool) -> CpuLaunch:
        call = self.call
        return CpuLaunch(get_cpu_kernel(call.spec(ranged)), self.shapes,
                                 list(call.cats), call.batch, call.N, call.M)

    def __call__(self, arrays: list, ranges=None) -> list:
        outs = [self.empty(shape, dtype=dt) for shape, dt in self.specs]
        launch = self.launch
        if ranges is not None:
            launch = self.ranged
            if launch is None:
                launch = self.ranged = self._launch(True)
        if launch.rows > 0:
            launch(arrays, outs, self.ptr, ranges)
        return outs


def _torch_ptr(a) -> int:
    return a.data_ptr()


def _numpy_ptr(a) -> int:
    return a.ctypes.data
