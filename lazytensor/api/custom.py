"""User-defined elementwise functions from a sympy expression.

``elementwise(name, fn)`` registers an op whose C text comes from sympy's printer, whose
derivative is sympy's (translated back to IR, so torch gradients of any order work) and
whose NumPy/torch reference follows from the expression. The op is then usable on
LazyTensors, on arrays, and by name in ``Genred`` formula strings.

>>> import numpy as np, sympy
>>> from lazytensor import Vi, Vj
>>> softplus2 = elementwise("softplus2_doc", lambda u: sympy.log(1 + sympy.exp(2 * u)))
>>> x, y = np.random.rand(5, 1), np.random.rand(4, 1)
>>> softplus2(Vi(x) - Vj(y)).sum(1).shape
(5, 1)
"""

from __future__ import annotations

import hashlib
import inspect
import keyword
from typing import Callable

from .. import forks
from ..codegen import elementwise as ew
from ..codegen import ops, parse, sympy_bridge
from ..core.binding import is_torch

_lock = forks.lock()
_DEFINED: dict = {}  # name -> UserFunction


class UserFunction:
    """A registered elementwise op: call it on LazyTensors or arrays."""

    def __init__(self, name: str, arity: int, params: tuple, expr):
        self.name, self.arity, self.params, self.expr = name, arity, params, expr
        self.__name__ = name
        self.__doc__ = f"{name}({', '.join(f'a{k}' for k in range(arity))}) = {expr}"

    def __repr__(self) -> str:
        return f"<elementwise {self.__doc__}>"

    def __call__(self, *args):
        from .lazy import LazyTensor

        if len(args) != self.arity:
            raise TypeError(f"{self.name} takes {self.arity} argument(s), got {len(args)}")
        if any(isinstance(a, LazyTensor) for a in args):
            lazy = [a if isinstance(a, LazyTensor) else LazyTensor(a) for a in args]
            return lazy[0]._op(self.name, *lazy[1:], params=self.params)
        return self._evaluate(args)

    def _evaluate(self, args):
        """Elementwise values on NumPy arrays or torch tensors (the op's reference)."""
        import numpy as np

        from ..codegen import arraymath

        if any(is_torch(a) for a in args):
            import torch

            like = next(a for a in args if is_torch(a))
            arrays = [a if is_torch(a) else torch.as_tensor(a, dtype=like.dtype) for a in args]
            xp = arraymath.torch_namespace()
        else:
            arrays = [np.asarray(a, dtype=np.float64) if not isinstance(a, np.ndarray) else a
                      for a in args]
            xp = arraymath.numpy_namespace()
        out = ops.get(self.name).ref(xp, arrays, self.params)
        # constants in the expression are 1D: give the result the arguments' broadcast shape
        shape = np.broadcast_shapes(*[tuple(a.shape) for a in arrays])
        return out.reshape(shape) if tuple(out.shape) != shape else out


def _arity(fn: Callable) -> int:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 1
    positional = [p for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    return max(1, len(positional))


def _check_name(name: str):
    if not isinstance(name, str) or not name.isascii() or not name.isidentifier():
        raise ValueError(f"elementwise: the name must be an identifier (letters, digits, _), got {name!r}")
    if keyword.iskeyword(name) or name.startswith("_"):
        raise ValueError(f"elementwise: {name!r} cannot be used as an op name")
    if name in parse.FUNCTIONS or name in ("Var", "Vi", "Vj", "Pm"):
        raise ValueError(f"elementwise: {name!r} is a built-in formula function")


def _is_registered(name: str) -> bool:
    try:
        ops.get(name)
        return True
    except ValueError:
        return False


def _builtin_same(name: str, expr, syms):
    """True if ``name`` is a built-in elementwise op with this very expression."""
    opdef = ew.ELEMENTWISE.get(name)
    if opdef is None or opdef.sym is None or opdef.arity != len(syms):
        return False
    try:
        return bool(opdef.sym(*syms) == expr)
    except TypeError:
        return False


def _derivative_problem(expr, syms):
    """None if sympy's partial derivatives translate to IR, else the reason they don't."""
    import sympy

    from ..codegen import ir

    placeholders = [ir.var(k, 1, "i") for k in range(len(syms))]
    try:
        for s in syms:
            d = sympy.diff(expr, s).replace(sympy.DiracDelta, lambda *a: sympy.Integer(0))
            if d != 0:
                sympy_bridge.to_ir(d, placeholders)
    except (NotImplementedError, TypeError, ValueError) as e:
        return str(e) or type(e).__name__
    return None


def _no_derivative(name: str, reason: str):
    def derivs(*args):
        raise NotImplementedError(f"elementwise op {name!r} has no derivative in the IR: {reason}")

    return derivs


def elementwise(name: str, fn: Callable, arity: int | None = None) -> UserFunction:
    """Register ``name`` as the elementwise function ``fn`` (sympy symbols in, expression out).

    Returns a function applicable to LazyTensors (``f(x_i - y_j)``), NumPy arrays and torch
    tensors; ``name(...)`` also works in ``Genred`` formula strings. Defining the same name
    again with the same expression returns the existing op; a different one is an error.

    >>> import sympy
    >>> f = elementwise("cubic_doc", lambda u: u**3 - u)
    >>> float(f(2.0))
    6.0
    """
    import sympy

    _check_name(name)
    arity = _arity(fn) if arity is None else int(arity)
    syms = sympy_bridge.symbols(arity)
    try:
        expr = sympy.sympify(fn(*syms))
    except (sympy.SympifyError, TypeError) as e:
        raise ValueError(f"elementwise {name!r}: fn must return a sympy expression ({e})") from None
    if not isinstance(expr, sympy.Expr) or expr.has(sympy.I):
        raise ValueError(f"elementwise {name!r}: fn must return a real sympy expression, got {expr!r}")
    stray = expr.free_symbols - set(syms)
    if stray:
        raise ValueError(f"elementwise {name!r}: the expression uses symbols {sorted(map(str, stray))} "
                         f"that are not its arguments")
    try:  # names, literal ranges, nodes with a C translation: refused now, not by the compiler
        expr = sympy_bridge.check_expression(expr, syms)
    except ValueError as e:
        raise ValueError(f"elementwise {name!r}: {e}") from None
    with _lock:
        known = _DEFINED.get(name)
        if known is not None:
            if known.arity == arity and known.expr == expr:
                return known
            raise ValueError(f"elementwise: {name!r} is already defined as {known.__doc__}")
        if _is_registered(name):
            if not _builtin_same(name, expr, syms):
                raise ValueError(f"elementwise: {name!r} is a built-in op with another definition")
            parse.register_function(name, arity, lambda *a: ops.apply(name, *a))
            return UserFunction(name, arity, (), expr)
        try:
            for dtype in ("float32", "float64"):
                sympy_bridge.c_expression(expr, dtype, [f"x{k}" for k in range(arity)])
        except (NotImplementedError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"elementwise {name!r}: no C translation for {expr} ({e})") from None
        reason = _derivative_problem(expr, syms)
        # The definition's hash is a parameter of every node, so the structural key (and the
        # kernel cache) tells apart two processes that give one name different expressions.
        params = (hashlib.sha256(sympy.srepr(expr).encode()).hexdigest()[:16],)
        ew.define(name, arity, sym=_substitute(expr, syms),
                  derivs=None if reason is None else _no_derivative(name, reason),
                  doc=f"user-defined: {expr}", user=True)
        function = UserFunction(name, arity, params, expr)
        _DEFINED[name] = function
        parse.register_function(name, arity, lambda *a: ops.apply(name, *a, params=params))
        return function


def _substitute(expr, syms):
    def sym(*args):
        values = args[: len(syms)]  # trailing params (the definition hash) are not symbols
        return expr.xreplace(dict(zip(syms, values)))

    return sym
