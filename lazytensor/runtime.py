"""Where codegen and cache meet: kernel keys, builds, loads and launches.

``get_cpu_kernel(spec)`` returns a loaded kernel: from the in-process table, else from
the disk cache (verified), else rendered, compiled and stored. A repeated call with an
already-built kernel runs neither sympy nor codegen: the table is keyed by the
formula's structural key and the call's static options.

``LAZYTENSOR_DEBUG=1`` prints the cache key and the generated source when a kernel is built.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from codegen import ir, reductions
from codegen.render_c import VarSpec

CACHE_FORMAT = "lazytensor-kernel-3"


@dataclass(frozen=True)
class KernelSpec:
    """Everything static about a kernel: formula, variables, reduction, options, dtype."""

    formula: ir.Node
    var_specs: tuple  # of VarSpec
    reduction: str
    opts: tuple  # sorted (name, value) pairs
    dtype: str

    @property
    def opts_dict(self) -> dict:
        return dict(self.opts)

    def key(self, backend: str, identity: dict) -> str:
        text = json.dumps({
            "format": CACHE_FORMAT,
            "formula": self.formula.key,
            "vars": [(v.index, v.dim, v.cat) for v in self.var_specs],
            "reduction": self.reduction,
            "opts": [list(o) for o in self.opts],
            "dtype": self.dtype,
            "backend": backend,
            "toolchain": identity,
            "codegen": codegen_fingerprint(),
        }, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def codegen_fingerprint() -> str:
    """sha256 over the code generator's sources: a changed renderer never reuses old binaries."""
    import codegen

    h = hashlib.sha256()
    root = Path(codegen.__file__).parent
    for path in sorted(root.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


class CpuKernel:
    """A loaded ``lt_run`` with its calling convention."""

    def __init__(self, path: str, spec: KernelSpec):
        self.lib = ctypes.CDLL(path)
        fn = self.lib.lt_run
        P = ctypes.c_void_p
        fn.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int, P, P, P, P, P, ctypes.c_int,
                       ctypes.c_int64]
        fn.restype = ctypes.c_int
        self.fn = fn
        self.spec = spec
        self.outputs = reductions.get(spec.reduction).outputs(spec.formula.dim, spec.opts_dict)
        self.path = path


_table: dict = {}
_table_lock = threading.Lock()
_build_locks: dict = {}


def _debug() -> bool:
    return os.environ.get("LAZYTENSOR_DEBUG", "") not in ("", "0")


def get_cpu_kernel(spec: KernelSpec) -> CpuKernel:
    kernel = _table.get(spec)
    if kernel is not None:
        return kernel
    with _table_lock:
        lock = _build_locks.setdefault(spec, threading.Lock())
    with lock:
        kernel = _table.get(spec)
        if kernel is None:
            kernel = _load_or_build_cpu(spec)
            _table[spec] = kernel
    return kernel


def _load_or_build_cpu(spec: KernelSpec) -> CpuKernel:
    from cache import default_cache
    from codegen.compilers import cpu_compiler

    compiler = cpu_compiler()
    if not compiler.available:
        from codegen.compilers import CompilerNotFound

        raise CompilerNotFound("no C++ compiler found (set $CXX or install g++)")
    key = spec.key("cpu", compiler.identity())
    cache = default_cache()
    path = cache.lookup(key)
    if path is None:
        def build(tmpdir):
            from codegen.render_c import render_cpu_kernel

            source = render_cpu_kernel(spec.formula, list(spec.var_specs), spec.reduction,
                                       spec.opts_dict, spec.dtype)
            if _debug():
                print(f"[lazytensor] building kernel {key}\n{source}", file=sys.stderr)
            compiler.compile(source, tmpdir, "kernel",
                             what=f"{spec.reduction} of {ir.to_text(spec.formula)[:300]}")
            return {"reduction": spec.reduction, "dtype": spec.dtype,
                    "formula": ir.to_text(spec.formula)[:500]}

        path = cache.get_or_build(key, build)
    elif _debug():
        print(f"[lazytensor] loaded kernel {key} from {path}", file=sys.stderr)
    return CpuKernel(str(path), spec)


def num_threads() -> int:
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


_SMALL_WORK = 1 << 16  # pairs below which threads cost more than they give


def launch_cpu(kernel: CpuKernel, arrays: list, cats: list, batch: tuple, N: int, M: int,
               outs: list, ptr) -> None:
    """Run ``kernel`` on contiguous arrays (canonical layout) into preallocated outputs.

    ``ptr(a)`` gives an array's data address (NumPy or torch).
    """
    nbd = len(batch)
    nv = len(arrays)
    B = 1
    for s in batch:
        B *= s
    vbs = np.zeros(max(1, nv * nbd), dtype=np.int64)
    vnb = np.ones(max(1, nv), dtype=np.int64)
    keep = []
    ptrs = (ctypes.c_void_p * max(1, nv))()
    for v, (a, cat) in enumerate(zip(arrays, cats)):
        ptrs[v] = ptr(a)
        shape = tuple(a.shape)
        own = shape[:-2] if cat in ("i", "j") else shape[:-1]
        own = (1,) * (nbd - len(own)) + tuple(own)
        block = 1
        for s in shape[len(shape) - (2 if cat in ("i", "j") else 1):]:
            block *= s
        stride = block
        nb = 1
        for k in range(nbd - 1, -1, -1):
            vbs[v * nbd + k] = 0 if own[k] == 1 else stride
            stride *= own[k]
            nb *= own[k]
        vnb[v] = nb
    bshape = np.asarray(batch if batch else (1,), dtype=np.int64)
    outp = (ctypes.c_void_p * len(outs))(*[ptr(o) for o in outs])
    threads = num_threads() if B * N * max(M, 1) >= _SMALL_WORK else 1
    jchunk = 0
    rows = B * N
    if threads > 1 and rows < 8 * threads and M >= 8192:
        pieces = -(-8 * threads // max(rows, 1))
        jchunk = max(2048, -(-M // pieces))
    keep.append((vbs, vnb, bshape))
    status = kernel.fn(N, M, nbd, bshape.ctypes.data, ctypes.addressof(ptrs), vbs.ctypes.data,
                       vnb.ctypes.data, ctypes.addressof(outp), threads, jchunk)
    if status != 0:
        raise MemoryError(f"kernel {kernel.spec.reduction} could not allocate its work buffers")
