"""The dense reference evaluator: defines the semantics, is the oracle of the tests.

Formulas are evaluated in float64 NumPy on chunks of rows (bounded memory: about
``LAZYTENSOR_REF_CHUNK`` pair-components per chunk), then reduced with each
reduction's NumPy reference. Also used as the fallback backend when no compiler exists.

>>> import numpy as np
>>> from lazytensor.codegen import ir, ops
>>> x, y = ir.var(0, 1, "i"), ir.var(1, 1, "j")
>>> out = reduce(ops.apply("mul", x, y), [np.ones((2, 1)), np.arange(3.0)[:, None]],
...              ["i", "j"], (), 2, 3, "sum", {})
>>> out[0][:, 0].tolist()
[3.0, 3.0]
"""

from __future__ import annotations

import os

import numpy as np

from ...codegen import ir, reductions
from ...codegen.evaluate import evaluate

REF_CHUNK_ENV = "LAZYTENSOR_REF_CHUNK"


def chunk_budget() -> int:
    """Pair-components per chunk: ``$LAZYTENSOR_REF_CHUNK`` (a positive integer), else 2**22.

    >>> chunk_budget() > 0
    True
    """
    text = os.environ.get(REF_CHUNK_ENV, "").strip()
    if not text:
        return 1 << 22
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"${REF_CHUNK_ENV} must be a positive integer (pair-components per "
                         f"chunk of the reference backend), got {text!r}")
    return value


def _chunks(M: int, width: int) -> tuple[int, int]:
    """(rows, columns) of a chunk: about ``LAZYTENSOR_REF_CHUNK`` pair-components."""
    budget = chunk_budget()
    cols = max(1, min(M, budget // max(1, width)))
    return max(1, budget // (cols * max(1, width))), cols


def reduce(formula: ir.Node, data: list, cats: list, batch: tuple, N: int, M: int,
           reduction: str, opts: dict, ranges=None) -> list[np.ndarray]:
    """Outputs of ``reduction`` over j of ``formula``, shapes ``(*batch, N, dim)``, float64/int64.

    ``data[k]`` is variable k in canonical form (``(*b, N, D)``, ``(*b, M, D)`` or ``(*b, D)``,
    or a Python scalar), ``cats[k]`` its category. Chunks of j that do not fit the budget
    together are reduced one after the other and merged (:meth:`Reduction.merge`).
    ``ranges`` (a :class:`lazytensor.scale.ranges.BlockRanges`): each block of rows reduces over
    its intervals only, one after the other, merged in their order.
    """
    red = reductions.get(reduction)
    width = max(n.dim for n in ir.topo_order(formula))
    nbd = len(batch)
    arrays = []
    for x, cat in zip(data, cats):
        if isinstance(x, (int, float)):
            a = np.full((1,) * nbd + (1,), float(x))
        else:
            a = np.asarray(x, dtype=np.float64)
            a = a.reshape((1,) * (nbd - (a.ndim - (1 if cat == "p" else 2))) + a.shape)
        arrays.append(a)
    outs = [np.empty((*batch, N, o.dim), dtype=np.float64 if o.kind == "value" else np.int64)
            for o in red.outputs(formula.dim, opts)]
    step, cols = _chunks(M, width)
    used = {v.index for v in ir.variables(formula)}

    def values(b, i0, i1, j0, j1):
        env = {}
        for k, (a, cat) in enumerate(zip(arrays, cats)):
            if k not in used:
                continue
            ab = a[tuple(min(bi, s - 1) for bi, s in zip(b, a.shape[:nbd]))]
            if cat == "i":
                env[k] = ab[i0:i1, None, :]
            elif cat == "j":
                env[k] = ab[None, j0:j1, :]
            else:
                env[k] = ab[None, None, :]
        v = evaluate(formula, env) if env else np.zeros((1, 1, formula.dim))
        return np.broadcast_to(v, (i1 - i0, j1 - j0, formula.dim))

    with np.errstate(all="ignore"):
        for b in np.ndindex(*batch) if batch else [()]:
            for i0, i1, intervals in _segments(N, M, step, ranges):
                state = red.partial(values(b, i0, i1, 0, 0), opts, 0)  # the empty state
                for s, e in intervals:
                    for j0 in range(s, e, cols):
                        j1 = min(e, j0 + cols)
                        state = red.merge(state, red.partial(values(b, i0, i1, j0, j1), opts, j0),
                                          opts)
                for out, res in zip(outs, red.finalize(state, opts)):
                    out[b + (slice(i0, i1),)] = res
    return outs


def _segments(N: int, M: int, step: int, ranges):
    """(i0, i1, j-intervals) of at most ``step`` rows covering [0, N)."""
    if ranges is None:
        for i0 in range(0, N, step):
            yield i0, min(N, i0 + step), [(0, M)] if M else []
        return
    for a, b, s0, s1 in ranges.blocks.tolist():
        intervals = [tuple(iv) for iv in ranges.intervals[s0:s1].tolist()]
        for i0 in range(a, b, step):
            yield i0, min(b, i0 + step), intervals


def run_call(call, arrays: list, specs: list, ranges=None) -> list:
    """The outputs of a bound call (:class:`lazytensor.core.call.ReductionCall`) in its
    library, dtypes (``specs``) and device: evaluated here in float64."""
    from ...core.binding import is_torch
    from ...core.call import plain

    data = [plain(a).cpu().numpy() if is_torch(a) else a for a in arrays]
    res = reduce(call.formula, data, list(call.cats), call.batch, call.N, call.M,
                 call.reduction, call.opts_dict, ranges)
    outs = []
    for r, (_, dt) in zip(res, specs):
        if call.library == "torch":
            import torch

            outs.append(torch.from_numpy(r).to(dtype=dt, device=call.device))
        else:
            outs.append(r.astype(dt))
    return outs
