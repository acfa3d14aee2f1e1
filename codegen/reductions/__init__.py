"""The reduction registry: one class per reduction carries every fact about it.

:mod:`~lazytensor.codegen.reductions.base` defines what a reduction is (names, options,
outputs, C hooks, array-level state and merge, gradient and dual forms);
:mod:`~lazytensor.codegen.reductions.sums`, :mod:`~lazytensor.codegen.reductions.select`
and :mod:`~lazytensor.codegen.reductions.lse` register Sum, the selections (Min, Max, the
K-min family and their indices) and the log-sum-exp family. Every other module reads
these attributes; none keeps a table of reduction names.

>>> get("Min_ArgMin_Reduction").arg_variant, get("min").arg_variant, get("kmin").needs_k
(None, 'min_argmin', True)
"""

from . import lse, select, sums  # noqa: F401  (register the reductions)
from .base import REDUCTIONS, Output, Reduction, all_reductions, get, register

__all__ = ["REDUCTIONS", "Output", "Reduction", "all_reductions", "get", "register"]
