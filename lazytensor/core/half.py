"""Half-precision inputs: float16 and bfloat16 data computed in float32, returned as given.

pykeops computes in float16 on GPUs only. Here half-precision arrays become float32 where
they enter a formula (:func:`to_compute`, differentiable for torch tensors, so gradients
come back in the input's dtype); kernels, sums and gradients run in float32 (sums
accumulate in float64 as for float32 data), and the reduction's values are cast back to
the inputs' half dtype (:func:`cast_outputs`; indices stay int64). Half data mixed with
float32 or float64 data in one formula is an error, as any mix of dtypes.

>>> import numpy as np
>>> from lazytensor import Vi, Vj
>>> x = np.random.rand(5, 3).astype(np.float16)
>>> out = Vi(x).sqdist(Vj(x)).sum(dim=1)
>>> out.dtype, bool(np.allclose(out, ((x[:, None].astype(float) - x) ** 2).sum((1, 2))[:, None],
...                                 rtol=2e-3))
(dtype('float16'), True)
"""

from __future__ import annotations

from ..errors import ArgumentTypeError
from .binding import array_dtype, is_torch

HALF_DTYPES = ("float16", "bfloat16")


def half_dtype(data) -> str:
    """"float16" or "bfloat16" for half-precision arrays, else ""."""
    dt = array_dtype(data)
    return dt if dt in HALF_DTYPES else ""


def to_compute(data):
    """The float32 array a half-precision array is computed as (torch: differentiable)."""
    if is_torch(data):
        return data.float()
    return data.astype("float32")


def dtype_object(data, name: str):
    """The dtype called ``name`` in ``data``'s library."""
    if is_torch(data):
        import torch

        return getattr(torch, name)
    import numpy as np

    return np.dtype(name)


def output_dtype(variables: list) -> str:
    """The half dtype of a reduction's outputs ("" when its inputs are not half)."""
    halves = {v.io_dtype for v in variables if not v.is_scalar}
    if len(halves) > 1:
        desc = "; ".join(v.describe(k) for k, v in enumerate(variables) if not v.is_scalar)
        raise ArgumentTypeError(f"mixed dtypes in one formula ({desc}; half-precision "
                                f"inputs: {sorted(h for h in halves if h)}); convert all to "
                                "one dtype")
    return halves.pop() if halves else ""


def cast_outputs(result, dtype: str):
    """``result`` (one array or a tuple) with its floating-point values cast to ``dtype``."""
    if isinstance(result, tuple):
        return tuple(cast_outputs(r, dtype) for r in result)
    if is_torch(result):
        import torch

        return result.to(getattr(torch, dtype)) if result.is_floating_point() else result
    return result.astype(dtype) if result.dtype.kind == "f" else result


__all__ = ["HALF_DTYPES", "cast_outputs", "dtype_object", "half_dtype", "output_dtype",
           "to_compute"]
