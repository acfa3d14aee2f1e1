"""``python -m lazytensor doctor``: what this machine gives lazytensor, and how to fix what lacks.

Each check returns a :class:`~lazytensor.core.checks.Check`: a status (``ok``; ``warn``:
works, but not as well as it could; ``fail``: a backend cannot work; ``off``: an optional
part such as CUDA is absent, or it was not checked because of an earlier failure), what
was found, and the fix when something is missing. Each backend brings its checks and its
summary line (the CPU's in :mod:`lazytensor.backends.cpu.doctor`: compiler, OpenMP, SIMD,
one real kernel; the CUDA's in :mod:`lazytensor.backends.cuda.doctor`: nvcc, pycuda, the
driver, the GPUs); the kernel cache directory (location, permissions, size) is checked
here. Nothing here writes to the user's cache.

>>> checks = run_checks(kernel=False)
>>> [c.name for c in checks][:4]
['C++ compiler', 'test compile', 'OpenMP', 'SIMD']
>>> all(c.status in STATUSES for c in checks)
True
"""

from __future__ import annotations

import importlib
import os
import platform
from dataclasses import asdict
from pathlib import Path

from ..core import backend
from ..core.checks import STATUSES, Check

_MARK = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "off": "--"}

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
    from ..cache import KernelCache
    from ..cache.location import ENV_VAR, requested_root, unusable_reason

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


# ------------------------------------------------------------------------------- report


def _doctors() -> list:
    """(backend, its doctor module) for the backends that have one."""
    found = []
    for r in backend.runtimes():
        try:
            found.append((r, importlib.import_module(f"{type(r).__module__}.doctor")))
        except ModuleNotFoundError:
            continue
    return found


def run_checks(kernel: bool = True) -> list:
    """Every check, in report order (``kernel=False`` skips building a real kernel): each
    backend's, then the kernel cache's."""
    checks = [c for _, module in _doctors() for c in module.checks(kernel)]
    return checks + [check_cache()]


def summary(checks: list) -> str:
    """One line per backend: ready or not, and why not."""
    return "\n".join(module.summary([c for c in checks if c.name in module.NAMES])
                     for _, module in _doctors())


def report(checks: list) -> str:
    """The text printed by ``python -m lazytensor doctor``."""
    import numpy

    from .. import __version__

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


__all__ = ["STATUSES", "Check", "as_dicts", "check_cache", "report", "run_checks", "summary"]


def __getattr__(name: str):
    """A backend's check by its name (``doctor.check_nvcc()``, ``doctor.check_compiler()``),
    as when this module held them all."""
    if name.startswith("check_"):
        for _, module in _doctors():
            if hasattr(module, name):
                return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
