"""Compilers: C++ source to a shared library (system g++); nvcc is in :mod:`.cuda.nvcc`.

Each compiler has an identity (its executables' stamps, flags, target, and the
environment variables it reads) that goes into the cache key, so a changed compiler,
include path or CPU never loads a stale binary. Compilers run through
:mod:`lazytensor.codegen.toolrun`: own process group, timeout (``$LAZYTENSOR_COMPILE_TIMEOUT``),
temporary files in the build directory. A shared library is published only after it
has been shown to load, in a child process, so a compiler that exits 0 after writing a
broken file cannot crash the processes that would load it.

>>> cc = cpu_compiler()
>>> sorted(cc.identity())
['arch', 'command', 'compiler', 'env', 'flags']
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shlex
import shutil
import sys
import warnings
from pathlib import Path

from .toolrun import (
    TIMEOUT_ENV,
    ToolTimeout,
    compile_timeout,
    elf_problem,
    read_file,
    run_tool,
    workdir_fd,
    write_new,
)

# What gcc, clang and their linkers read from the environment that can change the binary.
CPU_ENV = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH",
           "LIBRARY_PATH", "GCC_EXEC_PREFIX", "COMPILER_PATH", "LD_RUN_PATH",
           "GCC_COMPARE_DEBUG", "SDKROOT", "MACOSX_DEPLOYMENT_TARGET")
CUDA_ENV = (*CPU_ENV, "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "CUDA_PATH")
ET_DYN = 3
_LOAD_CHECK = "import ctypes, sys; ctypes.CDLL(sys.argv[1])"
_LOAD_CHECK_TIMEOUT = 60.0


class CompileError(RuntimeError):
    """A compiler failed: carries the command line and its stderr."""

    def __init__(self, cmd: list[str], stderr: str, what: str = "", why: str = "failed"):
        self.cmd, self.stderr = cmd, stderr
        text = stderr.strip()
        if len(text) > 6000:
            text = text[:3000] + "\n...\n" + text[-3000:]
        super().__init__(
            f"compiling {what or 'a kernel'} {why}.\ncommand: {shlex.join(cmd)}\nstderr:\n{text}"
        )


class CompileTimeout(CompileError):
    """The compiler ran past ``$LAZYTENSOR_COMPILE_TIMEOUT``; its process group was killed."""


class CompilerNotFound(RuntimeError):
    """No usable compiler: none installed, or ``$CXX``/``$NVCC`` names nothing runnable."""


class CompilerWarning(RuntimeWarning):
    """A compile succeeded with warnings: they are shown, not hidden."""


def _cpu_stamp() -> str:
    """What -march=native depends on: the CPU's model and feature flags."""
    text = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "model name", "Features")):
                    text += line
                    if line.startswith(("flags", "Features")):
                        break
    except OSError:
        pass
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _file_stamp(path: str) -> str:
    st = os.stat(path)
    return f"{os.path.realpath(path)}:{st.st_size}:{int(st.st_mtime)}"


def env_identity(names: tuple[str, ...]) -> dict[str, str]:
    """The variables among ``names`` that are set (they change what the compiler does).

    >>> env_identity(("LAZYTENSOR_SURELY_UNSET",))
    {}
    """
    return {name: os.environ[name] for name in names if name in os.environ}


def _resolve_command(text: str) -> tuple[list[str] | None, str | None]:
    """``(argv with its program resolved, None)`` or ``(None, why it cannot run)``."""
    try:
        words = shlex.split(text)
    except ValueError as error:
        return None, f"cannot be parsed as a command ({error})"
    if not words:
        return None, "is empty"
    found = shutil.which(words[0])
    if found is None:
        return None, f"names {words[0]!r}, which is not an executable file or on PATH"
    return [found, *words[1:]], None


def _warning_flags(argv: list[str]) -> list[str]:
    """Warnings that signal a wrong literal become errors (names differ by family)."""
    names = " ".join(os.path.basename(os.path.realpath(shutil.which(w) or w)) for w in argv)
    if "clang" in names:
        return ["-Werror=literal-range", "-Werror=constant-conversion"]
    return ["-Werror=overflow"]


def _check_loads(dir_fd: int, name: str, cmd: list[str], what: str) -> None:
    """Raise :class:`CompileError` unless ``name`` is a whole ELF shared object that a
    child process can ``dlopen`` (a crash there is a failed check, not a dead parent)."""
    data = read_file(dir_fd, name)
    problem = "it is missing or not a regular file" if data is None else elf_problem(data, ET_DYN)
    if problem is None and sys.executable:
        try:
            proc = run_tool([sys.executable, "-I", "-S", "-c", _LOAD_CHECK, f"./{name}"],
                            dir_fd, _LOAD_CHECK_TIMEOUT)
        except ToolTimeout:
            problem = f"loading it did not finish within {_LOAD_CHECK_TIMEOUT:g} s"
        else:
            if proc.returncode:
                problem = f"loading it in a child process failed (status {proc.returncode}): " \
                          f"{(proc.stderr or '').strip()[-1500:]}"
    if problem is not None:
        raise CompileError(cmd, f"{name}: {problem}", what,
                           why="produced a library that does not load (not cached)")


def _run_compiler(cmd: list[str], dir_fd: int, what: str) -> str:
    """Run a compiler command; its stderr on success, :class:`CompileError` otherwise."""
    timeout = compile_timeout()
    try:
        proc = run_tool(cmd, dir_fd, timeout)
    except ToolTimeout as error:
        raise CompileTimeout(
            cmd, error.output, what,
            why=f"did not finish within {timeout:g} s (${TIMEOUT_ENV}); the compiler and its "
                "children were killed",
        ) from None
    except OSError as error:  # the program vanished or is not executable
        raise CompileError(cmd, str(error), what, why="could not start the compiler") from None
    if proc.returncode != 0:
        raise CompileError(cmd, proc.stderr or proc.stdout, what)
    return proc.stderr or ""


def _show_warnings(cmd: list[str], stderr: str, what: str) -> None:
    if stderr.strip():
        warnings.warn(f"compiling {what or 'a kernel'} gave warnings:\n{stderr.strip()[:4000]}"
                      f"\ncommand: {shlex.join(cmd)}", CompilerWarning, stacklevel=3)


class CpuCompiler:
    """The system C++ compiler: ``$CXX`` (a command, e.g. ``ccache g++``) or g++/c++/clang++.

    A ``$CXX`` that names nothing runnable is refused (``available`` is false and
    ``problem`` says why), never silently replaced by another compiler.
    """

    FLAGS = ["-O3", "-march=native", "-std=c++14", "-fPIC", "-shared", "-fopenmp",
             "-fno-math-errno", "-fno-trapping-math", "-fno-semantic-interposition"]
    LIBS = ["-lmvec", "-lm"]

    def __init__(self, path: str | None = None):
        self.argv: list[str] | None = None
        self.problem: str | None = None
        self._libs = None
        wanted = path if path is not None else os.environ.get("CXX", "").strip() or None
        if wanted is not None:
            self.argv, why = _resolve_command(wanted)
            if why is not None:
                source = "$CXX" if path is None else "the compiler"
                self.problem = f"{source} {wanted!r} {why}; fix or unset it"
            return
        for candidate in ("g++", "c++", "clang++"):
            found = shutil.which(candidate)
            if found:
                self.argv = [found]
                return
        self.problem = "none of g++, c++, clang++ is on PATH"

    @property
    def path(self) -> str | None:
        """The program that is run (the wrapper for a command such as ``ccache g++``)."""
        return None if self.argv is None else self.argv[0]

    @property
    def available(self) -> bool:
        return self.argv is not None

    def not_found(self) -> CompilerNotFound:
        """The error to raise when this compiler is not available."""
        return CompilerNotFound(
            f"no C++ compiler found: {self.problem}; set $CXX to a C++ compiler or install "
            "g++, or use backend='numpy' (or 'auto') to fall back to the NumPy reference"
        )

    @functools.cache  # noqa: B019  (one compiler object per process)
    def _static_identity(self) -> dict:
        stamps = [_file_stamp(p) for p in map(shutil.which, self.argv or []) if p]
        return {
            "compiler": " ".join(stamps) if self.argv else "none",
            "command": shlex.join(self.argv or []),
            "flags": " ".join(self.flags() + self.libs()),
            "arch": _cpu_stamp(),
        }

    def identity(self) -> dict:
        """What the binary depends on besides its source (goes into the cache key)."""
        return {**self._static_identity(), "env": env_identity(CPU_ENV)}

    def flags(self) -> list[str]:
        return [*self.FLAGS, *_warning_flags(self.argv or [])]

    def libs(self) -> list[str]:
        """-lmvec where the C library has it (glibc >= 2.22 on x86_64)."""
        if self._libs is None:
            has_mvec = platform.machine() in ("x86_64", "AMD64") and any(
                Path(d, "libmvec.so").exists()
                for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib")
            )
            self._libs = self.LIBS if has_mvec else ["-lm"]
        return self._libs

    def command(self, src: str, out: str) -> list[str]:
        return [*(self.argv or []), *self.flags(), src, "-o", out, *self.libs()]

    def compile(self, source: str, workdir: Path, name: str = "kernel", what: str = "") -> Path:
        """Write ``source`` to ``workdir/name.cpp`` and build ``workdir/name.so``.

        The library is returned only once a child process has loaded it; warnings are
        shown as :class:`CompilerWarning`, overflowing literals are errors.
        """
        if not self.available:
            raise self.not_found()
        src, out = f"{name}.cpp", f"{name}.so"
        cmd = self.command(src, out)
        with workdir_fd(workdir) as dir_fd:
            write_new(dir_fd, src, source)
            try:
                os.unlink(out, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            stderr = _run_compiler(cmd, dir_fd, what)
            _check_loads(dir_fd, out, cmd, what)
        _show_warnings(cmd, stderr, what)
        return workdir / out


@functools.cache
def cpu_compiler() -> CpuCompiler:
    return CpuCompiler()


def build_lock_timeout() -> float:
    """How long to wait for another process's build of the same kernel: twice the compile
    timeout (rendering, compiling and the load check of a slower process). A build that
    fails, a timed-out compile included, is reported to its waiters at once.

    >>> build_lock_timeout() == 2 * compile_timeout()
    True
    """
    return 2 * compile_timeout()
