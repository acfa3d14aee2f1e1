"""The op registry: one record per op holds everything about it.

An :class:`OpDef` has the op's name, arity, dimension rule, C emission, reference
(NumPy/torch through :mod:`lazytensor.codegen.arraymath`), VJP and JVP rules, the names it
has in formula strings and as a ``LazyTensor`` method, and, for scalar elementwise
functions, their definition (a sympy expression, an optional C template, optional
partial derivatives). The records are registered when :mod:`lazytensor.codegen` is
imported: :mod:`lazytensor.codegen.elementwise` (scalar functions) and
:mod:`lazytensor.codegen.vector_ops` (structure over the vector dimension, emitted as
loops). This module only holds the record type and the registry; it imports neither.

>>> from lazytensor.codegen import ir
>>> x = ir.var(0, 3, "i")
>>> apply("exp", x).dim
3
>>> get("exp").keops, get("exp").method
(('Exp',), 'exp')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from . import ir

EmitFn = Callable[[ir.Node, str, list, str], str]


@dataclass(frozen=True)
class OpDef:
    """Everything about one op. ``arity=None`` means variadic.

    ``emit(node, out, args, dtype)`` returns C statements filling ``out[0..dim)`` (the
    elementwise records' also take the backend's maths ``functions``: :func:`emit_c`);
    ``ref(xp, arrays, params)`` is the reference on arrays whose last axis is the vector;
    ``vjp(node, g)`` gives one cotangent (Node or None) per argument, ``jvp(node,
    tangents)`` the tangent of the node (or None). ``keops`` lists the names the op has in
    formula strings when it is called there as ``Name(f, g, ...)`` (formulas only, no
    static parameters); ``method`` is the ``LazyTensor`` method that builds it. ``doc``
    says what the op computes (one line) and ``example`` is a doctest of ``method`` (``>>>``
    lines and their output; ``np``, ``Vi``, ``Vj`` and ``Pm`` in scope): a method without
    a docstring of its own takes both as its docstring. ``interop`` names the NumPy, SciPy
    and torch functions that apply the op elementwise (``"numpy.exp"``, ``"torch.exp"``):
    called on LazyTensors, they build it (:mod:`lazytensor.interop.table`).

    Elementwise scalar functions also keep their definition: ``sym(a0, ..., *params)``
    (sympy expression), ``c(dialect, a0, ..., *params)`` (C text, when the printed sympy
    expression is not the best C; ``dialect`` a :class:`CDialect`) and ``partials(a0, ..., *params)`` (partial
    derivatives as IR, when sympy's are not the numerically best form).
    """

    name: str
    arity: Optional[int]
    dim_rule: Callable[[tuple, tuple], int]
    emit: EmitFn
    ref: Callable
    vjp: Optional[Callable] = None
    jvp: Optional[Callable] = None
    sympy_func: Optional[str] = None  # name of the sympy function it translates ("Abs")
    differentiable: bool = True
    doc: str = ""
    keops: tuple = ()
    method: Optional[str] = None
    elementwise: bool = False
    sym: Optional[Callable] = None
    c: Optional[Callable] = None
    partials: Optional[Callable] = None
    example: str = ""
    interop: tuple = ()
    user: bool = False  # defined at run time (``lazytensor.elementwise``), not a built-in op


REGISTRY: dict[str, OpDef] = {}
_SYMPY_FUNCS: dict[str, str] = {}


def register(opdef: OpDef) -> OpDef:
    """Add ``opdef`` to the registry (replacing an op of the same name)."""
    REGISTRY[opdef.name] = opdef
    if opdef.sympy_func is not None:
        _SYMPY_FUNCS[opdef.sympy_func] = opdef.name
    return opdef


def op_for_sympy_function(func) -> Optional[str]:
    """Name of the registered op for a sympy function class (exp -> "exp")."""
    name = func if isinstance(func, str) else getattr(func, "__name__", str(func))
    return _SYMPY_FUNCS.get(name)


def get(name: str) -> OpDef:
    """The record of op ``name``; ValueError for an unknown name."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}") from None


def apply(name: str, *args: ir.Node, params=()) -> ir.Node:
    """Build the node ``name(*args)``, checking arity and dimensions.

    No rewriting happens here (that is :mod:`lazytensor.codegen.simplify`'s job), so that
    derivative formulas stay small.
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


@dataclass(frozen=True)
class CDialect:
    """How the C text of an op is written for one kernel: its ``dtype``, and the backend's
    own maths ``functions`` as (libm's name, the backend's) pairs: a table a renderer
    overrides (the CPU's vectorizable ``lt_exp``, overloaded for float and double, in
    place of ``expf`` / ``exp``).

    >>> CDialect("float32").call("exp", "x"), CDialect("float64").call("exp", "x")
    ('expf(x)', 'exp(x)')
    >>> CDialect("float32", (("exp", "lt_exp"),)).call("exp", "x")
    'lt_exp(x)'
    """

    dtype: str
    functions: tuple = ()

    def function(self, name: str) -> str:
        """The C name of maths function ``name`` (libm's, without the float suffix)."""
        return c_function(name, self.dtype, self.functions)

    def call(self, name: str, *args: str) -> str:
        return f"{self.function(name)}({', '.join(args)})"


def c_function(name: str, dtype: str, functions: tuple = ()) -> str:
    """The C name of maths function ``name`` ("exp") in a ``dtype`` kernel: the backend's
    own from ``functions`` (pairs), else libm's (``expf`` for float32)."""
    for libm, own in functions:
        if libm == name:
            return own
    return name + ("f" if dtype == "float32" else "")


def emit_c(node: ir.Node, out: str, args: list, dtype: str, functions: tuple = ()) -> str:
    """C statements filling ``out`` with the value of ``node`` (its record's ``emit``);
    the elementwise ops, the only ones that call maths functions, call the backend's
    ``functions`` (see :class:`CDialect`)."""
    opdef = get(node.op)
    if opdef.elementwise:
        return opdef.emit(node, out, args, dtype, functions)
    return opdef.emit(node, out, args, dtype)


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
