"""One reduction over blocks of its reduced axis: run each block, merge, finalize.

The distributed (:mod:`lazytensor.distributed`) and Dask (:mod:`lazytensor.dask`)
reductions share these steps; :func:`split_reduce` runs them in one process, on slices
of the reduced variables, and gives what one reduction gives (to rounding for sums):

>>> import numpy as np
>>> from lazytensor import Vi, Vj
>>> x, y = np.random.rand(6, 2), np.random.rand(9, 2)
>>> K = Vi(x).sqdist(Vj(y))
>>> idx = split_reduce(K.formula, K.variables, "argkmin", 1, {"K": 3}, [0, 4, 4, 9])
>>> bool((idx == K.argKmin(3, dim=1)).all())
True
"""

from __future__ import annotations

from ..core.binding import Variable, is_torch
from ..engine import plans as engine
from . import merge

# The category of the rows that a reduction over ``axis`` reduces, and of its output's rows.
REDUCED_CAT = {1: "j", 0: "i"}
OUTPUT_CAT = {1: "i", 0: "j"}


def run_block(name: str, formula, variables: list, axis: int, opts: dict, m: int,
              backend: str = "auto", grad: bool = False, grad_mode: str | None = None) -> list:
    """The outputs of the merge rule's runs (its gradient runs if ``grad``) of ``name`` on
    one block of ``m >= 1`` reduced points (``variables`` hold the block's rows)."""
    r = merge.rule(name)
    runs = r.gradient_runs() if grad else r.runs
    if grad and not runs:
        raise NotImplementedError(f"the {name} reduction has no gradient")
    opts = r.block_opts(opts, m)
    outs: list = []
    for run in runs:
        res = engine.reduce(run.formula(formula), variables, run.reduction, axis, opts,
                            backend, grad_mode)
        outs.extend(res if isinstance(res, tuple) else (res,))
    return outs


def block_state(name: str, formula, variables: list, axis: int, opts: dict, m: int,
                offset: int, lead: tuple, dtype, backend: str = "auto") -> tuple:
    """The partial state of one block (``m`` reduced points from global index ``offset``;
    ``lead``: the output's leading shape, for an empty block)."""
    if m == 0:
        numpy = not any(is_torch(v.data) for v in variables if not v.is_scalar)
        return merge.empty(name, lead, opts, formula.dim, dtype, numpy=numpy)
    outs = run_block(name, formula, variables, axis, opts, m, backend)
    return merge.partial(name, outs, opts, offset, formula.dim)


def slice_rows(variables: list, axis: int, start: int, stop: int) -> list:
    """The variables with the reduced ones cut to rows ``[start, stop)``."""
    cat = REDUCED_CAT[axis]
    return [Variable(v.data[..., start:stop, :], v.cat, v.dim, v.label)
            if v.cat == cat and not v.is_scalar else v for v in variables]


def reduced_rows(variables: list, axis: int) -> int:
    """The number of reduced points (rows of the reduced variables)."""
    cat = REDUCED_CAT[axis]
    rows = {v.rows for v in variables if v.cat == cat and not v.is_scalar}
    if len(rows) != 1:
        kind = "j" if axis == 1 else "i"
        raise ValueError(f"a reduction over {kind} in blocks needs {kind}-variables with one "
                         f"number of rows, got {sorted(rows)}")
    return rows.pop()


def output_lead(variables: list, axis: int) -> tuple:
    """The leading shape ``(N,)`` of the output (1 row when no variable has its index)."""
    cat = OUTPUT_CAT[axis]
    rows = [v.rows for v in variables if v.cat == cat and not v.is_scalar]
    return (rows[0] if rows else 1,)


def split_reduce(formula, variables: list, name: str, axis: int, opts: dict, bounds: list,
                 backend: str = "auto"):
    """``name`` over the reduced axis split at ``bounds`` (``[0, ..., M]``), the blocks'
    states merged as a balanced tree; returns what :func:`lazytensor.engine.plans.reduce` does."""
    dtype = next((str(v.data.dtype).replace("torch.", "") for v in variables
                  if not v.is_scalar), "float64")
    lead = output_lead(variables, axis)
    states = [block_state(name, formula, slice_rows(variables, axis, a, b), axis, opts, b - a,
                          a, lead, dtype, backend) for a, b in zip(bounds[:-1], bounds[1:])]
    outs = merge.finalize(name, merge.merge_all(name, states, opts), opts, dtype)
    return outs[0] if len(outs) == 1 else outs


__all__ = ["OUTPUT_CAT", "REDUCED_CAT", "block_state", "output_lead", "reduced_rows",
           "run_block", "slice_rows", "split_reduce"]
