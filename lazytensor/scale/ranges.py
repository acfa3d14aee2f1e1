"""Block-sparse reductions: the ``ranges`` argument of pykeops.

When the points come in clusters (sorted so that each cluster is a contiguous run of rows,
see :mod:`lazytensor.scale.cluster`), a reduction can skip the pairs of clusters that are known
not to interact (far apart, for a fast-decaying kernel). pykeops describes which pairs to
keep with six integer arrays::

    ranges = (ranges_i, slices_i, redranges_j, ranges_j, slices_j, redranges_i)

For a reduction over j (``dim=1``, Genred ``axis=1``): ``ranges_i`` (C, 2) are the
``[start, end)`` rows of the output's blocks; block k reduces over the j-intervals
``redranges_j[slices_i[k-1]:slices_i[k]]`` (``slices_i[-1]`` read as 0), in that order,
repeated intervals counted again. A reduction over i reads the other three the same way,
and so does the gradient of a reduction over j with respect to the j-variables (the
transposed pattern): the six arrays must describe the same pairs both ways, as
:func:`lazytensor.scale.cluster.from_matrix` makes them.

Semantics, where pykeops leaves them open: rows outside every block, and blocks without
intervals, get the value of an empty reduction (0 for sums, +inf and index -1 for min,
-inf for max and log-sum-exp); a block that reduces over fewer than K points in a K-min
pads with +inf and index -1 (K itself must not exceed the number of points, M for a
reduction over j: as without ranges, a larger K is refused). Blocks may come in any order
but must not overlap. Indices returned by arg-reductions are global (into the full j or i
array). With batch dimensions, the same ranges apply in every batch element (pykeops
refuses batch dimensions with ranges).

The kernels take the pattern as data (:class:`BlockRanges`: blocks of rows with their
lists of intervals) and run every (piece of a block, its intervals) as a work item of one
launch, with the accumulators and merges of the full product; gradients are reductions
with the same (or the transposed) ranges.

>>> import numpy as np
>>> from lazytensor import Vi, Vj
>>> x, y = np.arange(4.0)[:, None], np.arange(5.0)[:, None]
>>> ranges = (np.array([[0, 2], [2, 4]]), np.array([1, 2]), np.array([[0, 2], [3, 5]]),
...           np.array([[0, 2], [3, 5]]), np.array([1, 2]), np.array([[0, 2], [2, 4]]))
>>> (Vi(x) * Vj(y)).sum(dim=1, ranges=ranges)[:, 0].tolist()  # rows 0-1: j 0-1, rows 2-3: j 3-4
[0.0, 1.0, 14.0, 21.0]
"""

from __future__ import annotations

import zlib
from collections import OrderedDict

import numpy as np

from .. import forks
from ..core.binding import bind, is_torch
from ..engine import plans as engine

_NAMES = (("ranges_i", "slices_i", "redranges_j"), ("ranges_j", "slices_j", "redranges_i"))


def _as_int_array(a, name: str) -> np.ndarray:
    if is_torch(a):
        a = a.detach().cpu().numpy()
    a = np.asarray(a)
    if a.dtype.kind not in "iu":
        raise TypeError(f"ranges: {name} must hold integers, got dtype {a.dtype}")
    return a.astype(np.int64, copy=False)


class BlockRanges:
    """One direction of a block-sparse reduction over j, as the kernels take it.

    ``blocks`` (nb, 4) int64: ``(i0, i1, s0, s1)``, blocks of rows sorted by ``i0`` that
    cover ``[0, n_out)`` once (gaps are blocks without intervals); block rows reduce over
    ``intervals[s0:s1]`` ((S, 2) int64 ``[start, end)``, empty ones dropped and touching
    consecutive ones joined). ``pairs``: the (i, j) pairs kept, per batch element.
    :meth:`t` gives the transposed direction (a reduction over i), from the other three
    arrays.

    >>> r = BlockRanges.build((np.array([[1, 3]]), np.array([2]), np.array([[0, 2], [2, 5]]),
    ...                        np.array([[0, 5]]), np.array([1]), np.array([[1, 3]])), 4, 6)
    >>> r.blocks.tolist(), r.intervals.tolist(), r.pairs
    ([[0, 1, 0, 0], [1, 3, 0, 1], [3, 4, 0, 0]], [[0, 5]], 10)
    """

    def __init__(self, blocks: np.ndarray, intervals: np.ndarray, pairs: int, source: tuple,
                 sizes: tuple, names: tuple):
        self.blocks, self.intervals, self.pairs = blocks, intervals, pairs
        self._source, self._sizes, self._names = source, sizes, names
        self._t = None
        self._empty = None
        self._device: dict = {}

    @classmethod
    def build(cls, ranges, n_out: int, n_red: int, axis: int = 1) -> BlockRanges:
        """Check pykeops's 6-tuple against the sizes; the direction of a reduction over
        ``axis`` (1: over j, the first three arrays; 0: over i, the last three)."""
        if not isinstance(ranges, (tuple, list)) or len(ranges) != 6:
            length = f" of length {len(ranges)}" if isinstance(ranges, (tuple, list)) else ""
            raise ValueError("ranges must be a tuple of 6 integer arrays (ranges_i, slices_i, "
                             "redranges_j, ranges_j, slices_j, redranges_i), as pykeops; got "
                             f"{type(ranges).__name__}{length}")
        half = 0 if axis == 1 else 1
        source = tuple(ranges[3 * half: 3 * half + 3]) + tuple(ranges[3 - 3 * half: 6 - 3 * half])
        names = _NAMES[half] + _NAMES[1 - half]
        return cls._from(source, (n_out, n_red), names)

    @classmethod
    def _from(cls, source: tuple, sizes: tuple, names: tuple) -> BlockRanges:
        arrays = [_as_int_array(a, n) for a, n in zip(source[:3], names[:3])]
        blocks, intervals, pairs = _blocks(*arrays, *sizes, names[:3])
        return cls(blocks, intervals, pairs, source, sizes, names)

    def t(self) -> BlockRanges:
        """The transposed direction (i and j exchanged), checked on first use."""
        if self._t is None:
            s, (n_out, n_red), nm = self._source, self._sizes, self._names
            self._t = BlockRanges._from(s[3:] + s[:3], (n_red, n_out), nm[3:] + nm[:3])
            self._t._t = self
        return self._t

    def empty_rows(self) -> np.ndarray:
        """(n_out,) bool: the rows that reduce over no pair (kept).

        >>> r = BlockRanges(np.array([[0, 2, 0, 1], [2, 3, 1, 1]]), np.array([[0, 3]]), 6,
        ...                 (), (), ())
        >>> r.empty_rows().tolist()
        [False, False, True]
        """
        if self._empty is None:
            blk = self.blocks
            self._empty = np.repeat(blk[:, 3] == blk[:, 2], blk[:, 1] - blk[:, 0])
        return self._empty

    def pieces(self, rows: int) -> np.ndarray:
        """The blocks cut into pieces of at most ``rows`` rows: (n, 4) int64 ``(i0, i1,
        s0, s1)``, in order (the work items of a CUDA launch).

        >>> r = BlockRanges(np.array([[0, 5, 0, 1], [5, 6, 1, 1]]), np.array([[0, 3]]), 15,
        ...                 (), (), ())
        >>> r.pieces(2).tolist()
        [[0, 2, 0, 1], [2, 4, 0, 1], [4, 5, 0, 1], [5, 6, 1, 1]]
        """
        blk = self.blocks
        count = -(-(blk[:, 1] - blk[:, 0]) // rows)
        owner = np.repeat(np.arange(len(blk)), count)
        first = np.repeat(np.cumsum(count) - count, count)
        i0 = blk[owner, 0] + (np.arange(len(owner)) - first) * rows
        i1 = np.minimum(i0 + rows, blk[owner, 1])
        return np.ascontiguousarray(np.stack([i0, i1, blk[owner, 2], blk[owner, 3]], 1),
                                    dtype=np.int64)

    def on(self, device: str, rows: int):
        """``(pieces(rows), intervals)`` as int64 torch tensors on ``device`` (kept)."""
        got = self._device.get((device, rows))
        if got is None:
            import torch

            got = self._device[(device, rows)] = tuple(
                torch.from_numpy(a).to(device) for a in (self.pieces(rows), self.intervals))
        return got


def _blocks(out_r, slices, red, n_out: int, n_red: int, names: tuple):
    """(blocks, intervals, pairs) of one direction (see :class:`BlockRanges`)."""
    if out_r.ndim != 2 or out_r.shape[1] != 2:
        raise ValueError(f"ranges: {names[0]} must have shape (C, 2), got {out_r.shape}")
    C = out_r.shape[0]
    if slices.shape != (C,):
        raise ValueError(f"ranges: {names[1]} must have shape ({C},) like {names[0]}, got "
                         f"{slices.shape}")
    if red.ndim != 2 or red.shape[1] != 2:
        raise ValueError(f"ranges: {names[2]} must have shape (S, 2), got {red.shape}")
    if C and (np.any(np.diff(slices) < 0) or slices[0] < 0 or slices[-1] > red.shape[0]):
        raise ValueError(f"ranges: {names[1]} must be non-decreasing, within [0, "
                         f"{red.shape[0]}] (the rows of {names[2]}); got {slices.tolist()}")
    total = int(slices[-1]) if C else 0
    for arr, n, size in ((out_r, names[0], n_out), (red[:total], names[2], n_red)):
        bad = (arr[:, 0] < 0) | (arr[:, 0] > arr[:, 1]) | (arr[:, 1] > size)
        if np.any(bad):
            k = int(np.argmax(bad))
            raise ValueError(f"ranges: {n}[{k}] = {arr[k].tolist()} is not a range [start, end) "
                             f"within [0, {size}]")
    # block k's intervals are red[slices[k-1]:slices[k]]: together, red[:total] in order
    counts = np.diff(slices, prepend=0) if C else np.zeros(0, np.int64)
    owner = np.repeat(np.arange(C), counts)
    iv = red[:total]
    keep = iv[:, 1] > iv[:, 0]
    iv, owner = iv[keep], owner[keep]
    # consecutive intervals of a block that touch become one (the order of terms is kept)
    first = np.ones(len(iv), bool)
    first[1:] = (owner[1:] != owner[:-1]) | (iv[1:, 0] != iv[:-1, 1])
    starts = np.flatnonzero(first)
    lasts = np.append(starts[1:], len(iv)) - 1
    intervals = np.stack([iv[starts, 0], iv[lasts, 1]], 1) if len(iv) else np.zeros((0, 2), np.int64)
    owner = owner[starts]
    n_iv = np.bincount(owner, minlength=C)
    s1 = np.cumsum(n_iv)
    length = np.bincount(owner, weights=intervals[:, 1] - intervals[:, 0], minlength=C)
    rows = out_r[:, 1] - out_r[:, 0]
    full = rows > 0
    i0, i1 = out_r[full, 0], out_r[full, 1]
    order = np.argsort(i0, kind="stable")
    i0, i1 = i0[order], i1[order]
    if len(i0) > 1 and np.any(i0[1:] < i1[:-1]):
        k = int(np.argmax(i0[1:] < i1[:-1]))
        raise ValueError(f"ranges: the blocks of {names[0]} overlap (row {int(i0[k + 1])} is in "
                         "two blocks); each output row may belong to one block at most")
    own = np.stack([i0, i1, (s1 - n_iv)[full][order], s1[full][order]], 1)
    prev_end = np.concatenate([[0], i1])
    next_start = np.concatenate([i0, [n_out]])
    gap = next_start > prev_end
    gaps = np.stack([prev_end[gap], next_start[gap]] + [np.zeros(int(gap.sum()), np.int64)] * 2, 1)
    blocks = np.concatenate([own, gaps]).astype(np.int64)
    blocks = np.ascontiguousarray(blocks[np.argsort(blocks[:, 0], kind="stable")])
    pairs = int(np.dot(rows[full].astype(np.float64), length[full]))
    return blocks, np.ascontiguousarray(intervals, dtype=np.int64), pairs


def reduce(formula, variables: list, reduction: str, axis: int, opts: dict, backend: str,
           grad_mode, ranges):
    """:func:`lazytensor.engine.plans.reduce` restricted to the blocks ``ranges`` describes."""
    sig = bind(variables)
    n_out, n_red = (sig.N, sig.M) if axis == 1 else (sig.M, sig.N)
    return engine.reduce(formula, variables, reduction, axis, opts, backend, grad_mode,
                         ranges=cached(ranges, n_out, n_red, axis))


# Iterative methods (Sinkhorn, conjugate gradients) pass the same ranges at every call:
# their BlockRanges are kept, for as long as the arrays are the same objects with the
# same contents (torch: the version counter of in-place changes; NumPy: a checksum).
_CACHE_SIZE = 8
_cache: OrderedDict = OrderedDict()
_cache_lock = forks.lock()


def _stamp(a):
    if is_torch(a):
        return ("torch", a.data_ptr(), a._version, tuple(a.shape), str(a.device))
    if isinstance(a, np.ndarray):
        return ("numpy", a.ctypes.data, a.shape, a.dtype.str,
                zlib.crc32(np.ascontiguousarray(a).view(np.uint8)) if a.size else 0)
    return None


def cached(ranges, n_out: int, n_red: int, axis: int) -> BlockRanges:
    """:meth:`BlockRanges.build`, kept for the next call with the same arrays."""
    if not isinstance(ranges, (tuple, list)) or len(ranges) != 6:
        return BlockRanges.build(ranges, n_out, n_red, axis)
    stamps = tuple(_stamp(a) for a in ranges)
    if any(st is None for st in stamps):
        return BlockRanges.build(ranges, n_out, n_red, axis)
    key = (tuple(id(a) for a in ranges), n_out, n_red, axis)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] == stamps and all(a is b for a, b in zip(hit[1], ranges)):
            _cache.move_to_end(key)
            return hit[2]
    built = BlockRanges.build(ranges, n_out, n_red, axis)
    with _cache_lock:
        _cache[key] = (stamps, tuple(ranges), built)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return built
