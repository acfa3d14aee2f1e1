"""Merging partial results of one reduction computed on separate blocks of the reduced axis.

A reduction over j split into j-blocks (ranks of a process group, Dask chunks) runs one
or two ordinary reductions per block (:attr:`Rule.runs`), turns their outputs into a
*partial state* (:func:`partial`, indices made global by the block's offset), merges
states two by two (:func:`merge`, in any order and grouping) and turns the last state
into the outputs that one reduction over all of j gives (:func:`finalize`). What the
runs, the state and its merge are is the reduction record's (``block_runs``,
``from_block``, ``merge``, ``block_outputs`` in :mod:`lazytensor.codegen.reductions`):
this module only runs them, in torch.

States are tuples of torch tensors or of NumPy arrays (the result is of the inputs'
kind); torch states are differentiable, so that the gradient of the merged result with
respect to each block's outputs (:func:`cotangents`) comes from torch's autograd.

>>> import numpy as np
>>> y = np.array([4.0, 1.0, 3.0, 1.0, 0.5])[:, None]
>>> a = partial("argmin", (y[None, :3].min(1), y[None, :3].argmin(1)), {}, offset=0)
>>> b = partial("argmin", (y[None, 3:].min(1), y[None, 3:].argmin(1)), {}, offset=3)
>>> finalize("argmin", merge("argmin", b, a, {}), {}, "float64")[0].tolist()
[[4]]
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from ..codegen import ir, ops, reductions


@dataclass(frozen=True)
class Run:
    """One ordinary reduction run on each block: ``reduction`` of the whole formula
    (``part="all"``) or of its scalar component 0 (``part="f"``, weighted reductions)."""

    reduction: str
    part: str = "all"

    def formula(self, formula: ir.Node) -> ir.Node:
        return formula if self.part == "all" else ops.apply("slice", formula, params=(0, 1))


class Rule:
    """How the partial results of one reduction merge: its record's block hooks, on torch
    tensors (:func:`rule` makes one per reduction)."""

    def __init__(self, red: reductions.Reduction):
        self.red = red
        self.runs = tuple(Run(*r) for r in red.block_runs)
        grad = red.grad_block_runs
        self.grad_runs = None if grad is None else tuple(Run(*r) for r in grad)

    def gradient_runs(self) -> tuple:
        """The runs whose outputs gradients flow through (:func:`cotangents`)."""
        return self.runs if self.grad_runs is None else self.grad_runs

    def block_opts(self, opts: dict, m: int) -> dict:
        """The options of the runs on a block of ``m`` reduced points."""
        return self.red.block_opts(opts, m)

    def partial(self, outs, opts, offset, dim):
        return tuple(self.red.from_block(list(outs), opts, offset, dim))

    def grad_partial(self, outs, opts, offset, dim):
        return tuple(self.red.grad_from_block(list(outs), opts, offset, dim))

    def canonical(self, state, opts, offset, m):
        """The outputs of :meth:`gradient_runs` that give ``state`` (detached)."""
        outs = self.red.to_block([x.detach() for x in state], opts, offset, m)
        return tuple(outs)

    def empty(self, lead: tuple, opts: dict, dim: int, dtype) -> tuple:
        """The state of a block without points: each array filled with its empty value."""
        kinds = {"value": dtype, "index": torch.int64, "wide": torch.float64}
        return tuple(torch.full((*lead, *shape), fill, dtype=kinds[kind])
                     for shape, kind, fill in self.red.state_layout(opts, dim))

    def merge(self, a, b, opts):
        return tuple(self.red.merge(list(a), list(b), opts))

    def finalize(self, state, opts, dtype) -> tuple:
        """The outputs (in the order engine.reduce returns them), values in ``dtype``."""
        return tuple(o.to(dtype) if o.is_floating_point() else o
                     for o in self.red.block_outputs(list(state), opts))

    def state_shapes(self, opts: dict, dim: int) -> list:
        """(trailing shape, kind) of each state tensor; kind: "value" (the data's dtype),
        "index" (int64) or "wide" (float64)."""
        return [(shape, kind) for shape, kind, _ in self.red.state_layout(opts, dim)]


@functools.cache
def _rule(red: reductions.Reduction) -> Rule:
    return Rule(red)


def rule(name: str) -> Rule:
    """The merge rule of a reduction (registry name or alias)."""
    red = reductions.get(name)
    if not red.block_runs:
        raise ValueError(f"the {red.name} reduction has no merge rule")
    return _rule(red)


def _to_torch(arrays):
    numpy_in = any(isinstance(a, np.ndarray) for a in arrays)
    return [torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
            for a in arrays], numpy_in


def _like(arrays, numpy_out: bool) -> tuple:
    return tuple(a.detach().numpy() if numpy_out else a for a in arrays)


def partial(name: str, outputs, opts: dict, offset: int = 0, dim: int = 1) -> tuple:
    """The partial state of ``name`` from the outputs of its :attr:`Rule.runs` on one
    block whose first reduced point has global index ``offset``; ``dim`` is the
    formula's dimension (``concat(f, w)`` for the weighted ones)."""
    outs, numpy_in = _to_torch(list(outputs))
    return _like(rule(name).partial(outs, opts, int(offset), dim), numpy_in)


def merge(name: str, a: tuple, b: tuple, opts: dict) -> tuple:
    """The state of ``name`` over the union of the blocks of states ``a`` and ``b``."""
    both, numpy_in = _to_torch([*a, *b])
    return _like(rule(name).merge(tuple(both[: len(a)]), tuple(both[len(a):]), opts), numpy_in)


def finalize(name: str, state: tuple, opts: dict, dtype) -> tuple:
    """The outputs of ``name`` (a tuple, in the order engine.reduce returns them) from a
    merged state; ``dtype`` is the values' dtype ("float32", "float64" or a torch dtype)."""
    st, numpy_in = _to_torch(list(state))
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return _like(rule(name).finalize(tuple(st), opts, dt), numpy_in)


def merge_all(name: str, states: list, opts: dict) -> tuple:
    """Merge a list of states pairwise, as a balanced tree (rounding grows as log n)."""
    states = list(states)
    while len(states) > 1:
        states = [merge(name, states[k], states[k + 1], opts) if k + 1 < len(states) else
                  states[k] for k in range(0, len(states), 2)]
    return states[0]


def cotangents(name: str, states: list, offsets: list, sizes: list, grads: list, opts: dict,
               dtype, dim: int) -> list:
    """For each block, the cotangents of the outputs of its :meth:`Rule.gradient_runs`
    (a list per block, None where nothing flows), given the cotangents ``grads`` of the
    reduction's outputs (None for an output without one) and the blocks' forward states
    (torch), their offsets and their numbers of reduced points."""
    r = rule(name)
    leaves, built = [], []
    with torch.enable_grad():
        for state, offset, m in zip(states, offsets, sizes):
            outs = [o.detach().requires_grad_(o.is_floating_point())
                    for o in r.canonical(state, opts, offset, m)]
            leaves.append(outs)
            built.append(r.grad_partial(outs, opts, offset, dim))
        merged = built[0]
        for st in built[1:]:
            merged = r.merge(merged, st, opts)
        outs = r.finalize(merged, opts, dtype)
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        flat = [x for ls in leaves for x in ls if x.requires_grad]
        got = (torch.autograd.grad([o for o, _ in pairs], flat, [g for _, g in pairs],
                                   allow_unused=True) if pairs and flat else [None] * len(flat))
    it = iter(got)
    return [[next(it) if x.requires_grad else None for x in ls] for ls in leaves]


def empty(name: str, lead: tuple, opts: dict, dim: int, dtype, numpy: bool = False) -> tuple:
    """The state of an empty block (the identity of :func:`merge`)."""
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return _like(rule(name).empty(tuple(lead), opts, dim, dt), numpy)


__all__ = ["Rule", "Run", "cotangents", "empty", "finalize", "merge", "merge_all",
           "partial", "rule"]
