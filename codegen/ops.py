"""The op registry: one entry per op holds everything about it.

An :class:`OpDef` has the op's name, arity, dimension rule, C emission, reference
(NumPy/torch through :mod:`lazytensor.codegen.arraymath`), VJP rule and JVP rule. Elementwise
scalar functions are defined by a sympy expression (see :mod:`lazytensor.codegen.elementwise`);
vector ops (sums over the vector dimension, slices, products) are defined in
:mod:`lazytensor.codegen.vector_ops` and emitted as loops.

>>> from lazytensor.codegen import ir
>>> x = ir.var(0, 3, "i")
>>> apply("exp", x).dim
3
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Optional

from . import ir

EmitFn = Callable[[ir.Node, str, list, str], str]


@dataclass(frozen=True)
class OpDef:
    """Everything about one op. ``arity=None`` means variadic."""

    name: str
    arity: Optional[int]
    dim_rule: Callable[[tuple, tuple], int]
    emit: EmitFn  # (node, out_name, arg_names, dtype) -> C statements filling out[0..dim)
    ref: Callable  # (xp, arrays, params) -> array, vector dimension last
    vjp: Optional[Callable] = None  # (node, g) -> list of cotangents (Node | None) per arg
    jvp: Optional[Callable] = None  # (node, tangents) -> tangent Node | None
    sympy_func: object = None  # sympy function class this op corresponds to, if any
    differentiable: bool = True
    doc: str = ""
    extra: dict = field(default_factory=dict)


REGISTRY: dict[str, OpDef] = {}
_SYMPY_FUNCS: dict[str, str] = {}


def register(opdef: OpDef) -> OpDef:
    REGISTRY[opdef.name] = opdef
    if opdef.sympy_func is not None:
        _SYMPY_FUNCS[_sympy_name(opdef.sympy_func)] = opdef.name
    return opdef


def _sympy_name(func) -> str:
    return func if isinstance(func, str) else getattr(func, "__name__", str(func))


def op_for_sympy_function(func) -> Optional[str]:
    """Name of the registered op for a sympy function class (exp -> "exp")."""
    _ensure_loaded()
    return _SYMPY_FUNCS.get(_sympy_name(func))


def get(name: str) -> OpDef:
    _ensure_loaded()
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}") from None


def apply(name: str, *args: ir.Node, params=()) -> ir.Node:
    """Build the node ``name(*args)``, checking arity and dimensions, simplifying trivially.

    Only local, cheap rewrites happen here (constant folding is left to
    :mod:`lazytensor.codegen.simplify`), so that derivative formulas stay small.
    """
    opdef = get(name)
    if opdef.arity is not None and len(args) != opdef.arity:
        raise ValueError(f"op {name!r} takes {opdef.arity} arguments, got {len(args)}")
    params = tuple(params)
    dim = opdef.dim_rule(tuple(a.dim for a in args), params)
    return ir.make(name, args, params, dim)


def broadcast_dim(name: str):
    """Dimension rule of elementwise ops: equal dimensions, or 1 against D."""

    def rule(dims, params):
        big = {d for d in dims if d != 1}
        if len(big) > 1:
            raise ValueError(
                f"{name}: incompatible vector dimensions {list(dims)} "
                "(operands must have equal dimensions, or dimension 1)"
            )
        return big.pop() if big else 1

    return rule


_loaded = False
_load_lock = threading.RLock()


def _ensure_loaded():
    """Import the op modules once; other threads wait until registration has finished."""
    global _loaded
    if _loaded:
        return
    with _load_lock:
        if not _loaded:
            from . import elementwise, tensor_ops, vector_ops  # noqa: F401  (registers the ops)

            _loaded = True


def c_literal(value: float, dtype: str) -> str:
    """A C literal for ``value`` in the kernel's dtype, at full precision."""
    if value != value:
        return "((T)NAN)"
    if value in (float("inf"), float("-inf")):
        return "((T)INFINITY)" if value > 0 else "(-(T)INFINITY)"
    text = repr(float(value))
    if "e" not in text and "." not in text and "inf" not in text:
        text += ".0"
    return f"{text}f" if dtype == "float32" else text


def elem(name: str, dim: int, k: str) -> str:
    """Component ``k`` of an operand, broadcasting dimension 1."""
    return f"{name}[0]" if dim == 1 else f"{name}[{k}]"
