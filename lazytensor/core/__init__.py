"""The call layer: what every reduction comes down to, before any backend.

- :mod:`.binding`: arrays to formula variables (shapes, dtypes, devices, batch dims);
- :mod:`.options`: pykeops's keywords parsed once (accuracy, GPU, reduction names, grad mode);
- :mod:`.call`: :class:`~.call.ReductionCall`, one bound reduction over j, and ``execute``;
- :mod:`.backend`: the backend protocol and the registry that finds the backends by name;
- :mod:`.kernels`: :class:`~.kernels.KernelSpec` and the build-and-load sequence of every
  backend's kernels (key, disk cache, render, compile, one load per process);
- :mod:`.half`: float16/bfloat16 inputs held as float32, outputs cast back;
- :mod:`.progress`, :mod:`.interrupt`, :mod:`.checks`: the logger and compile notices,
  Ctrl-C during a kernel, the records ``python -m lazytensor doctor`` prints.
"""
