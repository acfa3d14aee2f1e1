"""What a backend's kernels are tuned with: the thresholds the shared planning passes read.

The passes every backend shares (:mod:`lazytensor.codegen.linearize`: sums of wide terms
as weighted sums of vectors, and the form of a gradient's sums) decide by thresholds that
belong to a backend's kernels: from which dimension a formula no longer vectorizes across
j as it is, which dot products the backend computes as small matrix products. They
import no backend's constants: each backend states its :class:`Tuning`
(:data:`lazytensor.codegen.cpu.TUNING`, :data:`lazytensor.codegen.cuda.TUNING`) and
passes it in, and the runtime plans a call's gradients with the tuning of the call's
backend (``BackendRuntime.tuning``).

>>> t = Tuning(wide=16, dot_min_dim=16, max_dot_dim=4096)
>>> t.wide, t.dot_min_dim
(16, 16)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tuning:
    """A backend's thresholds for the shared passes.

    ``wide``: formulas up to this dimension vectorize across j as they are; a wider Sum is
    planned as weighted sums of vectors, whose pair loop carries at most ``wide`` weights
    and direct components. ``dot_min_dim`` / ``max_dot_dim``: the dimensions of the dot
    products the backend computes as small matrix products (a gradient's ``⟨g, v - w⟩``
    is written as a difference of such dots).
    """

    wide: int
    dot_min_dim: int
    max_dot_dim: int
