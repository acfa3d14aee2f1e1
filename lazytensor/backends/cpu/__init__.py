"""The CPU backend: C++ kernels from :mod:`lazytensor.codegen.cpu`, built with the system
compiler (OpenMP + SIMD), loaded with ctypes and launched on NumPy arrays and torch CPU
tensors through their data pointers.

- :mod:`.runtime`: kernels loaded and launched (threads, the stack budget, fork safety);
- :mod:`.backward`: both sides of a backward in one kernel, and row terms in NumPy;
- :mod:`.doctor`: the compiler, OpenMP and SIMD checks of ``python -m lazytensor doctor``.

>>> from lazytensor.core import backend
>>> backend.get("cpu").auto, backend.get("cpu").tuning.wide
(0, 16)
"""

from __future__ import annotations

from ...core.backend import BackendRuntime


class CpuBackend(BackendRuntime):
    """What ``backend="auto"`` picks for CPU arrays wherever a C++ compiler exists."""

    name = "cpu"
    device = "cpu"
    auto = 0
    needs = "CPU tensors"

    @property
    def tuning(self):
        """The CPU plan's thresholds (:data:`lazytensor.codegen.cpu.TUNING`)."""
        from ...codegen.cpu import TUNING

        return TUNING

    def problem(self) -> str | None:
        from ...codegen.compilers import cpu_compiler

        compiler = cpu_compiler()
        if compiler.available:
            return None
        return f"no C++ compiler found ({compiler.problem}); install g++ or set $CXX"

    def executor(self, call, shapes: tuple, out_specs: list):
        from .runtime import CpuExecutor

        return CpuExecutor(call, [tuple(s) for s in shapes], out_specs)


BACKEND = CpuBackend()
