"""Which process group the reductions of a LazyTensor run over (light: no torch import).

>>> with sharded(group="world", mode="ring") as s:
...     active(None) is s
True
>>> active(None) is None
True
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from datetime import timedelta

MODES = ("auto", "ring", "allgather")
# Below this many bytes of reduced-side data in all (every rank's slice), mode="auto"
# gathers the slices and runs one kernel: one collective instead of R ring steps.
ALLGATHER_BYTES = 4 << 20


@dataclass(frozen=True)
class Sharding:
    """A process group (``"world"``: the default group) and how to run over it.

    ``mode``: ``"ring"`` (pass the reduced side's blocks around the ranks, overlapped
    with the kernels), ``"allgather"`` (gather them, run one kernel), or ``"auto"`` (gather
    below ``allgather_bytes``). ``timeout``: the longest wait for one transfer (default:
    the process group's own timeout).
    """

    group: object = "world"
    mode: str = "auto"
    timeout: timedelta | None = None
    allgather_bytes: int = ALLGATHER_BYTES

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.timeout is not None and not isinstance(self.timeout, timedelta):
            object.__setattr__(self, "timeout", timedelta(seconds=float(self.timeout)))


_current: contextvars.ContextVar = contextvars.ContextVar("lazytensor_sharding", default=None)


@contextlib.contextmanager
def sharded(group="world", mode: str = "auto", timeout=None,
            allgather_bytes: int = ALLGATHER_BYTES):
    """Run the LazyTensor reductions of the block over ``group`` (see :class:`Sharding`)."""
    token = _current.set(Sharding(group, mode, timeout, allgather_bytes))
    try:
        yield _current.get()
    finally:
        _current.reset(token)


def active(group) -> Sharding | None:
    """The sharding of a reduction given ``group=`` (a process group, ``"world"``, a
    :class:`Sharding`, or None: the enclosing :func:`sharded` block's, if any)."""
    if group is None:
        return _current.get()
    if isinstance(group, Sharding):
        return group
    return Sharding(group)
