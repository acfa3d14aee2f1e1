"""Compilers: C++ source to a shared library (system g++); nvcc is in :mod:`.cuda.nvcc`.

Each compiler has an identity (path, version stamp, flags, target) that goes into the
cache key, so a changed compiler or CPU never loads a stale binary.

>>> cc = cpu_compiler()
>>> sorted(cc.identity())[:2]
['arch', 'compiler']
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path


class CompileError(RuntimeError):
    """A compiler failed: carries the command line and its stderr."""

    def __init__(self, cmd: list[str], stderr: str, what: str = ""):
        self.cmd, self.stderr = cmd, stderr
        text = stderr.strip()
        if len(text) > 6000:
            text = text[:3000] + "\n...\n" + text[-3000:]
        super().__init__(
            f"compiling {what or 'a kernel'} failed.\ncommand: {' '.join(cmd)}\nstderr:\n{text}"
        )


class CompilerNotFound(RuntimeError):
    pass


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


class CpuCompiler:
    """The system C++ compiler (``$CXX`` or g++/c++/clang++), OpenMP and SIMD enabled."""

    FLAGS = ["-O3", "-march=native", "-std=c++14", "-fPIC", "-shared", "-fopenmp",
             "-fno-math-errno", "-fno-trapping-math", "-fno-semantic-interposition", "-w"]
    LIBS = ["-lmvec", "-lm"]

    def __init__(self, path: str | None = None):
        candidates = [path] if path else [os.environ.get("CXX"), "g++", "c++", "clang++"]
        found = None
        for c in candidates:
            if c and shutil.which(c):
                found = shutil.which(c)
                break
        self.path = found
        self._libs = None

    @property
    def available(self) -> bool:
        return self.path is not None

    @functools.cache  # noqa: B019  (one compiler object per process)
    def identity(self) -> dict:
        return {
            "compiler": _file_stamp(self.path) if self.path else "none",
            "flags": " ".join(self.FLAGS + self.libs()),
            "arch": _cpu_stamp(),
        }

    def libs(self) -> list[str]:
        """-lmvec where the C library has it (glibc >= 2.22 on x86_64)."""
        if self._libs is None:
            has_mvec = platform.machine() in ("x86_64", "AMD64") and any(
                Path(d, "libmvec.so").exists()
                for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib")
            )
            self._libs = self.LIBS if has_mvec else ["-lm"]
        return self._libs

    def command(self, src: Path, out: Path) -> list[str]:
        return [self.path, *self.FLAGS, str(src), "-o", str(out), *self.libs()]

    def compile(self, source: str, workdir: Path, name: str = "kernel", what: str = "") -> Path:
        """Write ``source`` to ``workdir/name.cpp`` and build ``workdir/name.so``."""
        if not self.available:
            raise CompilerNotFound(
                "no C++ compiler found (set $CXX, or install g++); "
                "use backend='numpy' or backend='auto' to fall back to the NumPy reference"
            )
        src = workdir / f"{name}.cpp"
        out = workdir / f"{name}.so"
        src.write_text(source)
        cmd = self.command(src, out)
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if proc.returncode != 0 or not out.exists():
            raise CompileError(cmd, proc.stderr or proc.stdout, what)
        return out


@functools.cache
def cpu_compiler() -> CpuCompiler:
    return CpuCompiler()
