"""Block-sparse reductions: the ``ranges`` argument of pykeops.

When the points come in clusters (sorted so that each cluster is a contiguous run of rows,
see :mod:`lazytensor.cluster`), a reduction can skip the pairs of clusters that are known
not to interact (far apart, for a fast-decaying kernel). pykeops describes which pairs to
keep with six integer arrays::

    ranges = (ranges_i, slices_i, redranges_j, ranges_j, slices_j, redranges_i)

For a reduction over j (``dim=1``, Genred ``axis=1``): ``ranges_i`` (C, 2) are the
``[start, end)`` rows of the output's blocks; block k reduces over the j-intervals
``redranges_j[slices_i[k-1]:slices_i[k]]`` (``slices_i[-1]`` read as 0), in that order,
repeated intervals counted again. A reduction over i reads the other three the same way.

Semantics, where pykeops leaves them open: rows outside every block, and blocks without
intervals, get the value of an empty reduction (0 for sums, +inf and index -1 for min,
-inf for max and log-sum-exp); a block that reduces over fewer than K points in a K-min
pads with +inf and index -1 (K itself must not exceed the number of points, M for a
reduction over j: as without ranges, a larger K is refused). Blocks may come in any order but must not overlap. Indices
returned by arg-reductions are global (into the full j or i array).

Each block runs as an ordinary reduction on its rows and the concatenation of its
intervals (a view when that is one interval, a gathered copy of at most M rows
otherwise), so every backend, dtype and reduction works, and torch gradients flow
through the slicing to the inputs. Batch dimensions with ranges are not supported.

>>> import numpy as np
>>> from lazytensor import Vi, Vj
>>> x, y = np.arange(4.0)[:, None], np.arange(5.0)[:, None]
>>> ranges = (np.array([[0, 2], [2, 4]]), np.array([1, 2]), np.array([[0, 2], [3, 5]]),
...           np.array([[0, 2], [3, 5]]), np.array([1, 2]), np.array([[0, 2], [2, 4]]))
>>> (Vi(x) * Vj(y)).sum(dim=1, ranges=ranges)[:, 0].tolist()  # rows 0-1: j 0-1, rows 2-3: j 3-4
[0.0, 1.0, 14.0, 21.0]
"""

from __future__ import annotations

import numpy as np

from . import engine
from .binding import Variable, bind, is_torch
from .codegen import reductions

_OUT_CAT = {1: "i", 0: "j"}  # the category of the output's rows, per reduction axis


def _as_int_array(a, name: str) -> np.ndarray:
    if is_torch(a):
        a = a.detach().cpu().numpy()
    a = np.asarray(a)
    if a.dtype.kind not in "iu":
        raise TypeError(f"ranges: {name} must hold integers, got dtype {a.dtype}")
    return a.astype(np.int64)


def blocks(ranges, axis: int, n_out: int, n_red: int) -> list:
    """``[(start, end, intervals)]``: the output's blocks in row order, gaps included
    (with no intervals), after checking the arrays against the sizes."""
    if not isinstance(ranges, (tuple, list)) or len(ranges) != 6:
        raise ValueError("ranges must be a tuple of 6 integer arrays (ranges_i, slices_i, "
                         "redranges_j, ranges_j, slices_j, redranges_i), as pykeops; got "
                         f"{type(ranges).__name__}" + (f" of length {len(ranges)}"
                                                       if isinstance(ranges, (tuple, list)) else ""))
    o, r = _OUT_CAT[axis], "j" if axis == 1 else "i"
    names = (f"ranges_{o}", f"slices_{o}", f"redranges_{r}")
    out_r, slices, red = (_as_int_array(a, n) for a, n in
                          zip(ranges[:3] if axis == 1 else ranges[3:], names))
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
    for arr, n, size in ((out_r, names[0], n_out), (red, names[2], n_red)):
        bad = (arr[:, 0] < 0) | (arr[:, 0] > arr[:, 1]) | (arr[:, 1] > size)
        if np.any(bad):
            k = int(np.argmax(bad))
            raise ValueError(f"ranges: {n}[{k}] = {arr[k].tolist()} is not a range [start, end) "
                             f"within [0, {size}]")
    order = np.argsort(out_r[:, 0], kind="stable")
    out, pos = [], 0
    for k in order:
        a, b = int(out_r[k, 0]), int(out_r[k, 1])
        if a < pos:
            raise ValueError(f"ranges: the blocks of {names[0]} overlap (row {a} is in two "
                             "blocks); each output row may belong to one block at most")
        if a > pos:
            out.append((pos, a, ()))
        lo = int(slices[k - 1]) if k > 0 else 0
        out.append((a, b, tuple((int(s), int(e)) for s, e in red[lo:int(slices[k])] if e > s)))
        pos = b
    if pos < n_out:
        out.append((pos, n_out, ()))
    return [blk for blk in out if blk[1] > blk[0]]


def _merged(intervals) -> list:
    """Consecutive intervals that touch become one (the order of terms is kept)."""
    out = []
    for s, e in intervals:
        if out and out[-1][1] == s:
            out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def reduce(formula, variables: list, reduction: str, axis: int, opts: dict, backend: str,
           grad_mode, ranges):
    """:func:`lazytensor.engine.reduce` restricted to the blocks ``ranges`` describes."""
    sig = bind(variables)
    if sig.batch:
        raise NotImplementedError(f"ranges with batch dimensions {sig.batch} are not supported: "
                                  "loop over the batch, or fold it into the clusters")
    n_out, n_red = (sig.N, sig.M) if axis == 1 else (sig.M, sig.N)
    out_cat = _OUT_CAT[axis]
    red = reductions.get(reduction)
    # K > M is refused as without ranges; blocks that see fewer than K of the M points pad
    red.check(formula.dim, opts, M=n_red)
    F = formula.dim
    outputs = red.outputs(F, opts)[: red.user_outputs]
    torch_lib = sig.library == "torch"
    if torch_lib:
        import torch

        lib_cat = torch.cat
    else:
        lib_cat = np.concatenate
    pieces = [[] for _ in outputs]
    for a, b, intervals in blocks(ranges, axis, n_out, n_red):
        intervals = _merged(intervals)
        if len(intervals) == 1:
            s, e = intervals[0]
            take, index = slice(s, e), None
            n = e - s
        else:
            index = (np.concatenate([np.arange(s, e) for s, e in intervals]) if intervals
                     else np.zeros(0, dtype=np.int64))
            n = len(index)
            take = torch.from_numpy(index).to(sig.device) if torch_lib else index
        sub = []
        for v in variables:
            if v.is_scalar or v.cat == "p":
                sub.append(v)
            elif v.cat == out_cat:
                sub.append(Variable(v.data[a:b], v.cat, v.dim, v.label))
            else:
                sub.append(Variable(v.data[take], v.cat, v.dim, v.label))
        o = dict(opts)
        K = int(o["K"]) if red.needs_k else None
        if K is not None and n < K:  # fewer points than K in this block: pad
            if n == 0:
                res = _empty_kmin(outputs, b - a, K, F, sig)
            else:
                o["K"] = n
                res = engine.reduce(formula, sub, reduction, axis, o, backend, grad_mode)
                res = _pad_kmin(res if isinstance(res, tuple) else (res,), outputs, K, torch_lib)
        else:
            res = engine.reduce(formula, sub, reduction, axis, o, backend, grad_mode)
        res = res if isinstance(res, tuple) else (res,)
        for q, (output, r) in enumerate(zip(outputs, res)):
            if output.kind == "index" and n:
                r = _global_index(r, take, index, torch_lib)
            pieces[q].append(r)
    outs = []
    for q in range(len(outputs)):
        if pieces[q]:
            outs.append(lib_cat(pieces[q], 0))
        else:  # no rows at all: the plain reduction gives the empty result
            return engine.reduce(formula, variables, reduction, axis, opts, backend, grad_mode)
    return outs[0] if len(outs) == 1 else tuple(outs)


def _global_index(r, take, index, torch_lib):
    """Indices into a block's gathered points -> indices into the full array (-1 stays)."""
    if index is None:
        shifted = r + take.start
        return shifted.masked_fill(r < 0, -1) if torch_lib else np.where(r < 0, -1, shifted)
    if torch_lib:
        g = take[r.clamp(min=0)]
        return g.masked_fill(r < 0, -1)
    return np.where(r < 0, -1, index[np.maximum(r, 0)])


def _empty_kmin(outputs, rows, K, F, sig):
    """The K-min outputs of rows that reduce over no point: empty slots."""
    shape = (rows, K) if F == 1 else (rows, K, F)
    out = []
    for o in outputs:
        if sig.library == "torch":
            import torch

            dtype = getattr(torch, sig.dtype) if o.kind == "value" else torch.int64
            out.append(torch.full(shape, o.empty, dtype=dtype, device=sig.device))
        else:
            out.append(np.full(shape, o.empty, dtype=sig.dtype if o.kind == "value" else np.int64))
    return tuple(out)


def _pad_kmin(res, outputs, K, torch_lib):
    """K-min outputs of a block that reduced over n < K points, padded with empty slots."""
    out = []
    for o, r in zip(outputs, res):
        n = r.shape[1]
        shape = (r.shape[0], K - n) + tuple(r.shape[2:])
        fill = o.empty
        if torch_lib:
            import torch

            pad = torch.full(shape, fill, dtype=r.dtype, device=r.device)
            out.append(torch.cat([r, pad], 1))
        else:
            out.append(np.concatenate([r, np.full(shape, fill, dtype=r.dtype)], 1))
    return tuple(out)
