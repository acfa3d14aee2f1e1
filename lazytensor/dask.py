"""Reductions of ``dask.array`` data: a task per (output chunk, reduced chunk), merged.

:func:`reduce` takes the function that builds the formula (as for NumPy arrays) and the
Dask (or NumPy) arrays to call it on. The output's rows follow the chunks of the output
side (``x_i`` for ``dim=1``); the reduced side (``y_j``) is broadcast whole when it is one
chunk (or a NumPy array), and otherwise each of its row chunks meets each output chunk
in its own task. Every task runs our kernel on its two chunks (compiled once per worker
process: the kernel cache on disk is shared by the processes that share its directory)
and returns the packed partial state of its block (:mod:`lazytensor.scale.merge`, global
indices); Dask's tree reduction merges the states of each output chunk, and a last task
per chunk turns them into the outputs. Results equal one process's (sums to rounding),
on the threaded, process and ``dask.distributed`` schedulers alike.

>>> import numpy as np, dask.array as da
>>> from lazytensor import Vi, Vj
>>> x, y = np.random.rand(1000, 3), np.random.rand(800, 3)
>>> idx = reduce(lambda x, y: Vi(x).sqdist(Vj(y)), da.from_array(x, chunks=300),
...              da.from_array(y, chunks=250), reduction="argkmin", K=5)
>>> idx.shape, idx.chunks[0]
((1000, 5), (300, 300, 300, 100))
>>> bool((idx.compute(scheduler="threads") == Vi(x).sqdist(Vj(y)).argKmin(5, dim=1)).all())
True
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .codegen import ir, reductions
from .core.binding import Variable
from .core.options import reduction_options
from .scale import blocks, merge


def _dask_array():
    try:
        import dask.array as da
    except ImportError:  # pragma: no cover - dask is an optional dependency
        raise ImportError("lazytensor.dask needs Dask: pip install 'lazytensor-kernels[distributed]'"
                          ) from None
    return da


@dataclass(frozen=True)
class TaskSpec:
    """What every task needs (pickled to the workers): the formula and which argument
    (or fixed parameter) each of its variables reads."""

    formula: ir.Node
    sources: tuple  # per variable: ("arg", k) or ("value", data)
    cats: tuple
    dims: tuple
    reduction: str
    axis: int
    opts: tuple
    backend: str
    dtype: str
    out_args: tuple  # the arguments on the output side, in the tasks' argument order
    red_args: tuple  # on the reduced side
    par_args: tuple  # parameters given as arguments

    @property
    def options(self) -> dict:
        return dict(self.opts)

    def variables(self, chunks: dict) -> list:
        return [Variable(chunks[src[1]] if src[0] == "arg" else src[1], c, d)
                for src, c, d in zip(self.sources, self.cats, self.dims)]


def pack(name: str, state: tuple, opts: dict, dim: int) -> np.ndarray:
    """One float64 array ``(..., width)`` holding a NumPy state (indices below 2**53 are
    exact), for schedulers that move one array per task."""
    shapes = merge.rule(name).state_shapes(opts, dim)
    lead = state[0].shape[: state[0].ndim - len(shapes[0][0])]
    return np.concatenate([np.asarray(a, dtype=np.float64).reshape(*lead, -1) for a in state],
                          axis=-1)


def unpack(name: str, packed: np.ndarray, opts: dict, dim: int, dtype) -> tuple:
    """The NumPy state that :func:`pack` stored in ``packed``."""
    lead, out, pos = packed.shape[:-1], [], 0
    for shape, kind in merge.rule(name).state_shapes(opts, dim):
        width = int(np.prod(shape))
        part = packed[..., pos: pos + width].reshape(*lead, *shape)
        pos += width
        out.append(part.astype(np.int64 if kind == "index" else
                               np.float64 if kind == "wide" else dtype))
    return tuple(out)


def _partial_task(plan: TaskSpec, offset, *chunks):
    """The packed state ``(n, 1, width)`` of one output chunk against one reduced chunk."""
    order = plan.out_args + plan.red_args + plan.par_args
    arrays = dict(zip(order, chunks))
    variables = plan.variables(arrays)
    n = arrays[plan.out_args[0]].shape[0] if plan.out_args else 1
    m = arrays[plan.red_args[0]].shape[0]
    state = blocks.block_state(plan.reduction, plan.formula, variables, plan.axis, plan.options,
                               m, int(np.asarray(offset).reshape(-1)[0]), (n,), plan.dtype,
                               plan.backend)
    return pack(plan.reduction, state, plan.options, plan.formula.dim)[:, None, :]


def _merge_task(plan: TaskSpec, packed, axis=None, keepdims=False):
    """Merge the states along axis 1 of ``packed`` (Dask's combine and aggregate)."""
    opts, dim = plan.options, plan.formula.dim
    states = [unpack(plan.reduction, packed[:, k], opts, dim, plan.dtype)
              for k in range(packed.shape[1])]
    out = pack(plan.reduction, merge.merge_all(plan.reduction, states, opts), opts, dim)
    return out[:, None, :] if keepdims else out


def _keep(packed, axis=None, keepdims=True):
    return packed


def _finalize_task(plan: TaskSpec, which: int, packed):
    state = unpack(plan.reduction, packed, plan.options, plan.formula.dim, plan.dtype)
    return merge.finalize(plan.reduction, state, plan.options, plan.dtype)[which]


def _probe(arg, k: int):
    shape = getattr(arg, "shape", None)
    if shape is None or len(shape) not in (1, 2):
        raise ValueError(f"reduce: argument {k} must be a 2D (rows, dim) or 1D (dim,) Dask or "
                         f"NumPy array, got {type(arg).__name__} of shape {shape}")
    dtype = np.dtype(arg.dtype)
    return np.zeros(shape if len(shape) == 1 else (2, shape[1]), dtype=dtype)


def _trace(formula, args, reduction):
    """The formula's IR and, per variable, its source (argument or fixed value)."""
    probes = [_probe(a, k) for k, a in enumerate(args)]
    built = formula(*probes)
    if reductions.get(reduction).weighted:
        if not (isinstance(built, tuple) and len(built) == 2):
            raise TypeError(f"reduce: with reduction={reduction!r} the formula must return "
                            "(f, weight): a scalar LazyTensor and the weight's LazyTensor")
        if built[0].formula.dim != 1:
            raise ValueError(f"{reduction}: f must be scalar, got dimension {built[0].formula.dim}")
        built = built[0].concat(built[1])
    if not hasattr(built, "formula") or not hasattr(built, "variables"):
        raise TypeError(f"reduce: the formula must return a LazyTensor, got {type(built).__name__}")
    sources = []
    for v in built.variables:
        k = next((k for k, p in enumerate(probes) if v.data is p or
                  getattr(v.data, "base", None) is p), None)
        if k is not None:
            sources.append(("arg", k))
        elif v.cat == "p":
            sources.append(("value", v.data))
        else:
            raise ValueError(f"reduce: the formula wraps {v.describe()}, which is not one of the "
                             "arguments; pass every i- and j-indexed array as an argument")
    return built, sources


def reduce(formula, *args, reduction: str = "sum", dim: int = 1, K: int | None = None,
           backend: str = "auto", split_every: int | None = None, **accuracy):
    """``reduction`` over ``dim`` of ``formula(*args)`` for Dask arrays ``args``.

    ``formula`` builds a LazyTensor from its arguments (``lambda x, y: Vi(x).sqdist(Vj(y))``;
    for a weighted reduction (``logsumexp_weight``, ``sumsoftmaxweight`` ...) it returns ``(f, weight)``).
    ``args``: 2D Dask or NumPy arrays (rows, dim), 1D ones for parameters. ``K`` for
    the K-min reductions; ``sum_scheme`` / ``dtype_acc`` as for :meth:`LazyTensor.sum`.
    Returns a Dask array (a tuple of two for ``min_argmin``, ``kmin_argkmin`` ...) whose
    rows are chunked as the output side's rows.
    """
    da = _dask_array()
    red = reductions.get(reduction)
    if dim not in (0, 1):
        raise ValueError(f"reduce: dim must be 0 (over i) or 1 (over j), got {dim!r}")
    built, sources = _trace(formula, args, reduction)
    opts = {**({"K": int(K)} if K is not None else {}), **reduction_options(red.name, **accuracy)}
    used = sorted({s[1] for s in sources if s[0] == "arg"})
    cat_of = {s[1]: v.cat for s, v in zip(sources, built.variables) if s[0] == "arg"}
    out_cat, red_cat = blocks.OUTPUT_CAT[dim], blocks.REDUCED_CAT[dim]
    out_args = tuple(k for k in used if cat_of[k] == out_cat)
    red_args = tuple(k for k in used if cat_of[k] == red_cat)
    par_args = tuple(k for k in used if cat_of[k] == "p")
    for side, c in ((out_args, out_cat), (red_args, red_cat)):
        if not side:
            raise ValueError(f"reduce: a reduction over {red_cat} needs an {c}-indexed argument "
                             f"(the {'output' if c == out_cat else 'reduced'} side's rows)")
        bad = [k for k in side if len(args[k].shape) != 2]
        if bad:
            raise ValueError(f"reduce: argument {bad[0]} ({c}-indexed) must be 2D (rows, dim), "
                             f"got shape {args[bad[0]].shape}")
    arrays = {k: da.asarray(args[k]) for k in used}
    for k in used:  # rows chunked alike on each side; the vector dimension in one chunk
        side = out_args if k in out_args else red_args if k in red_args else None
        chunks = {0: arrays[side[0]].chunks[0]} if side else {0: -1}
        if arrays[k].ndim == 2:
            chunks[1] = -1
        arrays[k] = arrays[k].rechunk(chunks)
    dtype = str(np.result_type(*[arrays[k].dtype for k in used]))
    plan = TaskSpec(built.formula, tuple(sources), tuple(v.cat for v in built.variables),
                    tuple(v.dim for v in built.variables), red.name, dim,
                    tuple(sorted(opts.items())), backend, dtype, out_args, red_args, par_args)
    total = arrays[red_args[0]].shape[0]
    red.check(built.formula.dim, opts, total)
    width = sum(int(np.prod(s)) for s, _ in merge.rule(red.name).state_shapes(opts,
                                                                             built.formula.dim))
    starts = np.concatenate([[0], np.cumsum(arrays[red_args[0]].chunks[0])[:-1]]).astype(np.int64)
    blockwise_args = [da.from_array(starts, chunks=1), ("j",)]
    for k in out_args + red_args + par_args:
        rows = ("i",) if k in out_args else ("j",) if k in red_args else ()
        blockwise_args += [arrays[k], (*rows, f"d{k}")]
    partials = da.blockwise(functools.partial(_partial_task, plan), ("i", "j", "w"),
                            *blockwise_args, new_axes={"w": width}, adjust_chunks={"j": 1},
                            align_arrays=False,
                            dtype=np.float64, concatenate=True,
                            meta=np.empty((0, 0, 0), dtype=np.float64))
    merged = da.reduction(partials, _keep, functools.partial(_merge_task, plan), axis=1,
                          combine=functools.partial(_merge_task, plan), dtype=np.float64,
                          split_every=split_every, concatenate=True,
                          meta=np.empty((0, 0), dtype=np.float64))
    outs = merge.finalize(red.name, merge.empty(red.name, (0,), opts, built.formula.dim, dtype,
                                                numpy=True), opts, dtype)
    results = tuple(
        merged.map_blocks(functools.partial(_finalize_task, plan, k), dtype=o.dtype,
                          chunks=(merged.chunks[0], *[(s,) for s in o.shape[1:]]),
                          new_axis=[2] if o.ndim == 3 else None,
                          meta=np.empty((0,) * o.ndim, dtype=o.dtype))
        for k, o in enumerate(outs))
    return results[0] if len(results) == 1 else results


__all__ = ["TaskSpec", "pack", "reduce", "unpack"]
