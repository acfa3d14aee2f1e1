"""Sums to a requested tolerance: ``K.sum(dim, tol=1e-6)``, ``K.__matmul__(b, tol=...)``,
``Genred(..., tol=...)`` and every Sum under ``lazytensor.options(tol=...)``.

For a sum whose formula is a radial kernel times a j-weight, ``Σ_j φ(|x_i − y_j|²) w_j``
in D ≤ 3 (:mod:`lazytensor.codegen.radial` proves it from the IR), a cost model
(:mod:`.choose`) picks one of

- ``exact``: every pair, as without ``tol`` (also the choice for every other formula);
- ``truncation``: the block-sparse kernels on the pairs of grid cells closer than the
  radius beyond which the kernel is below the budget (:mod:`.near`);
- ``spectral``: type-1 NUFFT of the sources, times the kernel's Fourier coefficients
  (the Gaussian's analytic transform, or the FFT of the profile sampled on a grid),
  type-2 NUFFT at the targets (:mod:`.spectral`, :mod:`.coefficients`; needs finufft,
  ``pip install lazytensor-kernels[fast]``);
- ``split``: for kernels not smooth at 0, the near part ``φ (1 − m)`` by the block-sparse
  kernels and the smooth far part ``φ m`` spectrally (:mod:`.split`), Ewald's idea with
  a mask ``m`` that vanishes at 0.

The contract (FMM3D's and FIGTree's): for every output row i and channel e,
``|s̃_ie − s_ie| ≤ tol · sup|K| · Σ_j |w_je|``, with ``sup|K|`` the largest ``|φ(r²)|`` for
``0 ≤ r ≤`` the diameter of the points' joint bounding box; for a kernel unbounded at 0
(Coulomb ``1/r``), the relative ℓ2 error of each output channel,
``‖s̃ − s‖₂ ≤ tol ‖s‖₂``. Gradients (torch) keep it: with respect to the weights the same
bound of the transposed sum; with respect to x_i, per component d,
``tol · sup|∂K/∂x_d| · Σ_e |g_ie| Σ_j |w_je|`` for the output gradient g. :func:`explain`
shows the choice, its parameters and its bound; the ``lazytensor`` logger says it at
DEBUG level.

>>> import numpy as np, lazytensor
>>> x = np.random.rand(500, 2); b = np.random.rand(500, 1)
>>> K = (-lazytensor.Vi(x).sqdist(lazytensor.Vj(x)) / 0.1).exp()
>>> bool(np.abs(K.__matmul__(b, tol=1e-6) - K @ b).max() <= 1e-6 * b.sum())
True
"""

from __future__ import annotations

from typing import Any, Callable

from .settings import (
    FLOAT32_MIN_TOL,
    FLOAT64_MIN_TOL,
    METHODS,
    check_tol,
    forced_method,
    options,
    resolve_tol,
)


def reducer(tol: float) -> Callable:
    """A function with :func:`lazytensor.engine.plans.reduce`'s signature that evaluates
    a Sum to ``tol`` (:func:`lazytensor.fastsum.run.reduce`)."""
    from . import run

    def reduce(formula, variables, reduction, axis, opts, backend="auto", grad_mode=None):
        return run.reduce(formula, variables, axis, opts, backend, grad_mode, tol)

    return reduce


def explain(K: Any, v: Any = None, dim: int = 1, tol: float | None = None) -> Any:
    """The method a sum to ``tol`` would use, without running it: ``K.sum(dim)`` (or
    ``K @ v``), as a :class:`lazytensor.fastsum.choose.Choice` (method, parameters, error
    bound, estimated cost of each candidate, the reason).

    >>> import numpy as np, lazytensor
    >>> x = np.random.rand(100, 3)
    >>> K = (-lazytensor.Vi(x).sqdist(lazytensor.Vj(x))).exp()
    >>> lazytensor.explain(K, np.ones(100), tol=1e-6).method    # 100 x 100 pairs: brute force
    'exact'
    """
    from . import run

    return run.explain(K, v, dim, tol if tol is not None else resolve_tol(None, "sum"))


__all__ = ["FLOAT32_MIN_TOL", "FLOAT64_MIN_TOL", "METHODS", "check_tol", "explain",
           "forced_method", "options", "reducer", "resolve_tol"]
