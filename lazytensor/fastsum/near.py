"""Pairs closer than a radius, by the block-sparse kernels: truncation and near fields.

The points are labelled by the cells of a grid of side ``radius / k`` (``k`` = 1, 2 or 3),
sorted by cell, and each cell of targets reduces over the cells of sources whose boxes
are closer than the radius (``(2k + 1)^D`` neighbours at most, fewer where the gap
between the cells already exceeds the radius). :func:`neighbour_ranges` builds
pykeops's six ``ranges`` arrays directly from the cells (no C × C matrix), merging the
intervals of consecutive cells; :func:`ranged_sum` runs a formula on them
(:func:`lazytensor.scale.ranges.reduce`, differentiable in torch) and puts the rows back in
their order. Every pair closer than the radius is summed; pairs farther may be too.

>>> import numpy as np
>>> x = np.array([[0.0], [0.05], [0.9]]); y = np.array([[0.02], [0.5], [0.95]])
>>> cells = neighbour_ranges(x, y, np.zeros(1), 0.1)
>>> cells.pairs, cells.perm_x.tolist()    # 0 and 0.05 see 0.02; 0.9 sees 0.95
(3, [0, 1, 2])
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..core.binding import Variable, is_torch
from ..scale import ranges as ranges_mod


@dataclass(eq=False)
class Cells:
    """Sorted orders of the targets (``perm_x``) and sources (``perm_y``), the ``ranges``
    of the reduction over the sorted points, and the number of pairs they hold."""

    perm_x: np.ndarray
    perm_y: np.ndarray
    ranges: tuple
    pairs: int
    blocks: int


def _cells(points, lo, side, shape):
    coords = np.floor((points - lo) / side).astype(np.int64)
    coords = np.clip(coords, 0, np.asarray(shape) - 1)
    keys = np.ravel_multi_index(tuple(coords.T), shape)
    perm = np.argsort(keys, kind="stable")
    keys = keys[perm]
    unique, starts, counts = np.unique(keys, return_index=True, return_counts=True)
    return perm, unique, starts, counts


def offsets(D: int, k: int, radius: float, side: float) -> np.ndarray:
    """The cell offsets whose gap to a cell is below ``radius`` ((n, D) int64)."""
    out = [o for o in itertools.product(range(-k, k + 1), repeat=D)
           if sum((max(abs(c) - 1, 0) * side) ** 2 for c in o) < radius ** 2]
    return np.array(out, dtype=np.int64).reshape(-1, D)


def _intervals(src_unique, src_starts, src_counts, dst_unique, dst_starts, dst_counts, shape,
               offs):
    """For every cell of ``src``: the merged intervals of sorted ``dst`` rows of its
    neighbour cells: (ranges (C, 2), slices (C,), intervals (S, 2), pairs)."""
    coords = np.unravel_index(src_unique, shape)
    strides = np.cumprod((1,) + shape[:0:-1])[::-1]  # row-major strides of the cell grid
    inside = np.ones((len(src_unique), len(offs)), bool)
    for d in range(len(shape)):  # per dimension: (C, n) arrays, not (C, n, D)
        c = coords[d][:, None] + offs[None, :, d]
        inside &= (c >= 0) & (c < shape[d])
    keys = src_unique[:, None] + (offs @ strides)[None, :]
    idx = np.searchsorted(dst_unique, keys)
    idx = np.minimum(idx, len(dst_unique) - 1)
    found = inside & (dst_unique[idx] == keys)
    idx = np.where(found, idx, np.iinfo(np.int64).max)
    idx.sort(axis=1)
    C = len(src_unique)
    rows = np.repeat(np.arange(C), idx.shape[1])
    flat = idx.ravel()
    keep = flat != np.iinfo(np.int64).max
    rows, flat = rows[keep], flat[keep]
    # a new interval where the row changes or the next cell is not the next in order
    new = np.ones(len(flat), bool)
    new[1:] = (rows[1:] != rows[:-1]) | (flat[1:] != flat[:-1] + 1)
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(flat)).astype(np.int64) - 1
    last = last[: len(first)]
    starts = dst_starts[flat[first]]
    ends = dst_starts[flat[last]] + dst_counts[flat[last]]
    intervals = np.stack([starts, ends], 1).astype(np.int64)
    per_cell = np.bincount(rows[first], minlength=C)
    slices = np.cumsum(per_cell).astype(np.int64)
    ranges = np.stack([src_starts, src_starts + src_counts], 1).astype(np.int64)
    lengths = np.bincount(rows[first], weights=(ends - starts).astype(np.float64), minlength=C)
    pairs = int(np.dot(src_counts.astype(np.float64), lengths))
    return ranges, slices, intervals, pairs


def neighbour_ranges(x: np.ndarray, y: np.ndarray, lo: np.ndarray, radius: float,
                     k: int = 1) -> Cells:
    """The cells of side ``radius / k`` of the targets x (N, D) and sources y (M, D) from
    the corner ``lo``, and the ranges of all pairs of cells closer than ``radius``."""
    D = x.shape[1]
    side = radius / k
    hi = np.maximum(x.max(0), y.max(0))
    shape = tuple(int(s) for s in np.floor((hi - lo) / side).astype(np.int64) + 1)
    px, ux, sx, cx = _cells(x, lo, side, shape)
    py, uy, sy, cy = _cells(y, lo, side, shape)
    offs = offsets(D, k, radius, side)
    ri, si, rj_red, pairs = _intervals(ux, sx, cx, uy, sy, cy, shape, offs)
    rj, sj, ri_red, _ = _intervals(uy, sy, cy, ux, sx, cx, shape, -offs)
    return Cells(px, py, (ri, si, rj_red, rj, sj, ri_red), pairs, len(rj_red))


def count_pairs(x: np.ndarray, y: np.ndarray, lo: np.ndarray, radius: float, k: int = 1):
    """``(pairs, work items)`` :func:`neighbour_ranges` would give, from the cell counts."""
    D = x.shape[1]
    side = radius / k
    hi = np.maximum(x.max(0), y.max(0))
    shape = tuple(int(s) for s in np.floor((hi - lo) / side).astype(np.int64) + 1)
    if np.prod(np.asarray(shape, dtype=np.float64)) > 2 ** 62:
        return float("inf"), float("inf")
    _, ux, sx, cx = _cells(x, lo, side, shape)
    _, uy, sy, cy = _cells(y, lo, side, shape)
    _, _, intervals, pairs = _intervals(ux, sx, cx, uy, sy, cy, shape,
                                        offsets(D, k, radius, side))
    return pairs, len(intervals)


def _take(data, perm):
    if isinstance(data, (int, float)):
        return data
    if is_torch(data):
        import torch

        return data.index_select(-2, torch.as_tensor(perm, device=data.device))
    return data[..., perm, :]


def _float64(data):
    if isinstance(data, (int, float)):
        return float(data)
    return data.double() if is_torch(data) else np.asarray(data, dtype=np.float64)


def ranged_sum(formula, variables: list, cells: Cells, backend: str, grad_mode=None):
    """``Σ_j formula`` over the pairs of ``cells`` (a reduction over j, in float64), rows
    in the targets' original order: (N, E)."""
    moved = []
    for v in variables:
        perm = cells.perm_x if v.cat == "i" else cells.perm_y if v.cat == "j" else None
        data = _float64(v.data)
        moved.append(Variable(data if perm is None else _take(data, perm), v.cat, v.dim,
                              v.label))
    out = ranges_mod.reduce(formula, moved, "sum", 1, {}, backend, grad_mode, cells.ranges)
    inverse = np.empty_like(cells.perm_x)
    inverse[cells.perm_x] = np.arange(len(inverse))
    return _take(out, inverse)
