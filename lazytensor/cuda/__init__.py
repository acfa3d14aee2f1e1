"""The CUDA backend's runtime: pycuda, imported only when a CUDA tensor arrives.

- :mod:`.driver`: pycuda and the NVIDIA driver, devices, torch's primary contexts;
- :mod:`.kernels`: build (nvcc, kernel cache), load (``module_from_buffer``), block size;
- :mod:`.launch`: grid planning, argument packing, torch tensors and NumPy arrays;
- :mod:`.streams`: the stream rule (torch's current stream) and fault reporting.

Importing this package loads nothing (no pycuda, no driver); the first kernel does.

>>> from lazytensor.cuda import synchronize
>>> synchronize()   # nothing launched yet: nothing to wait for
"""


def synchronize(device=None) -> None:
    """Wait for lazytensor's CUDA kernels and raise, naming the kernel and its formula, if
    one of them failed (see :mod:`lazytensor.cuda.streams`)."""
    from .streams import synchronize as sync

    sync(device)


__all__ = ["synchronize"]
