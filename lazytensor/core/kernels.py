"""Kernels: what one is, its cache key, and the build-and-load sequence of every backend.

A :class:`KernelSpec` is everything static about a kernel. A :class:`Toolchain` says how
one backend turns a spec into a binary: its renderer (``render``) and compiler
(``compile``), its name and the compiler's identity (both in the key), the file the build
leaves. The two steps every backend's loader shares are here, once:

- :func:`kernel_binary`: key, disk-cache read (verified bytes), else render and compile
  into the cache (``LAZYTENSOR_DEBUG=1`` prints the key and the source; a slow compile
  is logged through :func:`lazytensor.core.progress.compile_notice`);
- :func:`load_once`: the in-process table in front of it, one build per key even when
  threads ask at the same time;
- :func:`entry_metadata`: what a build recorded in a kernel's cache entry (the CPU
  backend's stack requirement), read without loading or rebuilding anything.

The CPU runtime (:mod:`lazytensor.backends.cpu.runtime`) and the CUDA loader
(:mod:`lazytensor.backends.cuda.loader`) each give their toolchain and their ``load``.

>>> from lazytensor.codegen import ir
>>> spec = KernelSpec(ir.var(0, 1, "i"), (), "sum", (), "float32")
>>> len(spec.key("cpu", {"compiler": "g++"}))
64
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..codegen import ir
from .progress import compile_notice

CACHE_FORMAT = "lazytensor-kernel-4"


@dataclass(frozen=True)
class KernelSpec:
    """Everything static about a kernel: formula, variables, reduction, options, dtype."""

    formula: ir.Node
    var_specs: tuple  # of codegen VarSpec
    reduction: str
    opts: tuple  # sorted (name, value) pairs
    dtype: str
    ranged: bool = False  # the kernel of block-sparse calls (see lazytensor.scale.ranges)

    @property
    def opts_dict(self) -> dict:
        return dict(self.opts)

    def key(self, backend: str, identity: dict, extra: dict | None = None) -> str:
        """sha256 over the spec, the backend, its toolchain identity, ``extra`` (settings
        the renderer reads) and the code generator's sources."""
        text = json.dumps({
            "format": CACHE_FORMAT,
            "formula": self.formula.key,
            "vars": [(v.index, v.dim, v.cat) for v in self.var_specs],
            "reduction": self.reduction,
            "opts": [list(o) for o in self.opts],
            "dtype": self.dtype,
            "backend": backend,
            **({"ranged": True} if self.ranged else {}),
            **(extra or {}),
            "toolchain": identity,
            "codegen": codegen_fingerprint(),
        }, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


@functools.cache
def codegen_fingerprint() -> str:
    """sha256 over the code generator's sources: a changed renderer never reuses old binaries."""
    from .. import codegen

    h = hashlib.sha256()
    root = Path(codegen.__file__).parent
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Toolchain:
    """How a backend builds a kernel file: ``render(spec) -> source`` and
    ``compile(source, workdir, what) -> path of artifact``; ``identity`` (compiler, flags,
    target) and ``key_extra`` (settings the renderer reads) go into the key, ``meta`` into
    the cache entry's metadata; ``label`` and ``detail`` into the debug messages."""

    name: str
    artifact: str
    identity: dict
    render: Callable
    compile: Callable
    key_extra: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    label: str = "kernel"
    detail: str = ""


def debug() -> bool:
    """``LAZYTENSOR_DEBUG`` is set (and not 0): print keys and generated sources."""
    return os.environ.get("LAZYTENSOR_DEBUG", "") not in ("", "0")


def kernel_binary(tools: Toolchain, spec: KernelSpec):
    """``spec``'s kernel built by ``tools`` as a :class:`lazytensor.cache.VerifiedBinary` (load
    exactly its bytes): from the disk cache, else rendered, compiled and stored (once
    across threads and processes)."""
    from ..cache import default_cache
    from ..codegen.compilers import build_lock_timeout

    key = spec.key(tools.name, tools.identity, tools.key_extra)
    cache = default_cache()
    binary = cache.read(key, tools.artifact)
    if binary is None:
        def build(tmpdir):
            started = time.perf_counter()
            source = tools.render(spec)
            if debug():
                print(f"[lazytensor] building {tools.label} {key}{tools.detail}\n{source}",
                      file=sys.stderr)
            tools.compile(source, tmpdir, f"{spec.reduction} of {ir.to_text(spec.formula)[:300]}")
            where = "" if tools.name == "cpu" else f"{tools.name} "
            compile_notice(f"{where}{spec.dtype} {spec.reduction} of {ir.to_text(spec.formula)}",
                           time.perf_counter() - started)
            return {"reduction": spec.reduction, "dtype": spec.dtype, **tools.meta,
                    "formula": ir.to_text(spec.formula)[:500]}

        binary = cache.read_or_build(key, build, tools.artifact,
                                     lock_timeout=build_lock_timeout())
    elif debug():
        print(f"[lazytensor] loaded {tools.label} {key} from {binary.path}", file=sys.stderr)
    return binary


def entry_metadata(tools: Toolchain, spec: KernelSpec) -> dict:
    """The metadata the build of ``spec`` by ``tools`` left in its cache entry (what the
    build returned, with ``tools.meta``), or ``{}`` when the kernel is not on disk. The
    binary is neither read nor checked here (:func:`kernel_binary` does that)."""
    from ..cache import default_cache

    meta = default_cache().read_meta(spec.key(tools.name, tools.identity, tools.key_extra))
    extra = meta.get("extra") if meta else None
    return extra if isinstance(extra, dict) else {}


_locks_lock = threading.Lock()
_build_locks: dict = {}


def _reset_in_child() -> None:
    # A build another thread had under way at fork time goes on in the parent only: its
    # locks would stay held in the child forever. The child builds (or, once the parent
    # has stored it, loads) such a kernel itself; the disk cache's lock orders the two.
    global _locks_lock, _build_locks
    _locks_lock = threading.Lock()
    _build_locks = {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)


def load_once(table: dict, key, load: Callable):
    """``table[key]``, filled by ``load()`` on a miss; threads asking for the same key
    at the same time wait for one load (a child forked meanwhile does not: see
    :func:`_reset_in_child`)."""
    kernel = table.get(key)
    if kernel is not None:
        return kernel
    with _locks_lock:
        lock = _build_locks.setdefault((id(table), key), threading.Lock())
    with lock:
        kernel = table.get(key)
        if kernel is None:
            kernel = load()
            table[key] = kernel
    return kernel
