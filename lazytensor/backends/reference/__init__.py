"""The reference backend (``backend="numpy"``): the dense float64 evaluator of
:mod:`.dense`, on arrays of any device (copied to the host and back).

>>> from lazytensor.core import backend
>>> backend.get("numpy").device is None
True
"""

from __future__ import annotations

from ...core.backend import BackendRuntime


class ReferenceBackend(BackendRuntime):
    """Dense NumPy in float64, chunked over rows: slow, exact, always available."""

    name = "numpy"
    device = None
    needs = "arrays"
    contiguous_inputs = False

    def executor(self, call, shapes: tuple, out_specs: list):
        from .dense import run_call

        return lambda arrays, ranges=None: run_call(call, arrays, out_specs, ranges)


BACKEND = ReferenceBackend()
