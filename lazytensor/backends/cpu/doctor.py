"""The CPU backend's part of ``python -m lazytensor doctor``: the C++ compiler and its
version, OpenMP and the SIMD level (a test compile with the kernels' own flags, timed),
and one real kernel built in a private temporary cache, checked against NumPy.

>>> [c.name for c in checks(kernel=False)]
['C++ compiler', 'test compile', 'OpenMP', 'SIMD']
"""

from __future__ import annotations

import ctypes
import os
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

from ...core.checks import Check, first_line, run_tool

NAMES = ("C++ compiler", "test compile", "OpenMP", "SIMD", "first kernel")  # its checks, in report order

INSTALL_CXX = ("install a C++ compiler: `sudo apt-get install g++` (Debian/Ubuntu), `sudo dnf "
               "install gcc-c++` (Fedora), `xcode-select --install` (macOS); or set $CXX to one. "
               "Until then reductions fall back to the slow NumPy reference, with a warning")

# Built with the kernels' exact command line: OpenMP threads and the SIMD level it targets.
_PROBE = r"""
#include <omp.h>
extern "C" int lt_probe_threads(void) {
  int n = 0;
#pragma omp parallel
  {
#pragma omp atomic
    n += 1;
  }
  return n;
}
extern "C" const char* lt_probe_simd(void) {
#if defined(__AVX512F__)
  return "AVX-512";
#elif defined(__AVX2__)
  return "AVX2";
#elif defined(__AVX__)
  return "AVX";
#elif defined(__SSE4_2__)
  return "SSE4.2";
#elif defined(__ARM_FEATURE_SVE)
  return "SVE";
#elif defined(__ARM_NEON)
  return "NEON";
#else
  return "none (scalar code)";
#endif
}
"""



def check_compiler():
    """The C++ compiler the kernels use (``$CXX``, a command, else g++/c++/clang++) and its
    version; ``(check, compiler or None)``."""
    from ...codegen.compilers import CpuCompiler

    compiler = CpuCompiler()
    if not compiler.available:
        fix = "fix or unset $CXX" if os.environ.get("CXX", "").strip() else INSTALL_CXX
        return Check("C++ compiler", "fail", compiler.problem or "not found", fix), None
    try:
        version = first_line(run_tool([*compiler.argv, "--version"]).stdout) or "version unknown"
    except (OSError, subprocess.TimeoutExpired) as error:
        version = f"--version failed: {error}"
    source = " ($CXX)" if os.environ.get("CXX", "").strip() else ""
    return Check("C++ compiler", "ok", f"{shlex.join(compiler.argv)}{source} ({version})"), compiler


def check_openmp_simd(compiler) -> list:
    """Build a probe with the kernels' command line (timed) and ask it for threads and SIMD."""
    if compiler is None:
        skipped = "not checked (no C++ compiler)"
        return [Check(name, "off", skipped) for name in ("test compile", "OpenMP", "SIMD")]
    from ...codegen.compilers import CompileError

    with tempfile.TemporaryDirectory(prefix="lazytensor-doctor-") as tmp:
        started = time.perf_counter()
        try:
            path = compiler.compile(_PROBE, Path(tmp), "probe", "the doctor's OpenMP probe")
        except CompileError as error:
            text = first_line(error.stderr) or str(error)
            fix = ("the compiler lacks OpenMP: with clang install libomp (`sudo apt-get install "
                   "libomp-dev`), or install g++ and set CXX=g++") if "omp" in text.lower() else \
                  "check the compiler installation (the command and its error are above)"
            return [Check("test compile", "fail", f"failed: {text}", fix),
                    Check("OpenMP", "off", "not checked (the test compile failed)"),
                    Check("SIMD", "off", "not checked (the test compile failed)")]
        seconds = time.perf_counter() - started
        library = ctypes.CDLL(str(path))
        library.lt_probe_simd.restype = ctypes.c_char_p
        threads = library.lt_probe_threads()
        simd = library.lt_probe_simd().decode()
    checks = [Check("test compile", "ok" if seconds < 10 else "warn",
                    f"{seconds:.2f} s for a small OpenMP library, with the kernels' flags "
                    f"({' '.join(compiler.FLAGS[:2])} -fopenmp ...)",
                    "" if seconds < 10 else "a slow compiler or a loaded machine: first calls "
                    "of new formulas will take this long")]
    from .runtime import num_threads

    wanted = num_threads()
    checks.append(Check("OpenMP", "ok" if threads > 1 or wanted == 1 else "warn",
                        f"{threads} threads in a parallel region; kernels use {wanted} "
                        "($LAZYTENSOR_NUM_THREADS, else torch's setting)",
                        "" if threads > 1 or wanted == 1 else
                        "OpenMP runs one thread: check $OMP_NUM_THREADS and the CPU affinity"))
    mvec = "-lmvec" in compiler.libs()
    vector = simd != "none (scalar code)"
    checks.append(Check("SIMD", "ok" if vector else "warn",
                        f"{simd} (-march=native); vector exp/log/sin from "
                        f"{'libmvec' if mvec else 'scalar libm (no libmvec)'}",
                        "" if vector else "this CPU or compiler gives no vector instructions: "
                        "kernels run scalar code"))
    return checks


def check_kernel(compiler) -> Check:
    """One Gaussian kernel product, built in a private temporary cache, against NumPy."""
    if compiler is None:
        return Check("first kernel", "off", "not run (no C++ compiler)")
    import numpy as np

    from ... import Vi, Vj

    rng = np.random.default_rng(0)
    x, y, b = rng.random((2000, 3)), rng.random((3000, 3)), rng.random((3000, 1))
    saved = os.environ.get("LAZYTENSOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="lazytensor-doctor-cache-") as tmp:
        os.environ["LAZYTENSOR_CACHE_DIR"] = tmp
        try:
            started = time.perf_counter()
            out = ((-Vi(x).sqdist(Vj(y)) * 4.0).exp() * Vj(b)).sum(dim=1, backend="cpu")
            first = time.perf_counter() - started
            started = time.perf_counter()
            ((-Vi(x).sqdist(Vj(y)) * 4.0).exp() * Vj(b)).sum(dim=1, backend="cpu")
            second = time.perf_counter() - started
        except Exception as error:  # noqa: BLE001 - reported, with its type
            return Check("first kernel", "fail", f"{type(error).__name__}: {error}",
                         "report this with the output of `python -m lazytensor doctor`")
        finally:
            if saved is None:
                os.environ.pop("LAZYTENSOR_CACHE_DIR", None)
            else:
                os.environ["LAZYTENSOR_CACHE_DIR"] = saved
    dense = np.exp(-((x[:, None] - y[None]) ** 2).sum(-1) * 4.0) @ b
    error = float(np.abs(out - dense).max() / np.abs(dense).max())
    status = "ok" if error < 1e-10 else "fail"
    return Check("first kernel", status,
                 f"exp(-4|x-y|²) @ b, 2000 x 3000, float64: first call {first:.2f} s (build, "
                 f"compile, load, run), second {second * 1e3:.1f} ms; relative error vs NumPy "
                 f"{error:.1e}", "" if status == "ok" else
                 "the kernel computed a wrong result: report this with this output")


def checks(kernel: bool = True) -> list:
    """The CPU backend's checks, in report order (``kernel=False``: no real kernel)."""
    compiler_check, compiler = check_compiler()
    order = ("test compile", "OpenMP", "SIMD")
    probe = sorted(check_openmp_simd(compiler), key=lambda c: order.index(c.name))
    found = [compiler_check, *probe]
    if kernel:
        found.append(check_kernel(compiler))
    return found


def summary(found: list) -> str:
    """``CPU backend: ready``, or what failed."""
    failed = [c.name for c in found if c.status == "fail"]
    return ("CPU backend: ready" if not failed else
            f"CPU backend: NOT ready ({', '.join(failed)}): reductions fall back to NumPy")
