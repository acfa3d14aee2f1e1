"""Symbolic variables, reductions that wait for their arrays, and pykeops's printing.

As in pykeops, ``Vi(0, 3)``, ``Vj(1, 3)``, ``Pm(2, 1)`` (or ``LazyTensor((index, dim,
cat))``, cat 0, 1 or 2) stand for argument ``index`` of a later call, a vector of
dimension ``dim``; they combine with each other and with bound arrays as any LazyTensor.
A reduction of a formula that holds one (or any reduction with ``call=False``) returns a
:class:`DeferredReduction`: called with the arrays of the symbolic variables in index
order, it runs the reduction on them and the bound arrays, differentiably for torch
tensors. Its ``callfun`` is the same reduction as a :class:`~lazytensor.api.genred.Genred`
of every array in pykeops's index order (the symbolic variables, then the bound arrays in
order of appearance).

>>> import numpy as np
>>> from lazytensor import Vi, Vj
>>> f = (-Vi(0, 1).sqdist(Vj(1, 1))).exp().sum_reduction(axis=1)
>>> x = np.array([[0.0], [1.0]])
>>> f(x, x).round(4).tolist()
[[1.3679], [1.3679]]
>>> print(f)
KeOps LazyTensor
    formula: Exp(Minus(Sum(Square((Var(0,1,0) - Var(1,1,1))))))
    symbolic variables: Var(0, 1, 0), Var(1, 1, 1)
    shape: (1, 1)
    reduction: Sum (axis=1)
"""

from __future__ import annotations

import numbers
from typing import Any

from ..codegen import ir, parse, reductions
from ..codegen.keops_text import CAT_CODES, to_keops
from ..core import half
from ..core.binding import Slot, Variable, copy_into
from ..core.options import gpu_options, integer_option
from .genred import Genred, bind_one

_CATS = {0: "i", 1: "j", 2: "p"}
_HELPERS = {"i": "Vi", "j": "Vj", "p": "Pm"}
_leaves: dict[tuple, Variable] = {}  # (index, dim, cat) -> its one Variable


def leaf(index, dim, cat, call: str) -> Variable:
    """The variable of ``Vi(index, dim)`` (cat "i"), ``Vj`` ("j"), ``Pm`` ("p") or
    ``LazyTensor((index, dim, cat))`` (cat 0, 1 or 2); the same object for the same
    triple, so that a formula that uses it twice holds it once."""
    index = integer_option(index, "index", call, low=0)
    dim = integer_option(dim, "dim", call, low=1)
    if not isinstance(cat, str):
        if isinstance(cat, bool) or not isinstance(cat, numbers.Integral) or int(cat) not in _CATS:
            raise ValueError(f"{call}: the category must be 0 (i), 1 (j) or 2 (parameter), "
                             f"got {cat!r}")
        cat = _CATS[int(cat)]
    key = (index, dim, cat)
    if key not in _leaves:
        _leaves[key] = Variable(Slot(index), cat, dim, f"{_HELPERS[cat]}({index}, {dim})")
    return _leaves[key]


def has_slots(variables) -> bool:
    """Whether some variable is symbolic (its array comes with the call)."""
    return any(v.is_scalar and isinstance(v.data, Slot) for v in variables)


def slots(variables) -> dict[int, Variable]:
    """index -> the symbolic variable of that index; one category and dimension per
    index, and indices 0 .. n-1 (they are the call's arguments)."""
    out: dict[int, Variable] = {}
    for v in variables:
        if not isinstance(v.data, Slot):
            continue
        seen = out.setdefault(v.data.index, v)
        if (seen.cat, seen.dim) != (v.cat, v.dim):
            raise ValueError(f"symbolic variables {seen.label} and {_HELPERS[v.cat]}"
                             f"({v.data.index}, {v.dim}) share index {v.data.index}: an index "
                             "is one argument of the call, of one category and dimension")
    missing = sorted(set(range(len(out))) - set(out))
    if missing:
        raise ValueError(f"symbolic variables have indices {sorted(out)}: the call takes one "
                         f"array per index 0 .. n-1, index {missing[0]} is missing")
    return out


def bind_slots(variables, args) -> list:
    """``variables`` with each symbolic one bound to ``args[its index]`` (checked as a
    Genred argument: shape, dimension), the others as they are."""
    table = slots(variables)
    bound = {k: bind_one(parse.VarDecl(None, k, v.cat, v.dim), args[k], k)
             for k, v in table.items()}
    return [bound[v.data.index] if isinstance(v.data, Slot) else v for v in variables]


def keops_indices(variables) -> list[int]:
    """pykeops's index of each variable: a symbolic one keeps its own, the bound arrays
    follow them in order of appearance."""
    slots = [v.data.index for v in variables if isinstance(v.data, Slot)]
    nxt = 1 + max(slots, default=-1)
    out = []
    for v in variables:
        if isinstance(v.data, Slot):
            out.append(v.data.index)
        else:
            out.append(nxt)
            nxt += 1
    return out


def _split_weight(formula, reduction):
    """``(formula, formula2)`` of a weighted reduction (the LazyTensor methods concatenate
    the weight after the scalar formula), ``(formula, None)`` otherwise."""
    if reductions.get(reduction).weighted and formula.op == "concat":
        return formula.args[0], formula.args[1]
    return formula, None


def describe(lt, deferred: DeferredReduction | None = None) -> str:
    """pykeops's ``print(K)``: "KeOps LazyTensor", the formula, the symbolic variables,
    the shape, and for a deferred reduction its name, axis, weights and K."""
    index = keops_indices(lt.variables)
    formula, formula2 = lt.formula, None
    if deferred is not None:
        formula, formula2 = _split_weight(formula, deferred.reduction)
    lines = ["KeOps LazyTensor", f"    formula: {to_keops(formula, index.__getitem__)}"]
    slots = [v for v in lt.variables if isinstance(v.data, Slot)]
    if slots:
        lines.append("    symbolic variables: " + ", ".join(
            f"Var({v.data.index}, {v.dim}, {CAT_CODES[v.cat]})" for v in slots))
    shape = lt.shape
    if formula2 is not None:  # the shape of the formula, without its weight
        shape = (shape[:-1] if lt.formula.dim > 1 else shape) + (
            (formula.dim,) if formula.dim > 1 else ())
    lines.append(f"    shape: {shape}")
    if deferred is not None:
        lines.append(f"    reduction: {deferred.reduction_op} (axis={deferred.axis})")
        if formula2 is not None:
            lines.append(f"        formula2: {to_keops(formula2, index.__getitem__)}")
        if "K" in deferred.opts:
            lines.append(f"        opt_arg: {deferred.opts['K']}")
    return "\n".join(lines)


class DeferredReduction:
    """A reduction not run yet (pykeops's "reduced LazyTensor"): ``f(*arrays)`` runs it.

    With symbolic variables, the call takes their arrays in index order (``f(x, y, b)``
    for ``Vi(0, 3)``, ``Vj(1, 3)``, ``Vj(2, 1)``); without, ``f()`` runs it on the bound
    arrays and ``f(*arrays)`` on new ones, one per variable. The call takes ``backend``,
    ``device_id``, ``ranges`` and ``out``, as a Genred's; torch tensors get gradients.

    >>> import numpy as np
    >>> from lazytensor import Vi, Vj
    >>> x = np.array([[0.0], [1.0], [3.0]])
    >>> f = Vi(x).sqdist(Vj(0, 1)).sum(dim=1)
    >>> f(np.array([[0.0], [2.0]])).tolist()
    [[4.0], [2.0], [10.0]]
    >>> f.callfun(np.array([[0.0], [2.0]]), x).tolist()
    [[4.0], [2.0], [10.0]]
    """

    def __init__(self, lt, reduction: str, axis: int, opts: dict, backend, grad_mode,
                 run_reduction):
        self.lazytensor, self.reduction, self.axis = lt, reduction, axis
        self.opts, self.backend, self.grad_mode = dict(opts), backend, grad_mode
        self._run = run_reduction
        self._slots = slots(lt.variables)
        self.reduction_op = reductions.get(reduction).keops_name or reduction
        self._callfun = None

    @property
    def symbolic_variables(self) -> tuple:
        """``(index, dim, cat)`` of each symbolic variable, as pykeops."""
        return tuple((k, v.dim, CAT_CODES[v.cat]) for k, v in sorted(self._slots.items()))

    @property
    def callfun(self) -> Genred:
        """The reduction as a Genred of all its arrays, in pykeops's index order."""
        if self._callfun is None:
            lt = self.lazytensor
            index = keops_indices(lt.variables)
            mapping = {ir.var(k, v.dim, v.cat): ir.var(index[k], v.dim, v.cat)
                       for k, v in enumerate(lt.variables) if index[k] != k}
            formula = ir.substitute(lt.formula, mapping) if mapping else lt.formula
            decls = {index[k]: parse.VarDecl(None, index[k], v.cat, v.dim)
                     for k, v in enumerate(lt.variables)}
            self._callfun = Genred.from_ir(formula, [decls[k] for k in sorted(decls)],
                                           self.reduction, self.axis, self.opts)
        return self._callfun

    def _bind(self, args) -> list:
        variables = self.lazytensor.variables
        if not self._slots:
            if not args:
                return list(variables)
            if len(args) != len(variables):
                raise TypeError(f"this reduction takes one array per variable ({len(variables)}: "
                                f"{'; '.join(v.describe(k) for k, v in enumerate(variables))}), "
                                f"got {len(args)}")
            return [bind_one(parse.VarDecl(v.label or None, k, v.cat, v.dim), a, k)
                    for k, (a, v) in enumerate(zip(args, variables))]
        if len(args) != len(self._slots):
            wanted = ", ".join(v.label for _, v in sorted(self._slots.items()))
            raise TypeError(f"this reduction takes the arrays of its symbolic variables, in "
                            f"index order ({wanted}): expected {len(self._slots)}, got {len(args)}")
        return bind_slots(variables, args)

    def __call__(self, *args: Any, backend: str | None = None, device_id: int | None = None,
                 ranges: Any = None, out: Any = None):
        variables = self._bind(args)
        if backend is not None or device_id is not None:
            backend = gpu_options(self.backend if backend is None else backend, device_id)[0]
        run = self._run
        if ranges is not None:  # block-sparse ranges given with the call (lazytensor.scale.ranges)
            from ..scale import ranges as ranges_mod

            def run(*arguments):
                return ranges_mod.reduce(*arguments, ranges)
        result = run(self.lazytensor.formula, variables, self.reduction, self.axis, self.opts,
                     self.backend if backend is None else backend, self.grad_mode)
        io_dtype = half.output_dtype(variables)
        if io_dtype:
            result = half.cast_outputs(result, io_dtype)
        return result if out is None else copy_into(out, result)

    def __str__(self) -> str:
        return describe(self.lazytensor, self)

    __repr__ = __str__
