"""NumPy's and torch's own functions on LazyTensors: ``np.exp(K)``, ``torch.logsumexp(K, dim=1)``.

:class:`~lazytensor.LazyTensor`'s three protocols land here: ``__array_ufunc__`` (NumPy
and SciPy ufuncs: ``np.exp(K)``, ``np.maximum(K, 0.5)``, ``array * K``),
``__array_function__`` (``np.sum(K, axis=1)``, ``np.where``, ``np.linalg.norm``) and
``__torch_function__`` (``torch.exp``, ``torch.softmax(K, dim=1) @ V``, ``torch.topk``, and
a real tensor's methods called with a LazyTensor: ``t + K`` is ``Tensor.add(t, K)``).
Each function found in :data:`lazytensor.interop.table.TABLE` runs its rule: elementwise
functions stay lazy, reductions run a kernel. Any other function, and ``out=``,
``where=``, ``dtype=``, ``initial=``, raise a TypeError naming the function. Nothing
converts a LazyTensor to a dense array implicitly (see :mod:`lazytensor.api.materialize`).

>>> import numpy as np
>>> from lazytensor import Vi, Vj
>>> x, y = np.random.rand(5, 2), np.random.rand(4, 2)
>>> d = Vi(x).sqdist(Vj(y))
>>> K = np.where(d < 1, np.exp(-d), 0)       # lazy: an ifelse in the formula
>>> np.sum(K, axis=1).shape                 # one reduction over j
(5,)
>>> np.cumsum(K)
Traceback (most recent call last):
    ...
TypeError: numpy.cumsum does not support LazyTensor arguments...
"""

from __future__ import annotations

import importlib
import inspect
import operator
from typing import Callable, NamedTuple

import numpy as np


class Entry(NamedTuple):
    name: str  # qualified name: "numpy.sum", "torch.Tensor.add"
    rule_name: str
    rule: Callable
    signature: inspect.Signature


def resolve(qualname: str):
    """The object named ``qualname`` (longest importable module, then attributes), or None."""
    parts = qualname.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


_tables: dict = {}


def _table(library: str) -> dict:
    """``{function object: Entry}`` for the functions of ``library`` that the table maps
    (built once; a plain dict that torch dynamo reads as it is)."""
    table = _tables.get(library)
    if table is None:
        table = _tables[library] = _build_table(library)
    return table


def _build_table(library: str) -> dict:
    from .table import TABLE

    out = {}
    for rule_name, (rule, names) in TABLE.items():
        signature = inspect.signature(rule)
        for name in names:
            if name.split(".")[0] != library:
                continue
            func = resolve(name)
            if func is not None and func not in out:
                out[func] = Entry(name, rule_name, rule, signature)
    return out


def mapped_functions() -> dict:
    """``{qualified name: rule name}`` of every function that takes LazyTensors here.

    >>> mapped_functions()["torch.nn.functional.relu"]
    'relu'
    """
    return {e.name: e.rule_name for lib in ("numpy", "scipy", "torch")
            for e in _table(lib).values()}


def _unsupported(name: str) -> TypeError:
    return TypeError(
        f"{name} does not support LazyTensor arguments: a LazyTensor is a symbolic (*batch, N, "
        "M[, D]) array that is never built. The functions that do are listed in the README "
        "(NumPy and torch functions) and by lazytensor.interop.protocols.mapped_functions(); reduce K "
        "first (np.sum(K, axis=1), K @ v, K.argKmin(k, dim=1)) or materialise a small one "
        "with K.dense(max_bytes=...)")


def _is_default(key: str, value) -> bool:
    if value is None or value is np._NoValue:
        return True
    if key == "out":
        return isinstance(value, tuple) and all(v is None for v in value)
    return key == "where" and value is True


# Keywords a lazy result cannot honour: refused unless left at their default value.
_REFUSED = ("out", "where", "dtype", "initial")


def _call(entry: Entry, args, kwargs: dict):
    refused = [k for k in _REFUSED if k in kwargs and not _is_default(k, kwargs[k])]
    if refused:
        raise TypeError(f"{entry.name}(..., {refused[0]}=...) is not supported with LazyTensor "
                        f"arguments: the result is a new LazyTensor or array")
    if kwargs:
        kwargs = {k: v for k, v in kwargs.items() if k not in _REFUSED}
    from .rules import Unsupported

    try:
        return entry.rule(*args, **kwargs)
    except Unsupported as e:
        raise TypeError(f"{entry.name}() with LazyTensor arguments: {e}") from None
    except ValueError as e:  # a bad axis, shape, option: say which call it came from
        if type(e) is not ValueError:
            raise
        raise ValueError(f"{entry.name}(): {e}") from None
    except TypeError as e:  # arguments the rule does not take (checked only on failure)
        try:
            entry.signature.bind(*args, **kwargs)
        except TypeError:
            raise TypeError(f"{entry.name}() with LazyTensor arguments: {e}") from None
        raise


# the functions that torch dynamo passes for an ``@`` with a tensor operand
_TENSOR_MATMULS = ("torch.Tensor.__matmul__", "torch._C.TensorBase.__matmul__",
                   "torch._C.TensorBase.matmul")


def _tensor_matmuls() -> tuple:
    funcs = _tables.get("matmuls")
    if funcs is None:
        funcs = _tables["matmuls"] = tuple(resolve(name) for name in _TENSOR_MATMULS)
    return funcs


def _compiling() -> bool:
    from ..engine.plans import torch_compiling

    return torch_compiling()


def _traced_matmul(t, K):
    """``Tensor.__matmul__(t, K)`` under torch dynamo, which sends both ``t @ K`` and
    ``K @ t`` here (torch 2.13 has no reverse matmul and swaps the operands of ``K @ t``):
    the one product that the shapes allow, and an error where both fit."""
    # (K.shape binds every variable: the rows of K's first i- and j-variables suffice)
    N = next((v.rows for v in K.variables if v.cat == "i" and not v.is_scalar), None)
    M = next((v.rows for v in K.variables if v.cat == "j" and not v.is_scalar), None)
    rows = t.shape[0] if t.dim() == 1 else t.shape[-2]
    k_at_t, t_at_k = rows == M, t.shape[-1] == N
    if k_at_t and t_at_k:
        raise TypeError(f"under torch.compile, K @ t and t @ K reach a LazyTensor alike (torch "
                        f"dynamo passes both as Tensor.__matmul__(t, K)), and the shapes of K "
                        f"({N}, {M}) and t {tuple(t.shape)} fit both: write K.__matmul__(t) for "
                        "K @ t, or K.T.__matmul__(t.mT).mT for t @ K")
    if k_at_t:
        return K.__matmul__(t)
    from .rules import matmul

    return matmul(t, K)


def _lazy_class():
    from ..api.lazy import LazyTensor

    return LazyTensor


def array_ufunc(ufunc, method: str, inputs: tuple, kwargs: dict):
    """``LazyTensor.__array_ufunc__``: NumPy (and SciPy) ufuncs."""
    LazyTensor = _lazy_class()
    for x in inputs:
        hook = getattr(type(x), "__array_ufunc__", None)
        if hook is not None and not isinstance(x, (np.ndarray, np.generic, LazyTensor)):
            return NotImplemented  # another library's array: let it decide
    entry = _table("numpy").get(ufunc) or _table("scipy").get(ufunc)
    name = entry.name if entry else f"numpy.{ufunc.__name__}"
    if method != "__call__":
        raise TypeError(f"{name}.{method} does not support LazyTensor arguments: only calls are "
                        "mapped (np.sum(K, axis=1) for add.reduce, np.max for maximum.reduce)")
    if entry is None:
        raise _unsupported(name)
    extra = [k for k, v in kwargs.items() if not _is_default(k, v)]
    if extra:
        out = kwargs.get("out") or (None,)
        hint = (" (an in-place operator, array += K: write array = array + K)"
                if inputs and out[0] is inputs[0] else "")
        raise TypeError(f"{name}(..., {extra[0]}=...) is not supported with LazyTensor "
                        f"arguments: the result is a new LazyTensor{hint}")
    return _call(entry, inputs, {})


def array_function(func, types, args, kwargs):
    """``LazyTensor.__array_function__``: NumPy functions (``np.sum``, ``np.where`` ...)."""
    LazyTensor = _lazy_class()
    if not all(issubclass(t, (LazyTensor, np.ndarray)) for t in types):
        return NotImplemented
    entry = _table("numpy").get(func)
    if entry is None:
        module = getattr(func, "__module__", None) or "numpy"
        raise _unsupported(f"{module}.{getattr(func, '__name__', func)}")
    return _call(entry, args, kwargs)


def torch_function(func, types, args=(), kwargs=None):
    """``LazyTensor.__torch_function__``: torch functions, and a real tensor's methods called
    with a LazyTensor argument (``t + K``, ``t * K``, ``t @ K``)."""
    import torch

    if func in _tensor_matmuls() and _compiling() and len(args) == 2 and \
            isinstance(args[1], _lazy_class()) and isinstance(args[0], torch.Tensor):
        return _traced_matmul(*args)
    if func is operator.matmul and isinstance(args[0], _lazy_class()):
        return args[0].__matmul__(args[1])  # torch.export (strict) passes the operator itself
    entry = _table("torch").get(func)
    if entry is None:

        LazyTensor = _lazy_class()
        if not all(issubclass(t, (LazyTensor, torch.Tensor)) for t in types):
            return NotImplemented
        # (an in-place method, t += K, falls back to t = t + K after this TypeError)
        raise _unsupported(torch.overrides.resolve_name(func) or repr(func))
    return _call(entry, args, kwargs or {})


__all__ = ["array_function", "array_ufunc", "mapped_functions", "resolve", "torch_function"]
