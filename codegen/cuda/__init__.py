"""CUDA code generation: the renderer and its kernel schemes (:mod:`.render`), nvcc
(:mod:`.nvcc`), the ptxas audit (:mod:`.ptxas`).

Pure like the rest of ``codegen``: IR in, CUDA source and cubins out. The runtime that
loads and launches the kernels is :mod:`lazytensor.backends.cuda`. :data:`TUNING` holds
the thresholds the backend hands to the shared passes (:mod:`lazytensor.codegen.tuning`).

>>> TUNING.wide
16
"""

from __future__ import annotations

from ..tuning import Tuning

# The thresholds the CUDA kernels were written and measured with (the shared passes read
# the CPU's before each backend stated its own): Sums wider than 16 components run as
# weighted sums (WIDE_SLICE = 16 components per thread), and a gradient's dot products of
# 16 to 4096 components are distributed.
TUNING = Tuning(wide=16, dot_min_dim=16, max_dot_dim=4096)
