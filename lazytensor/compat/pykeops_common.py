"""pykeops.common.utils for the alias: axes and categories, batch shapes, the array tools,
the warm-up call (the messages are :mod:`lazytensor.compat.pykeops_utils`'s).

>>> axis2cat(1), cat2axis(0)
(0, 1)
"""

from __future__ import annotations

import numpy as np

from .pykeops_utils import _Genred, numpytools

C_TYPE = dict(float16="half2", float32="float", float64="double")


def axis2cat(axis: int) -> int:
    """The category of a reduction's output: 1 (j) for ``axis=0``, 0 (i) for ``axis=1``."""
    if axis not in (0, 1):
        raise ValueError("Axis should be 0 or 1.")
    return 1 - axis


def cat2axis(cat: int) -> int:
    """The reduced axis for an output of category ``cat`` (0: i, 1: j)."""
    if cat not in (0, 1):
        raise ValueError("Category should be Vi or Vj.")
    return 1 - cat


def max_tuple(a, b) -> tuple:
    """Componentwise maximum of two tuples (as long as the shorter one)."""
    return tuple(max(p, q) for p, q in zip(a, b))


def check_broadcasting(dims_1, dims_2):
    """The broadcast of two batch shapes (None is "no batch"); ValueError if they clash.

    >>> check_broadcasting((3, 1), (4,)), check_broadcasting(None, (2,))
    ((3, 4), (2,))
    """
    if dims_1 is None or dims_2 is None:
        return dims_2 if dims_1 is None else dims_1
    n = max(len(dims_1), len(dims_2))
    a = (1,) * (n - len(dims_1)) + tuple(dims_1)
    b = (1,) * (n - len(dims_2)) + tuple(dims_2)
    if any(p != 1 and q != 1 and p != q for p, q in zip(a, b)):
        raise ValueError(f"Incompatible batch dimensions: {dims_1} and {dims_2}.")
    return max_tuple(a, b)


def get_tools(lang: str):
    """The array tools of ``"numpy"`` or ``"torch"`` (``"pytorch"``)."""
    if lang == "numpy":
        return numpytools()
    if lang in ("torch", "pytorch"):
        from . import pykeops_torch_utils

        return pykeops_torch_utils.torchtools()
    raise ValueError(f"get_tools: lang must be 'numpy', 'torch' or 'pytorch', got {lang!r}")


def warm_up(lang: str = "numpy") -> None:
    """pykeops's ``common.utils.WarmUpGpu(lang)``: two small Gaussian sums, so that later
    timings leave out the first call's costs (here: loading the kernel)."""
    routine = _Genred("SqDist(x,y)", ["x = Vi(1)", "y = Vj(1)"], reduction_op="Sum", axis=1)
    dum = np.random.rand(10, 1)
    if lang != "numpy":
        import torch

        dum = torch.from_numpy(dum)
    routine(dum, dum)
    routine(dum, dum)
