"""The settings of sums to a tolerance: ``tol``, its checks, and ``options(tol=...)``.

>>> check_tol(1e-6)
1e-06
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import Any

_TOL = contextvars.ContextVar("lazytensor_tol", default=None)
_METHOD = contextvars.ContextVar("lazytensor_method", default=None)
METHODS = ("exact", "truncation", "spectral", "split")

FLOAT32_MIN_TOL = 1e-6  # float32 outputs round at 6e-8 · |s|: a tol below this cannot hold
FLOAT64_MIN_TOL = 1e-12  # the transforms resolve about 1e-14; below, the exact sum


def check_tol(tol: Any) -> float:
    """``tol`` as a float in (0, 1), or ValueError naming it."""
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not math.isfinite(tol) \
            or not 0 < tol < 1:
        raise ValueError(f"tol must be a number in (0, 1), got {tol!r}")
    return float(tol)


@contextlib.contextmanager
def options(tol: float | None = None, method: str | None = None) -> Iterator[None]:
    """Within the block, every Sum reduction (``K @ b``, ``K.sum(dim)``, ``Genred`` sums)
    runs with ``tol`` unless it gives its own; ``tol=None`` restores exact sums.
    ``method`` ("exact", "truncation", "spectral", "split") overrides the cost model for
    the sums to a tolerance (a ValueError where it does not apply): for measurements.

    >>> import numpy as np, lazytensor
    >>> x = np.random.rand(300, 1); K = (-lazytensor.Vi(x).sqdist(lazytensor.Vj(x))).exp()
    >>> with lazytensor.options(tol=1e-3):
    ...     approx = K @ np.ones(300)
    >>> bool(np.abs(approx - K @ np.ones(300)).max() <= 1e-3 * 300)
    True
    """
    if method is not None and method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    token = _TOL.set(None if tol is None else check_tol(tol))
    token_m = _METHOD.set(method)
    try:
        yield
    finally:
        _TOL.reset(token)
        _METHOD.reset(token_m)


def forced_method() -> str | None:
    """The method :func:`options` imposes, if any."""
    return _METHOD.get()


def resolve_tol(tol: Any, reduction: str, ranges: Any = None, group: Any = None) -> float | None:
    """The tolerance a reduction runs with: ``tol`` if given (checked; only Sum takes it,
    and not with ``ranges``, ``group`` or under torch.compile), else the one of
    :func:`options` for a plain Sum outside torch.compile, else None (exact)."""
    from ..engine.plans import torch_compiling

    if tol is None:
        if reduction != "sum" or ranges is not None or group is not None or torch_compiling():
            return None  # (under torch.compile: the traced op, exact)
        return _TOL.get()
    tol = check_tol(tol)
    if torch_compiling():
        raise NotImplementedError("tol= is not supported under torch.compile or torch.export "
                                  "(the traced op is the exact sum)")
    if reduction != "sum":
        raise ValueError(f"tol= applies to Sum reductions only, not {reduction}")
    if ranges is not None or group is not None:
        raise ValueError("tol= chooses its own block-sparse pattern: it cannot be combined with "
                         f"{'ranges=' if ranges is not None else 'group='}")
    return tol
