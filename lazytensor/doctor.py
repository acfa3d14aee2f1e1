"""``python -m lazytensor doctor``: what this machine gives lazytensor, and how to fix what lacks.

Each check returns a :class:`Check`: a status (``ok``; ``warn``: works, but not as well as it
could; ``fail``: the CPU backend cannot work; ``off``: an optional part such as CUDA is
absent, or it was not checked because of an earlier failure), what was found, and the fix
when something is missing. The checks: the C++ compiler and its version, OpenMP and the
SIMD level (from a test compile with the kernels' own flags, timed), one real kernel built
in a private temporary cache and checked against NumPy, the kernel cache directory
(location, permissions, size), and for CUDA: nvcc, pycuda, the NVIDIA driver and the GPUs
torch sees. Nothing here writes to the user's cache.

>>> checks = run_checks(kernel=False)
>>> [c.name for c in checks][:4]
['C++ compiler', 'test compile', 'OpenMP', 'SIMD']
>>> all(c.status in STATUSES for c in checks)
True
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import platform
import re
import shlex
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

STATUSES = ("ok", "warn", "fail", "off")  # off: absent and optional, or not checked
_MARK = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "off": "--"}

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


@dataclass
class Check:
    """One line of the report."""

    name: str
    status: str
    detail: str
    fix: str = ""


def _run(cmd: list, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


# ------------------------------------------------------------------------------- CPU


def check_compiler():
    """The C++ compiler the kernels use (``$CXX``, a command, else g++/c++/clang++) and its
    version; ``(check, compiler or None)``."""
    from .codegen.compilers import CpuCompiler

    compiler = CpuCompiler()
    if not compiler.available:
        fix = "fix or unset $CXX" if os.environ.get("CXX", "").strip() else INSTALL_CXX
        return Check("C++ compiler", "fail", compiler.problem or "not found", fix), None
    try:
        version = _first_line(_run([*compiler.argv, "--version"]).stdout) or "version unknown"
    except (OSError, subprocess.TimeoutExpired) as error:
        version = f"--version failed: {error}"
    source = " ($CXX)" if os.environ.get("CXX", "").strip() else ""
    return Check("C++ compiler", "ok", f"{shlex.join(compiler.argv)}{source} ({version})"), compiler


def check_openmp_simd(compiler) -> list:
    """Build a probe with the kernels' command line (timed) and ask it for threads and SIMD."""
    if compiler is None:
        skipped = "not checked (no C++ compiler)"
        return [Check(name, "off", skipped) for name in ("test compile", "OpenMP", "SIMD")]
    from .codegen.compilers import CompileError

    with tempfile.TemporaryDirectory(prefix="lazytensor-doctor-") as tmp:
        started = time.perf_counter()
        try:
            path = compiler.compile(_PROBE, Path(tmp), "probe", "the doctor's OpenMP probe")
        except CompileError as error:
            text = _first_line(error.stderr) or str(error)
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

    from . import Vi, Vj

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


def _tree_size(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total


def _size_text(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.1f} kB"


def check_cache() -> Check:
    """Where kernels are kept, whether that place is private to this user, and its size."""
    from .cache import KernelCache
    from .cache.location import ENV_VAR, requested_root, unusable_reason

    root = requested_root(None)
    source = f"${ENV_VAR}" if os.environ.get(ENV_VAR) else "the user cache directory"
    if not root.exists():
        parent = next(p for p in root.parents if p.exists())
        if os.access(parent, os.W_OK | os.X_OK):
            return Check("kernel cache", "ok", f"{root} ({source}): not created yet; made "
                         "private (mode 0700) on the first compile")
        return Check("kernel cache", "warn", f"{root} ({source}) cannot be created: {parent} "
                     "is not writable", f"set ${ENV_VAR} to a directory you can write")
    reason = unusable_reason(root)  # the root exists: this creates nothing
    if reason is not None:
        fix = (f"chmod 700 {root}" if "writable" in reason else
               f"set ${ENV_VAR} to a directory that only you can write")
        return Check("kernel cache", "warn", f"{root} ({source}) is refused: {reason}; each "
                     "process then compiles into a temporary cache and loses it at exit", fix)
    info = KernelCache(root).info()
    mode = f"{root.stat().st_mode & 0o777:04o}"
    plural = "" if info["num_entries"] == 1 else "s"
    return Check("kernel cache", "ok",
                 f"{root} ({source}), mode {mode}: {info['num_entries']} kernel{plural}, "
                 f"{_size_text(_tree_size(root))} (`python -m lazytensor cache clear` empties it)")


# ------------------------------------------------------------------------------- CUDA


def check_nvcc() -> Check:
    from .codegen.cuda.nvcc import nvcc_path

    nvcc = nvcc_path()
    if nvcc is None:
        return Check("nvcc", "off", "not found (needed for CUDA tensors only)",
                     "install the CUDA toolkit and put its bin/ on PATH, or set $NVCC")
    try:
        text = _run([nvcc, "--version"]).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        return Check("nvcc", "warn", f"{nvcc}: --version failed ({error})",
                     "check the CUDA toolkit installation")
    found = re.search(r"release ([\d.]+)", text)
    return Check("nvcc", "ok", f"{nvcc} (CUDA {found.group(1) if found else 'version unknown'})")


def check_pycuda() -> Check:
    # Found, not imported: importing pycuda.driver loads libcuda.
    if importlib.util.find_spec("pycuda") is None:
        return Check("pycuda", "off", "not installed (needed for CUDA tensors only)",
                     "pip install pycuda (the `cuda` extra; it builds against the CUDA toolkit)")
    try:
        version = importlib.metadata.version("pycuda")
    except importlib.metadata.PackageNotFoundError:
        version = "version unknown"
    return Check("pycuda", "ok", f"pycuda {version}")


def check_driver() -> Check:
    """The NVIDIA driver's libcuda, and the CUDA version it supports (no GPU needed)."""
    names = [os.environ.get("LAZYTENSOR_LIBCUDA"), "libcuda.so.1", "libcuda.so", "nvcuda.dll"]
    for name in filter(None, names):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        version = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return Check("NVIDIA driver", "warn", f"{name} loads but does not answer",
                         "reinstall the NVIDIA driver (nvidia-smi should list the GPU)")
        major, minor = version.value // 1000, version.value % 1000 // 10
        return Check("NVIDIA driver", "ok", f"{name}, supports CUDA {major}.{minor}")
    return Check("NVIDIA driver", "off", "libcuda not found (needed for CUDA tensors only)",
                 "install the NVIDIA driver (nvidia-smi should then list the GPU)")


def check_gpu() -> Check:
    """The GPUs torch can use."""
    try:
        import torch
    except ImportError:
        return Check("GPU", "off", "torch is not installed", "pip install torch")
    if torch.version.cuda is None:
        return Check("GPU", "off", f"torch {torch.__version__} is a CPU-only build",
                     "for CUDA tensors install a CUDA build of torch (pytorch.org, 'Get started')")
    if not torch.cuda.is_available():
        return Check("GPU", "off", f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees "
                     "no GPU", "check `nvidia-smi` and $CUDA_VISIBLE_DEVICES")
    gpus = []
    for k in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(k)
        gpus.append(f"cuda:{k} {props.name} (sm_{props.major}{props.minor}, "
                    f"{props.total_memory / 2**30:.0f} GiB)")
    return Check("GPU", "ok", "; ".join(gpus))


# ------------------------------------------------------------------------------- report


def run_checks(kernel: bool = True) -> list:
    """Every check, in report order (``kernel=False`` skips building a real kernel)."""
    compiler_check, compiler = check_compiler()
    order = ("test compile", "OpenMP", "SIMD")
    probe = sorted(check_openmp_simd(compiler), key=lambda c: order.index(c.name))
    checks = [compiler_check, *probe]
    if kernel:
        checks.append(check_kernel(compiler))
    checks += [check_cache(), check_nvcc(), check_pycuda(), check_driver(), check_gpu()]
    return checks


def summary(checks: list) -> str:
    """One line per backend: ready or not, and why not."""
    by_name = {c.name: c for c in checks}
    failed = [c.name for c in checks if c.status == "fail"]
    cpu = "CPU backend: ready" if not failed else \
        f"CPU backend: NOT ready ({', '.join(failed)}): reductions fall back to NumPy"
    missing = [n for n in ("nvcc", "pycuda", "NVIDIA driver", "GPU") if by_name[n].status != "ok"]
    cuda = "CUDA backend: ready" if not missing else \
        f"CUDA backend: unavailable (missing: {', '.join(missing)})"
    return f"{cpu}\n{cuda}"


def report(checks: list) -> str:
    """The text printed by ``python -m lazytensor doctor``."""
    import numpy

    from . import __version__

    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = "not installed"
    lines = [f"lazytensor {__version__} doctor: Python {platform.python_version()}, numpy "
             f"{numpy.__version__}, torch {torch_version}, {platform.system()} "
             f"{platform.machine()}", ""]
    width = max(len(c.name) for c in checks)
    for c in checks:
        lines.append(f"  {_MARK[c.status]:4s}  {c.name:{width}s}  {c.detail}")
        if c.fix:
            lines.append(f"  {'':4s}  {'':{width}s}  fix: {c.fix}")
    return "\n".join(lines + ["", summary(checks)])


def as_dicts(checks: list) -> list:
    """The checks as JSON-ready dicts (``python -m lazytensor doctor --json``)."""
    return [asdict(c) for c in checks]
