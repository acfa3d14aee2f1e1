"""A GPU for the tests: a fake ``libcuda.so.1`` whose kernels are the real ``.cu`` sources
compiled for the host and run by a CUDA execution-model emulator.

- :func:`build_driver` compiles ``driver.cpp`` (the driver API pycuda and the runtime
  use) and ``runtime.cpp`` (fibers, barriers, race detection) into ``libcuda.so.1``, plus
  a stub returning ``CUDA_ERROR_NOT_SUPPORTED`` for every other function that ``cuda.h``
  declares, so that pycuda (built against it, or against the real driver) links.
- :func:`build_kernel` compiles a kernel source, unmodified, as host C++ under
  ``shim.h`` with ``-fsanitize=thread`` instrumentation (its memory accesses reach the
  race detector) and exports one entry per ``__global__`` function.
- :class:`Emulator` loads the driver into the process (``RTLD_GLOBAL``: pycuda's
  ``_driver`` module then links to it by soname) and registers each cubin nvcc builds
  with its emulated twin, keyed by the cubin's hash, for ``cuModuleLoadData``.

Run ``python tests/cuda_emulator/__init__.py OUTDIR`` to build the driver alone (the
Makefile links pycuda against it). Builds are cached under ``build/cuda-emulator`` by
the hash of their inputs.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CACHE = Path(os.environ.get("LAZYTENSOR_EMULATOR_DIR", ROOT / "build" / "cuda-emulator"))
# Every load and store of the kernel becomes a call the race detector answers (runtime.cpp);
# thread-safe statics would call the sanitizer's atomics, which it does not define.
TSAN_FLAGS = ["-fsanitize=thread", "--param", "tsan-instrument-func-entry-exit=0",
              "-fno-threadsafe-statics"]
_lock = threading.Lock()


def cuda_include() -> Path | None:
    """The toolkit's include directory (next to nvcc), or None."""
    from lazytensor.codegen.cuda.nvcc import nvcc_path

    nvcc = nvcc_path()
    if nvcc is None:
        return None
    candidates = [Path(nvcc).resolve().parent.parent / "include"]
    candidates += [Path(os.environ[v]) / "include" for v in ("CUDA_HOME", "CUDA_PATH")
                   if os.environ.get(v)]
    candidates.append(Path("/usr/local/cuda/include"))
    return next((c for c in candidates if (c / "cuda.h").exists()), None)


def cxx() -> list[str]:
    """The C++ compiler's command (``$CXX`` may carry arguments, as ``ccache g++``)."""
    return shlex.split(os.environ.get("CXX") or "") or [shutil.which("g++") or "c++"]


def _run(cmd: list, what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode:
        raise RuntimeError(f"building {what} failed:\n{' '.join(map(str, cmd))}\n"
                           f"{proc.stderr[-8000:]}")


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def _publish(tmp: Path, final: Path) -> None:
    try:
        os.replace(tmp, final)
    except OSError:  # another process published it first
        shutil.rmtree(tmp, ignore_errors=True)


def driver_symbols(include: Path) -> list[str]:
    """Every driver function a client compiled against ``cuda.h`` may reference."""
    probe = "#include <cuda.h>\n#include <cudaProfiler.h>\n"
    proc = subprocess.run([*cxx(), "-E", "-x", "c", "-", f"-I{include}"], input=probe,
                          capture_output=True, text=True, check=True)
    return sorted(set(re.findall(r"\bCUresult\s+(cu\w+)\s*\(", proc.stdout)))


def build_driver(out: Path | None = None) -> Path:
    """``libcuda.so.1`` (the fake driver with the emulator), built once per input hash."""
    include = cuda_include()
    if include is None:
        raise RuntimeError("the fake CUDA driver is built against the toolkit's cuda.h: "
                           "nvcc not found")
    sources = [HERE / n for n in ("driver.cpp", "runtime.cpp", "runtime.h")]
    key = _digest(*(p.read_bytes() for p in sources), (include / "cuda.h").read_bytes(),
                  " ".join(cxx()))
    final = (out or CACHE) / f"driver-{key}"
    lib = final / "libcuda.so.1"
    if lib.exists():
        return lib
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="driver-", dir=final.parent))
    objs = []
    for name in ("driver.cpp", "runtime.cpp"):
        obj = tmp / (name + ".o")
        _run([*cxx(), "-O2", "-g", "-std=c++17", "-fPIC", "-c", str(HERE / name),
              f"-I{include}", f"-I{HERE}", "-o", str(obj)], name)
        objs.append(obj)
    defined = set()
    for obj in objs:
        nm = subprocess.run(["nm", "--defined-only", "-g", str(obj)], capture_output=True,
                            text=True, check=True).stdout
        defined |= {line.split()[-1] for line in nm.splitlines() if line.strip()}
    stubs = [n for n in driver_symbols(include) if n not in defined]
    (tmp / "stubs.c").write_text(
        "/* generated: driver functions the fake does not implement */\n"
        + "".join(f"int {n}(void) {{ return 801; }}\n" for n in stubs))
    _run([*cxx(), "-x", "c", "-O1", "-fPIC", "-c", str(tmp / "stubs.c"), "-o",
          str(tmp / "stubs.o")], "driver stubs")
    _run([*cxx(), "-shared", "-o", str(tmp / "libcuda.so.1"), *map(str, objs),
          str(tmp / "stubs.o"), "-Wl,-soname,libcuda.so.1", "-ldl"], "libcuda.so.1")
    os.symlink("libcuda.so.1", tmp / "libcuda.so")
    _publish(tmp, final)
    return lib


_KERNEL_RE = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")
_NAMESPACE_RE = re.compile(r"\bnamespace\s+(\w+)\s*\{")


def wrapper_source(kernel_file: str, source: str) -> str:
    """The translation unit of an emulated module: the kernel source and its entries."""
    names = _KERNEL_RE.findall(source)
    spaces = sorted(set(_NAMESPACE_RE.findall(source)))
    return (f'#include "{kernel_file}"\n#include "launch.h"\n'
            + "".join(f"using namespace {s};\n" for s in spaces)
            + "".join(f"LT_EMU_KERNEL({n})\n" for n in names))


def build_kernel(source: str, out: Path, driver: Path) -> Path:
    """The emulated module of a ``.cu`` source, at ``out`` (a ``.so``)."""
    with tempfile.TemporaryDirectory(prefix="kernel-") as tmp:
        tmp = Path(tmp)
        (tmp / "kernel.cu").write_text(source)
        (tmp / "module.cpp").write_text(wrapper_source("kernel.cu", source))
        obj = tmp / "module.o"
        _run([*cxx(), "-O2", "-std=c++17", "-fPIC", "-w", *TSAN_FLAGS, "-include",
              str(HERE / "shim.h"), f"-I{HERE}", f"-I{tmp}", "-c", str(tmp / "module.cpp"),
              "-o", str(obj)], "an emulated kernel")
        part = out.with_suffix(f".{os.getpid()}.tmp")
        _run([*cxx(), "-shared", "-o", str(part), str(obj), f"-L{driver.parent}",
              "-l:libcuda.so.1", f"-Wl,-rpath,{driver.parent}"], "an emulated kernel")
        missing = _undefined(part, "__tsan_") - _defined(driver)
        if missing:
            raise RuntimeError(f"the emulator does not define {sorted(missing)}, which the "
                               "instrumented kernel calls: add them to runtime.cpp")
        os.replace(part, out)
    return out


def _undefined(lib: Path, prefix: str) -> set:
    out = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True,
                         text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.split()[-1].startswith(prefix)}


def _defined(lib: Path) -> set:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                         text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def image_hash(image: bytes) -> str:
    """The fake driver's name for a module image (FNV-1a over the ELF, see driver.cpp)."""
    if image[:4] == b"\x7fELF" and image[4] == 2:
        shoff = int.from_bytes(image[0x28:0x30], "little")
        shentsize = int.from_bytes(image[0x3A:0x3C], "little")
        shnum = int.from_bytes(image[0x3C:0x3E], "little")
        image = image[: shoff + shentsize * shnum]
    else:
        image = image.split(b"\0", 1)[0]
    h = 1469598103934665603
    for byte in image:
        h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


class Emulator:
    """The fake driver loaded in this process, and the registry of emulated modules."""

    def __init__(self):
        self.driver_path = build_driver()
        self.modules = self.driver_path.parent / "modules"
        self.modules.mkdir(parents=True, exist_ok=True)
        os.environ["FAKE_CUDA_MODULES"] = str(self.modules)
        self.lib = ctypes.CDLL(str(self.driver_path), mode=ctypes.RTLD_GLOBAL)
        for name in ("fake_cuda_failures", "fake_cuda_launch_log"):
            getattr(self.lib, name).argtypes = [ctypes.c_char_p, ctypes.c_int64]
            getattr(self.lib, name).restype = ctypes.c_int64
        for name in ("fake_cuda_failure_count", "fake_cuda_launch_count",
                     "fake_cuda_context_depth"):
            getattr(self.lib, name).restype = ctypes.c_int64
        self.lib.fake_cuda_stream_hold.argtypes = [ctypes.c_void_p]
        self.lib.fake_cuda_stream_release.argtypes = [ctypes.c_void_p]

    def register(self, image: bytes, source) -> Path:
        """Build the emulated twin of a cubin compiled from ``source`` (its text, or a
        function that renders it: called only when the twin is not built yet)."""
        out = self.modules / f"{image_hash(image)}.so"
        with _lock:
            if not out.exists():
                build_kernel(source() if callable(source) else source, out, self.driver_path)
        return out

    def _text(self, fn) -> str:
        n = fn(None, 0)
        buf = ctypes.create_string_buffer(int(n) + 1)
        fn(buf, n + 1)
        return buf.value.decode()

    def failures(self) -> str:
        """Races, divergence and traps the emulator saw (empty when none)."""
        return self._text(self.lib.fake_cuda_failures)

    def clear_failures(self) -> None:
        self.lib.fake_cuda_clear_failures()

    def launch_log(self) -> list[str]:
        return self._text(self.lib.fake_cuda_launch_log).splitlines()

    def clear_launch_log(self) -> None:
        self.lib.fake_cuda_clear_launch_log()


_emulator: Emulator | None = None


def emulator() -> Emulator:
    """The process's :class:`Emulator` (built and loaded on first use)."""
    global _emulator
    if _emulator is None:
        _emulator = Emulator()
    return _emulator


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    print(build_driver(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
