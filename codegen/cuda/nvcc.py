"""nvcc: CUDA source to a cubin for one GPU architecture, with its identity for the cache.

Kernels are compiled with IEEE-accurate division, square root and transcendentals
(``expf`` is CUDA's 2-ulp version, not ``ex2.approx``; no ``tanh.approx``, no
``sin.approx`` without range reduction); only denormals are flushed to zero, as the CPU
kernels do. ``use_fast_math=True`` (a reduction option) adds ``--use_fast_math``.

>>> cuda_flags(False)[:3]
('-O3', '-std=c++17', '-ftz=true')
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from ..compilers import CompileError, CompilerNotFound, _file_stamp

BASE_FLAGS = ("-O3", "-std=c++17", "-ftz=true", "-prec-div=true", "-prec-sqrt=true")
FAST_MATH_FLAGS = ("--use_fast_math",)
NVCC_TIMEOUT = 600  # seconds; a D=784 argKmin kernel takes ~10 s


def cuda_flags(fast_math: bool) -> tuple:
    """nvcc's options for a kernel (``fast_math``: approximate intrinsics allowed)."""
    return BASE_FLAGS + (FAST_MATH_FLAGS if fast_math else ())


def nvcc_path() -> str | None:
    """``$NVCC``, ``nvcc`` on PATH, or the toolkit's default location."""
    for c in (os.environ.get("NVCC"), "nvcc", "/usr/local/cuda/bin/nvcc"):
        if c and shutil.which(c):
            return shutil.which(c)
    return None


@functools.cache
def nvcc_version() -> str:
    """nvcc's release line, e.g. ``Cuda compilation tools, release 13.0, V13.0.88``."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise CompilerNotFound("nvcc not found (set $NVCC or put the CUDA toolkit on PATH)")
    proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if "release" in ln]
    return lines[-1].strip() if lines else proc.stdout.strip()[-200:]


@functools.cache
def cuda_identity(arch: str, fast_math: bool = False) -> dict:
    """What a cubin depends on besides its source: nvcc (path, stamp, version), flags, arch."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise CompilerNotFound("nvcc not found (set $NVCC or put the CUDA toolkit on PATH)")
    return {"compiler": _file_stamp(nvcc), "version": nvcc_version(),
            "flags": " ".join(cuda_flags(fast_math)), "arch": arch}


def compile_cuda(source: str, workdir: Path, arch: str = "sm_90", name: str = "kernel",
                 what: str = "", extra: tuple = (), fast_math: bool = False,
                 output: str = "cubin") -> Path:
    """Compile CUDA C++ with nvcc (no GPU needed): ``workdir/name.cubin`` (or ``.ptx``)."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise CompilerNotFound("nvcc not found (set $NVCC or put the CUDA toolkit on PATH)")
    src = workdir / f"{name}.cu"
    out = workdir / f"{name}.{output}"
    src.write_text(source)
    cmd = [nvcc, f"-{output}", f"-arch={arch}", *cuda_flags(fast_math), *extra, str(src),
           "-o", str(out)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=NVCC_TIMEOUT, start_new_session=True)
    except subprocess.TimeoutExpired:
        raise CompileError(cmd, f"nvcc did not finish within {NVCC_TIMEOUT} s", what) from None
    if proc.returncode != 0 or not out.exists():
        raise CompileError(cmd, proc.stderr or proc.stdout, what)
    out.with_suffix(".log").write_text(proc.stderr)  # the -Xptxas -v report, when asked for
    return out


__all__ = ["cuda_flags", "cuda_identity", "compile_cuda", "nvcc_path", "nvcc_version"]
