"""The CPU backend: C++ for g++ (OpenMP across work items, SIMD across j).

Modules: :mod:`~lazytensor.codegen.cpu.plan` (IR rewrites that move work out of the pair
loop), :mod:`~lazytensor.codegen.cpu.layout` (staged chunks, packed panels),
:mod:`~lazytensor.codegen.cpu.kernel` (the ``lt_run`` skeleton, :func:`render_cpu_kernel`),
:mod:`~lazytensor.codegen.cpu.wide` (sums of wide terms as weighted sums of j-vectors),
:mod:`~lazytensor.codegen.cpu.gemm` (the dot products' micro-kernel),
:mod:`~lazytensor.codegen.cpu.simd` (vector types, ``lt_exp``). This module holds the
thresholds the backend's plan is tuned with (also read by the gradient planning of
:mod:`lazytensor.codegen.linearize`); it imports nothing.

>>> WIDE, DOT_MIN_DIM
(16, 16)
"""

from __future__ import annotations

import os

# Formulas up to this dimension vectorize across j; wider values (vectors of a j-variable
# read pair by pair, wide terms of a sum) are better handled along the vector.
WIDE = 16
DOT_MIN_DIM = 16  # dot products below this are as fast in the pair loop (measured, D=3..16)
MAX_DOT_DIM = 4096  # bounds the per-thread buffer of packed rows (rows per item x D)
HEADER_WORDS = 12  # words of lt_run's argument array before the data pointers (kernel.py)


def dot_tiling_enabled() -> bool:
    """``LAZYTENSOR_DOT_TILING=0`` turns the dot-product rewrite off (exact direct sums)."""
    return os.environ.get("LAZYTENSOR_DOT_TILING", "1") not in ("0", "false", "no")
