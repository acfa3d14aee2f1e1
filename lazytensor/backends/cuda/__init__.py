"""The CUDA backend: kernels from :mod:`lazytensor.codegen.cuda`, built with nvcc,
loaded and launched through pycuda in torch's primary context, on torch's current stream.

- :mod:`.driver`: pycuda and the NVIDIA driver, devices, torch's primary contexts;
- :mod:`.loader`: build (nvcc, kernel cache), load (``module_from_buffer``), block size;
- :mod:`.launch`: grid planning, argument packing, torch tensors and NumPy arrays;
- :mod:`.streams`: the stream rule (torch's current stream) and fault reporting;
- :mod:`.doctor`: nvcc, pycuda, driver and GPU checks of ``python -m lazytensor doctor``.

Importing this package loads nothing (no pycuda, no driver); the first kernel does.

>>> from lazytensor.core import backend
>>> backend.get("gpu").name, backend.get("cuda").copies_numpy
('cuda', True)
"""

from __future__ import annotations

from ...core.backend import BackendRuntime


class CudaBackend(BackendRuntime):
    """Torch CUDA tensors (``backend="auto"`` picks it for them), and NumPy arrays copied
    to GPU ``device_id`` and back with ``backend="gpu"``, as ``pykeops.numpy`` does."""

    name = "cuda"
    aliases = ("gpu",)
    device = "cuda"
    auto = 0
    copies_numpy = True
    needs = "torch CUDA tensors"

    @property
    def tuning(self):
        """The CUDA kernels' thresholds (:data:`lazytensor.codegen.cuda.TUNING`)."""
        from ...codegen.cuda import TUNING

        return TUNING

    def executor(self, call, shapes: tuple, out_specs: list):
        from .launch import CudaExecutor  # pycuda is imported when the kernel loads

        return CudaExecutor(call, out_specs)


BACKEND = CudaBackend()
