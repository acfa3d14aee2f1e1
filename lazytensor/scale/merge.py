"""Merging partial results of one reduction computed on separate blocks of the reduced axis.

A reduction over j split into j-blocks (ranks of a process group, Dask chunks) runs one
or two ordinary reductions per block (:attr:`Rule.runs`), turns their outputs into a
*partial state* (:func:`partial`, indices made global by the block's offset), merges
states two by two (:func:`merge`, in any order and grouping) and turns the last state
into the outputs that one reduction over all of j gives (:func:`finalize`):

- Sum: float64 partial sums (Kahan/two-sum compensated under ``sum_scheme="kahan_scheme"``);
- Min/Max and their args: (value, global index), NaN first and ties to the lowest index;
- K-min: the K best (value, global index) pairs of both sides, NaN last, ties by index;
- the log-sum-exp family: ``(m, s, t)`` with ``Σ exp(f) = exp(m) s`` and
  ``Σ exp(f) w = exp(m) t`` (float64), as the kernels' own accumulators.

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

from dataclasses import dataclass

import numpy as np
import torch

from ..codegen import ir, ops


@dataclass(frozen=True)
class Run:
    """One ordinary reduction run on each block: ``reduction`` of the whole formula
    (``part="all"``) or of its scalar component 0 (``part="f"``, weighted reductions)."""

    reduction: str
    part: str = "all"

    def formula(self, formula: ir.Node) -> ir.Node:
        return formula if self.part == "all" else ops.apply("slice", formula, params=(0, 1))


class Rule:
    """How the partial results of one reduction merge (one subclass per family)."""

    names: tuple = ()
    runs: tuple = ()  # the reductions run on each block in the forward pass
    grad_runs: tuple | None = None  # differentiable ones (default: the same)

    def gradient_runs(self) -> tuple:
        """The runs whose outputs gradients flow through (:func:`cotangents`)."""
        return self.runs if self.grad_runs is None else self.grad_runs

    def block_opts(self, opts: dict, m: int) -> dict:
        """The options of the runs on a block of ``m`` reduced points."""
        return dict(opts)

    def partial(self, outs, opts, offset, dim):
        raise NotImplementedError

    def grad_partial(self, outs, opts, offset, dim):
        return self.partial(outs, opts, offset, dim)

    def canonical(self, state, opts, offset, m):
        """The outputs of :attr:`grad_runs` that give ``state`` (detached)."""
        raise NotImplementedError

    def empty(self, lead: tuple, opts: dict, dim: int, dtype) -> tuple:
        raise NotImplementedError

    def merge(self, a, b, opts):
        raise NotImplementedError

    def finalize(self, state, opts, dtype) -> tuple:
        raise NotImplementedError

    def state_shapes(self, opts: dict, dim: int) -> list:
        """(trailing shape, kind) of each state tensor; kind: "value" (the data's dtype),
        "index" (int64) or "wide" (float64)."""
        raise NotImplementedError


class SumRule(Rule):
    names = ("sum",)
    runs = (Run("sum"),)

    def partial(self, outs, opts, offset, dim):
        s = outs[0].to(torch.float64)
        return s, torch.zeros_like(s)

    def canonical(self, state, opts, offset, m):
        return ((state[0] + state[1]).detach(),)

    def empty(self, lead, opts, dim, dtype):
        z = torch.zeros(*lead, dim, dtype=torch.float64)
        return z, z.clone()

    def merge(self, a, b, opts):
        s = a[0] + b[0]
        if opts.get("sum_scheme") != "kahan_scheme":
            return s, a[1] + b[1]
        # Two-sum: the rounding error of a + b, exactly (Knuth); none for infinite sums.
        bv = s - a[0]
        err = (a[0] - (s - bv)) + (b[0] - bv)
        err = torch.where(torch.isfinite(s), err, torch.zeros_like(err))
        return s, a[1] + b[1] + err

    def finalize(self, state, opts, dtype):
        return ((state[0] + state[1]).to(dtype),)

    def state_shapes(self, opts, dim):
        return [((dim,), "wide"), ((dim,), "wide")]


def _better(va, ia, vb, ib, want_min: bool):
    """Where (va, ia) replaces (vb, ib), as the kernels' ``lt_better``: an empty slot
    (index -1) never wins, NaN counts as the best value, ties go to the lowest index."""
    an, bn = torch.isnan(va), torch.isnan(vb)
    cmp = (va < vb) if want_min else (va > vb)
    ordered = torch.where(an | bn, an & (~bn | (ia < ib)), cmp | ((va == vb) & (ia < ib)))
    return (ib < 0) & (ia >= 0) | (ia >= 0) & (ib >= 0) & ordered


class SelectRule(Rule):
    """Min, Max, ArgMin, ArgMax, Min_ArgMin, Max_ArgMax: state (value, global index)."""

    def __init__(self, want_min: bool):
        self.want_min = want_min
        kind = "min" if want_min else "max"
        self.names = (kind, f"arg{kind}", f"{kind}_arg{kind}")
        self.runs = (Run(f"{kind}_arg{kind}"),)

    def partial(self, outs, opts, offset, dim):
        v, i = outs
        return v, torch.where(i >= 0, i + offset, i)

    def canonical(self, state, opts, offset, m):
        v, i = state
        return v.detach(), torch.where(i >= 0, i - offset, i)

    def empty(self, lead, opts, dim, dtype):
        fill = float("inf") if self.want_min else float("-inf")
        return (torch.full((*lead, dim), fill, dtype=dtype),
                torch.full((*lead, dim), -1, dtype=torch.int64))

    def merge(self, a, b, opts):
        take_b = _better(b[0], b[1], a[0], a[1], self.want_min)
        return torch.where(take_b, b[0], a[0]), torch.where(take_b, b[1], a[1])

    def finalize(self, state, opts, dtype):
        return state  # value and index; the caller keeps those its reduction returns

    def state_shapes(self, opts, dim):
        return [((dim,), "value"), ((dim,), "index")]


class KMinRule(Rule):
    """KMin, ArgKMin, KMin_ArgKMin: state (values, global indices) of shape (..., K, F)."""

    names = ("kmin", "argkmin", "kmin_argkmin")
    runs = (Run("kmin_argkmin"),)

    def block_opts(self, opts, m):
        return {**opts, "K": min(int(opts["K"]), m)}

    def partial(self, outs, opts, offset, dim):
        v, i = (o if dim > 1 else o[..., None] for o in outs)  # (..., K_block, F)
        i = torch.where(i >= 0, i + offset, i)
        pad = int(opts["K"]) - v.shape[-2]
        if pad:
            e_v, e_i = self.empty(v.shape[:-2], {"K": pad}, dim, v.dtype)
            v, i = torch.cat([v, e_v], -2), torch.cat([i, e_i], -2)
        return v, i

    def canonical(self, state, opts, offset, m):
        k = min(int(opts["K"]), m)
        v, i = state[0][..., :k, :].detach(), state[1][..., :k, :]
        i = torch.where(i >= 0, i - offset, i)
        return (v, i) if v.shape[-1] > 1 else (v[..., 0], i[..., 0])

    def empty(self, lead, opts, dim, dtype):
        K = int(opts["K"])
        return (torch.full((*lead, K, dim), float("inf"), dtype=dtype),
                torch.full((*lead, K, dim), -1, dtype=torch.int64))

    def merge(self, a, b, opts):
        v, i = torch.cat([a[0], b[0]], -2), torch.cat([a[1], b[1]], -2)
        # the order of the kernels' lt_kbetter: filled slots first, then numbers before
        # NaN, then by value, then by index (stable sorts from the last key to the first)
        order = torch.argsort(i, dim=-2, stable=True)
        for key in (v, torch.isnan(v).to(torch.int8), (i < 0).to(torch.int8)):
            by_key = torch.argsort(torch.gather(key, -2, order), dim=-2, stable=True)
            order = torch.gather(order, -2, by_key)
        order = order[..., : int(opts["K"]), :]
        return torch.gather(v, -2, order), torch.gather(i, -2, order)

    def finalize(self, state, opts, dtype):
        v, i = state
        if v.shape[-1] == 1:
            v, i = v[..., 0], i[..., 0]
        return v, i

    def state_shapes(self, opts, dim):
        K = int(opts["K"])
        return [((K, dim), "value"), ((K, dim), "index")]


def _scale(m_part, m):
    """``exp(m_part - m)`` for ``m = max(m_part, ...)``, 1 where they are equal (so that
    infinite maxima count their terms, as the kernels' ``lt_lse_add``), 0 for -inf."""
    same = m_part == m
    return torch.where(same, torch.ones_like(m), torch.exp(torch.where(same, torch.zeros_like(m),
                                                                        m_part - m)))


class LogSumExpRule(Rule):
    """The log-sum-exp family: state ``(m, s, t)``, ``Σ exp(f) = exp(m) s`` and
    ``Σ exp(f) w = exp(m) t`` (float64; ``t`` has width 0 without a weight)."""

    names = ("logsumexp", "logsumexp_weight", "sumsoftmaxweight", "max_sumshiftexp")

    def __init__(self, name: str):
        self.name = name
        self.weighted = name in ("logsumexp_weight", "sumsoftmaxweight")
        if self.weighted:
            # exp(m) s (with the count of +inf terms when m = +inf) and the softmax average
            self.runs = (Run("sumsoftmaxweight"), Run("max_sumshiftexp", "f"))
            self.grad_runs = (Run("sumsoftmaxweight"), Run("logsumexp", "f"))
        else:
            self.runs = (Run(name),)
            self.grad_runs = None if name == "logsumexp" else ()  # max_sumshiftexp: none

    def _width(self, dim):
        return dim - 1 if self.weighted else 0

    def partial(self, outs, opts, offset, dim):
        if self.name == "logsumexp":
            return self._from_lse(outs[0], outs[0][..., :0])
        if self.name == "max_sumshiftexp":
            ms = outs[0].to(torch.float64)
            return ms[..., :1], ms[..., 1:], ms[..., :0]
        r, ms = outs[0].to(torch.float64), outs[1].to(torch.float64)
        m, s = ms[..., :1], ms[..., 1:]
        return m, s, torch.where(s == 0, torch.zeros_like(r), r * s)

    def grad_partial(self, outs, opts, offset, dim):
        if not self.weighted:
            return self.partial(outs, opts, offset, dim)
        return self._from_lse(outs[1], outs[0])

    def _from_lse(self, lse, ratio):
        m = lse.to(torch.float64)
        r = ratio.to(torch.float64)
        return m, torch.ones_like(m), torch.where(torch.isneginf(m), torch.zeros_like(r), r)

    def canonical(self, state, opts, offset, m_block):
        m, s, t = (x.detach() for x in state)
        lse = m + torch.log(s)
        return (lse,) if not self.weighted else (t / s, lse)

    def empty(self, lead, opts, dim, dtype):
        z = torch.zeros(*lead, 1, dtype=torch.float64)
        return torch.full_like(z, float("-inf")), z, torch.zeros(*lead, self._width(dim),
                                                                 dtype=torch.float64)

    def merge(self, a, b, opts):
        m = torch.maximum(a[0], b[0])  # NaN propagates
        fa, fb = _scale(a[0], m), _scale(b[0], m)
        return m, a[1] * fa + b[1] * fb, a[2] * fa + b[2] * fb

    def finalize(self, state, opts, dtype):
        m, s, t = state
        if self.name == "logsumexp":
            return ((m + torch.log(s)).to(dtype),)
        if self.name == "logsumexp_weight":
            return ((m + torch.log(t)).to(dtype),)
        if self.name == "sumsoftmaxweight":
            return (t / s).to(dtype), (m + torch.log(s)).to(dtype)
        return (torch.cat([m, s], -1).to(dtype),)

    def state_shapes(self, opts, dim):
        return [((1,), "wide"), ((1,), "wide"), ((self._width(dim),), "wide")]


RULES: dict = {}
for _rule in (SumRule(), SelectRule(True), SelectRule(False), KMinRule(),
              *(LogSumExpRule(n) for n in LogSumExpRule.names)):
    for _name in _rule.names if not isinstance(_rule, LogSumExpRule) else (_rule.name,):
        RULES[_name] = _rule

# which of a rule's final outputs each reduction returns (as engine.reduce: one or two)
_PICK = {"min": (0,), "max": (0,), "argmin": (1,), "argmax": (1,), "argkmin": (1,),
         "kmin": (0,), "sumsoftmaxweight": (0,)}


def _name(name: str) -> str:
    from ..codegen import reductions

    return reductions.get(name).name


def rule(name: str) -> Rule:
    """The merge rule of a reduction (registry name or alias)."""
    try:
        return RULES[_name(name)]
    except KeyError:
        raise ValueError(f"the {_name(name)} reduction has no merge rule") from None


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
    return _like(_pick(name, rule(name).finalize(tuple(st), opts, dt)), numpy_in)


def _pick(name: str, outs: tuple) -> tuple:
    pick = _PICK.get(_name(name))
    return outs if pick is None else tuple(outs[k] for k in pick)


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
        outs = _pick(name, r.finalize(merged, opts, dtype))
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


__all__ = ["RULES", "Rule", "Run", "cotangents", "empty", "finalize", "merge", "merge_all",
           "partial", "rule"]
