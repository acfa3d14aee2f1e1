"""The backends, one folder each, behind the protocol of :mod:`lazytensor.core.backend`.

- :mod:`.cpu`: C++ kernels built with the system compiler (OpenMP + SIMD), loaded with
  ctypes, on NumPy arrays and torch CPU tensors;
- :mod:`.cuda`: CUDA kernels built with nvcc, loaded and launched through pycuda, on torch
  CUDA tensors (and NumPy arrays copied to a GPU);
- :mod:`.reference`: the dense float64 NumPy evaluator, the tests' oracle and the fallback
  where no compiler exists (``backend="numpy"``).

Each folder's ``BACKEND`` is found by the registry (:func:`lazytensor.core.backend.get`);
importing this package or a backend's folder loads no compiler, driver or kernel.
"""
