"""The CPU backend: C++ for g++ (OpenMP across work items, SIMD across j).

Modules: :mod:`~lazytensor.codegen.cpu.plan` (IR rewrites that move work out of the pair
loop), :mod:`~lazytensor.codegen.cpu.layout` (staged chunks, packed panels),
:mod:`~lazytensor.codegen.cpu.kernel` (the kernel's shape and its renderer,
:class:`~lazytensor.codegen.cpu.kernel.CpuRenderer`, :func:`render_cpu_kernel`),
:mod:`~lazytensor.codegen.cpu.rows` (``lt_rows``, the loop over a block of rows),
:mod:`~lazytensor.codegen.cpu.entry` (``lt_run`` and its work items),
:mod:`~lazytensor.codegen.cpu.wide` (sums of wide terms as weighted sums of j-vectors),
:mod:`~lazytensor.codegen.cpu.gemm` (the dot products' micro-kernel),
:mod:`~lazytensor.codegen.cpu.gather` (block-sparse intervals staged together),
:mod:`~lazytensor.codegen.cpu.twosided` (both sides of a gradient in one kernel),
:mod:`~lazytensor.codegen.cpu.simd` (vector types, ``lt_exp``),
:mod:`~lazytensor.codegen.cpu.stack` (the kernel's memory per thread). This module holds
the thresholds the backend's plan is tuned with, and :data:`TUNING`, those the backend
hands to the shared passes (:mod:`lazytensor.codegen.tuning`); nothing outside the CPU
backend imports them.

>>> WIDE, DOT_MIN_DIM, TUNING.wide
(16, 16, 16)
"""

from __future__ import annotations

import os

from ..tuning import Tuning

# Formulas up to this dimension vectorize across j; wider values (vectors of a j-variable
# read pair by pair, wide terms of a sum) are better handled along the vector.
WIDE = 16
DOT_MIN_DIM = 16  # dot products below this are as fast in the pair loop (measured, D=3..16)
MAX_DOT_DIM = 4096  # bounds the per-thread buffer of packed rows (rows per item x D)
HEADER_WORDS = 12  # words of lt_run's argument array before the data pointers (entry.py)
TUNING = Tuning(wide=WIDE, dot_min_dim=DOT_MIN_DIM, max_dot_dim=MAX_DOT_DIM)


def dot_tiling_enabled() -> bool:
    """``LAZYTENSOR_DOT_TILING=0`` turns the dot-product rewrite off (exact direct sums)."""
    return os.environ.get("LAZYTENSOR_DOT_TILING", "1") not in ("0", "false", "no")
