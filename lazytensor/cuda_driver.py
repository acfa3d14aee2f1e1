"""The few CUDA driver API calls lazytensor needs, through ctypes on ``libcuda``.

Only the NVIDIA driver is needed (no pycuda, no CUDA Python package): torch already
created the device's primary context, and kernels are launched into it, on torch's
current stream (a raw ``CUstream`` handle, which pycuda cannot take). Nothing here is
imported until a CUDA tensor reaches a reduction.

>>> import lazytensor.cuda_driver as drv   # importing loads nothing
>>> drv.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
16
"""

from __future__ import annotations

import ctypes
import os
import threading

CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0
CU_FUNC_ATTRIBUTE_NUM_REGS = 4

_LIBRARY_NAMES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")
_HOW_TO_FIX = (
    "lazytensor runs CUDA tensors through the NVIDIA driver's libcuda and compiles kernels "
    "with nvcc: install the NVIDIA driver and the CUDA toolkit (nvcc on PATH or $NVCC), "
    "and check that torch.cuda.is_available() is True; or move the inputs to the CPU "
    "with .cpu()"
)

_P = ctypes.c_void_p
_I = ctypes.c_int
_U = ctypes.c_uint
# (name in libcuda, argument types); every call returns a CUresult (int).
_SIGNATURES = {
    "cuInit": [_U],
    "cuDriverGetVersion": [ctypes.POINTER(_I)],
    "cuDeviceGet": [ctypes.POINTER(_I), _I],
    "cuDeviceGetAttribute": [ctypes.POINTER(_I), _I, _I],
    "cuDevicePrimaryCtxRetain": [ctypes.POINTER(_P), _I],
    "cuCtxPushCurrent_v2": [_P],
    "cuCtxPopCurrent_v2": [ctypes.POINTER(_P)],
    "cuModuleLoadData": [ctypes.POINTER(_P), ctypes.c_char_p],
    "cuModuleGetFunction": [ctypes.POINTER(_P), _P, ctypes.c_char_p],
    "cuModuleGetGlobal_v2": [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                             _P, ctypes.c_char_p],
    "cuFuncGetAttribute": [ctypes.POINTER(_I), _I, _P],
    "cuLaunchKernel": [_P, _U, _U, _U, _U, _U, _U, _U, _P, ctypes.POINTER(_P), ctypes.POINTER(_P)],
    "cuStreamSynchronize": [_P],
    "cuGetErrorName": [_I, ctypes.POINTER(ctypes.c_char_p)],
    "cuGetErrorString": [_I, ctypes.POINTER(ctypes.c_char_p)],
}


class CudaDriverError(RuntimeError):
    """A driver call failed; carries the CUresult code."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


class Driver:
    """A loaded, initialised ``libcuda``. Use :func:`driver`, which makes one per process."""

    def __init__(self, path: str | None = None):
        self.lib = _load_library(path)
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(self.lib, name, None)
            if fn is None:
                raise RuntimeError(f"{self.lib._name} has no {name}: not the NVIDIA driver, or too old. "
                                   + _HOW_TO_FIX)
            fn.argtypes = argtypes
            fn.restype = _I
        self.check(self.lib.cuInit(0), "cuInit")
        self._contexts: dict[int, ctypes.c_void_p] = {}

    # ------------------------------------------------------------------ errors
    def error_text(self, code: int) -> str:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        self.lib.cuGetErrorName(code, ctypes.byref(name))
        self.lib.cuGetErrorString(code, ctypes.byref(text))
        name = name.value.decode() if name.value else f"CUDA error {code}"
        return f"{name}: {text.value.decode()}" if text.value else name

    def check(self, code: int, what: str) -> None:
        if code != 0:
            raise CudaDriverError(f"{what} failed with {self.error_text(code)}", code)

    # ------------------------------------------------------------------ devices
    def version(self) -> int:
        v = _I()
        self.check(self.lib.cuDriverGetVersion(ctypes.byref(v)), "cuDriverGetVersion")
        return v.value

    def attribute(self, attr: int, device: int) -> int:
        dev, out = _I(), _I()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(out), attr, dev),
                   "cuDeviceGetAttribute")
        return out.value

    def compute_capability(self, device: int) -> tuple[int, int]:
        return (self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
                self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device))

    def sm_count(self, device: int) -> int:
        return self.attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device)

    def primary_context(self, device: int) -> ctypes.c_void_p:
        """The device's primary context (the one torch uses), retained once per process."""
        ctx = self._contexts.get(device)
        if ctx is None:
            dev = _I()
            self.check(self.lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
            ctx = _P()
            self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
                       "cuDevicePrimaryCtxRetain")
            self._contexts[device] = ctx
        return ctx

    def in_context(self, device: int):
        """``with drv.in_context(k):`` makes device k's primary context current."""
        return _ContextScope(self, self.primary_context(device))

    # ------------------------------------------------------------------ modules, launches
    def load_module(self, image: bytes) -> ctypes.c_void_p:
        """Load a cubin into the current context."""
        mod = _P()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(mod), image), "cuModuleLoadData")
        return mod

    def function(self, module, name: str) -> ctypes.c_void_p:
        fn = _P()
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()),
                   f"cuModuleGetFunction({name})")
        return fn

    def global_size(self, module, name: str) -> int:
        ptr, size = ctypes.c_uint64(), ctypes.c_size_t()
        self.check(self.lib.cuModuleGetGlobal_v2(ctypes.byref(ptr), ctypes.byref(size), module,
                                                 name.encode()), f"cuModuleGetGlobal({name})")
        return size.value

    def function_attribute(self, fn, attr: int) -> int:
        out = _I()
        self.check(self.lib.cuFuncGetAttribute(ctypes.byref(out), attr, fn), "cuFuncGetAttribute")
        return out.value

    def launch(self, fn, grid: int, threads: int, stream: int, args: ctypes.Array,
               what: str = "kernel") -> None:
        """Launch ``fn`` with one by-value parameter: the bytes of ``args``."""
        params = (_P * 1)(ctypes.cast(args, _P))
        self.check(self.lib.cuLaunchKernel(fn, grid, 1, 1, threads, 1, 1, 0, _P(stream or None),
                                           params, None), f"launching {what}")

    def synchronize(self, stream: int, what: str = "kernel") -> None:
        self.check(self.lib.cuStreamSynchronize(_P(stream or None)), f"running {what}")


class _ContextScope:
    def __init__(self, drv: Driver, ctx):
        self.drv, self.ctx = drv, ctx

    def __enter__(self):
        self.drv.check(self.drv.lib.cuCtxPushCurrent_v2(self.ctx), "cuCtxPushCurrent")
        return self

    def __exit__(self, *exc):
        old = _P()
        self.drv.check(self.drv.lib.cuCtxPopCurrent_v2(ctypes.byref(old)), "cuCtxPopCurrent")
        return False


def _load_library(path: str | None):
    names = [path] if path else [os.environ.get("LAZYTENSOR_LIBCUDA"), *_LIBRARY_NAMES]
    errors = []
    for name in names:
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
    raise RuntimeError("no NVIDIA driver found (could not load libcuda: "
                       + "; ".join(errors) + "). " + _HOW_TO_FIX)


_driver: Driver | None = None
_driver_lock = threading.Lock()


def driver() -> Driver:
    """The process's :class:`Driver` (loaded and initialised on first use)."""
    global _driver
    if _driver is None:
        with _driver_lock:
            if _driver is None:
                try:
                    _driver = Driver()
                except CudaDriverError as e:
                    raise RuntimeError(f"the NVIDIA driver could not start ({e}). "
                                       + _HOW_TO_FIX) from e
    return _driver


__all__ = ["CudaDriverError", "Driver", "driver"]
