"""pycuda, imported on first use: devices, torch's primary contexts, clear errors.

Nothing here imports pycuda until :func:`pycuda_driver` is called, which happens when a
CUDA tensor (or a NumPy array with ``backend="gpu"``) first reaches a reduction. Kernels
run in the device's *primary* context, the one torch uses, retained once per process
and made current around each driver call (:func:`in_context`).

>>> import lazytensor.backends.cuda.driver as d   # importing loads neither pycuda nor a driver
>>> d.INSTALL_HINT.startswith("the CUDA backend")
True
"""

from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass

INSTALL_HINT = (
    "the CUDA backend needs the NVIDIA driver, the CUDA toolkit (nvcc on PATH or $NVCC) and "
    "pycuda: `pip install 'lazytensor-kernels[cuda]'` (pycuda builds against the toolkit's "
    "headers); or move the inputs to the CPU with .cpu() / use backend='cpu'"
)


class CudaUnavailable(RuntimeError):
    """pycuda or the NVIDIA driver is missing or cannot start."""


class CudaKernelError(RuntimeError):
    """A CUDA kernel could not be built, loaded or run; the message names it."""


_lock = threading.Lock()
_drv = None


def pycuda_driver():
    """``pycuda.driver``, imported and initialised once (``cuInit``)."""
    global _drv
    if _drv is None:
        with _lock:
            if _drv is None:
                try:
                    import pycuda.driver as drv
                except ImportError as e:
                    missing = "pycuda is not installed" if "pycuda" in str(e) and \
                        "libcuda" not in str(e) else f"the NVIDIA driver could not be loaded ({e})"
                    raise CudaUnavailable(f"{missing}; {INSTALL_HINT}") from e
                try:
                    drv.init()
                except drv.Error as e:
                    raise CudaUnavailable(f"the NVIDIA driver could not start ({e}); "
                                          f"{INSTALL_HINT}") from e
                _drv = drv
    return _drv


@dataclass(frozen=True)
class DeviceInfo:
    """What the planner and the compiler need to know about one GPU."""

    index: int
    name: str
    arch: str  # "sm_90"
    sm_count: int
    max_threads: int
    shared_per_block: int  # without opting in
    shared_per_block_optin: int
    shared_per_sm: int
    registers_per_sm: int
    max_threads_per_sm: int
    max_blocks_per_sm: int


@functools.lru_cache(maxsize=None)
def device_info(index: int) -> DeviceInfo:
    """Attributes of GPU ``index`` (read once)."""
    drv = pycuda_driver()
    if not 0 <= index < drv.Device.count():
        raise ValueError(f"device_id={index}: this machine has {drv.Device.count()} CUDA "
                         f"device(s), numbered from 0")
    dev = drv.Device(index)
    a = drv.device_attribute

    def attr(name):
        return dev.get_attribute(getattr(a, name))

    major, minor = dev.compute_capability()
    return DeviceInfo(
        index, dev.name(), f"sm_{major}{minor}", attr("MULTIPROCESSOR_COUNT"),
        attr("MAX_THREADS_PER_BLOCK"), attr("MAX_SHARED_MEMORY_PER_BLOCK"),
        attr("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"), attr("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
        attr("MAX_REGISTERS_PER_MULTIPROCESSOR"), attr("MAX_THREADS_PER_MULTIPROCESSOR"),
        attr("MAX_BLOCKS_PER_MULTIPROCESSOR"))


def driver_version() -> str:
    """The driver's CUDA version, as "13.0"."""
    v = pycuda_driver().get_driver_version()
    return f"{v // 1000}.{v % 1000 // 10}"


_contexts: dict = {}


def primary_context(index: int):
    """Device ``index``'s primary context (torch's), retained for the process's life."""
    ctx = _contexts.get(index)
    if ctx is None:
        with _lock:
            ctx = _contexts.get(index)
            if ctx is None:
                ctx = _contexts[index] = pycuda_driver().Device(index).retain_primary_context()
    return ctx


@contextlib.contextmanager
def in_context(index: int):
    """``with in_context(k):`` runs driver calls in device k's primary context."""
    ctx = primary_context(index)
    ctx.push()
    try:
        yield ctx
    finally:
        pycuda_driver().Context.pop()


__all__ = ["CudaUnavailable", "DeviceInfo", "device_info", "driver_version", "in_context",
           "primary_context", "pycuda_driver"]
