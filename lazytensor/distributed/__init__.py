"""Reductions sharded over a ``torch.distributed`` process group.

Each rank holds its own rows of the output side (``x_i`` for a reduction over j) and a
slice of the reduced side (``y_j``, of any size, even none). A reduction over j then
passes the j-blocks around a ring of ranks (the next block's transfer overlapped with
the kernel on the current one) or, when the j-data is small, gathers them all; the
blocks' partial results merge by the reduction's own rule (:mod:`lazytensor.scale.merge`), so
every rank gets, for its rows, what one process gets on all the data: sums to rounding,
arg-reductions with global indices. The formula does not change::

    import torch.distributed as dist
    from lazytensor import Vi, Vj
    import lazytensor.distributed as ltd

    dist.init_process_group("gloo")             # or "nccl" between GPUs
    K = (-Vi(x_local).sqdist(Vj(y_local))).exp()  # this rank's rows and j-slice
    a = K.sum(dim=1, group=dist.group.WORLD)      # or, for every reduction in a block:
    with ltd.sharded():                           # (mode="ring" | "allgather" | "auto")
        a = K @ b_local
        idx = Vi(x_local).sqdist(Vj(y_local)).argKmin(10, dim=1)   # global j indices

Parameters (``Pm``) are broadcast from the group's first rank once per call. Gradients:
those of the output side's variables stay on their rank, those of the reduced side's
variables go back to the rank that owns their rows, those of parameters are summed over
the group; so ``loss.backward()`` on every rank gives the gradients that one process
gets for the sum of the ranks' losses (as DistributedDataParallel sums before it
averages). Every rank must make the same reductions in the same order (and call
backward), as with any collective; a formula, dtype or option that differs between
ranks is reported on every rank before a kernel runs, and a rank that fails makes every
rank raise :class:`DistributedReductionError` (a rank that dies or stalls: within the
process group's timeout). Block-sparse ``ranges`` and batch dimensions are not
supported here.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports
from .context import Sharding, active, sharded

_EXPORTS = {"reduce": "api", "DistributedReductionError": "protocol", "last_stats": "api"}

__all__ = ["DistributedReductionError", "Sharding", "active", "last_stats", "reduce", "sharded"]


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
