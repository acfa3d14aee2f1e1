"""nvcc: CUDA source to a cubin for one GPU architecture, with its identity for the cache.

Kernels are compiled with IEEE-accurate division, square root and transcendentals
(``expf`` is CUDA's 2-ulp version, not ``ex2.approx``; no ``tanh.approx``, no
``sin.approx`` without range reduction); only denormals are flushed to zero, as the CPU
kernels do. ``use_fast_math=True`` (a reduction option) adds ``--use_fast_math``. nvcc
runs as the C++ compiler does (:mod:`lazytensor.codegen.toolrun`): its own process group,
``$LAZYTENSOR_COMPILE_TIMEOUT``, files in the build directory; a cubin that is not a
well-formed ELF file is an error.

>>> cuda_flags(False)[:3]
('-O3', '-std=c++17', '-ftz=true')
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

from ..compilers import (
    CUDA_ENV,
    CompileError,
    CompilerNotFound,
    CompileTimeout,
    _file_stamp,
    env_identity,
)
from ..toolrun import (
    TIMEOUT_ENV,
    ToolTimeout,
    compile_timeout,
    elf_problem,
    read_file,
    run_tool,
    workdir_fd,
    write_new,
)

BASE_FLAGS = ("-O3", "-std=c++17", "-ftz=true", "-prec-div=true", "-prec-sqrt=true")
FAST_MATH_FLAGS = ("--use_fast_math",)


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
    try:
        out = run_tool([nvcc, "--version"], None, 60.0).stdout
    except ToolTimeout:
        return "unknown"
    lines = [ln for ln in out.splitlines() if "release" in ln]
    return lines[-1].strip() if lines else out.strip()[-200:]


@functools.cache
def _static_identity(arch: str, fast_math: bool) -> dict:
    nvcc = nvcc_path()
    if nvcc is None:
        raise CompilerNotFound("nvcc not found (set $NVCC or put the CUDA toolkit on PATH)")
    return {"compiler": _file_stamp(nvcc), "version": nvcc_version(),
            "flags": " ".join(cuda_flags(fast_math)), "arch": arch}


def cuda_identity(arch: str, fast_math: bool = False) -> dict:
    """What a cubin depends on besides its source: nvcc (path, stamp, version), flags,
    arch, and the environment variables nvcc and its host compiler read."""
    return {**_static_identity(arch, fast_math), "env": env_identity(CUDA_ENV)}


def compile_cuda(source: str, workdir: Path, arch: str = "sm_90", name: str = "kernel",
                 what: str = "", extra: tuple = (), fast_math: bool = False,
                 output: str = "cubin") -> Path:
    """Compile CUDA C++ with nvcc (no GPU needed): ``workdir/name.cubin`` (or ``.ptx``);
    nvcc's messages (the ``-Xptxas -v`` report, when asked for) in ``workdir/name.log``."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise CompilerNotFound("nvcc not found (set $NVCC or put the CUDA toolkit on PATH)")
    src, out = f"{name}.cu", f"{name}.{output}"
    cmd = [nvcc, f"-{output}", f"-arch={arch}", *cuda_flags(fast_math), *extra, src, "-o", out]
    timeout = compile_timeout()
    with workdir_fd(workdir) as dir_fd:
        write_new(dir_fd, src, source)
        try:
            os.unlink(out, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        try:
            proc = run_tool(cmd, dir_fd, timeout)
        except ToolTimeout as error:
            raise CompileTimeout(cmd, error.output, what,
                                 why=f"did not finish within {timeout:g} s (${TIMEOUT_ENV}); "
                                     "nvcc and its children were killed") from None
        if proc.returncode != 0:
            raise CompileError(cmd, proc.stderr or proc.stdout, what)
        data = read_file(dir_fd, out)
        problem = "it is missing" if data is None else (
            elf_problem(data) if output == "cubin" else None)
        if problem is not None:
            raise CompileError(cmd, f"{out}: {problem}", what, why=f"produced a broken {output}")
    (workdir / f"{name}.log").write_text(proc.stderr)
    return workdir / out


__all__ = ["cuda_flags", "cuda_identity", "compile_cuda", "nvcc_path", "nvcc_version"]
