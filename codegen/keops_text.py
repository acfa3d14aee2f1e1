"""A formula in pykeops's notation, as ``print(K)`` shows it: ``Var(0,3,0)``, ``(a - b)``, ``Exp(...)``.

pykeops prints a LazyTensor's formula as the string it builds: variables as
``Var(index,dim,cat)`` (cat 0 for i, 1 for j, 2 for a parameter), ``+ - * /`` as
parenthesized infix operators, negation as ``Minus``, ``a * a`` as ``Square(a)``, every other op as the name it has in
formula strings (the op records' ``keops`` names). Ops that take static arguments print
them after the formulas (``Extract(f, 1, 2)``, ``Pow(f, 3)``). The text is our IR's, in
pykeops's words: a composition that pykeops keeps as one op (``SqDist``) prints as what
it is built of (``Sum(Square(...))``). For display only: formulas never go through text.

>>> from lazytensor.codegen import ir, ops
>>> x, y = ir.var(0, 3, "i"), ir.var(1, 3, "j")
>>> to_keops(ops.apply("exp", ops.apply("neg", ops.apply("sum", ops.apply("sub", x, y)))))
'Exp(Minus(Sum((Var(0,3,0) - Var(1,3,1)))))'
"""

from __future__ import annotations

from collections.abc import Callable

from . import ir, ops

CAT_CODES = {"i": 0, "j": 1, "p": 2}
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


def _number(v: float) -> str:
    return f"IntCst({int(v)})" if float(v).is_integer() else repr(float(v))


def _const(node: ir.Node) -> str:
    values = node.params
    if node.dim == 1:
        return _number(values[0])
    if not any(values):
        return f"Zero({node.dim})"
    return "Concat(" * (len(values) - 1) + _number(values[0]) + "".join(
        f", {_number(v)})" for v in values[1:])


def _slice(node, args):
    start, length = node.params
    return f"Elem({args[0]}, {start})" if length == 1 else f"Extract({args[0]}, {start}, {length})"


# ops whose static parameters pykeops writes after the formulas, under another name
_WITH_PARAMS: dict[str, Callable] = {
    "slice": _slice,
    "expand": lambda node, args: f"SumT({args[0]}, {node.params[0]})",
    "one_hot": lambda node, args: f"OneHot({args[0]}, {node.params[0]})",
    "pow": lambda node, args: f"Pow({args[0]}, {_power(node.params[0])})",
}


def _power(p) -> str:
    return str(int(p)) if float(p).is_integer() else repr(float(p))


def _name(op: str) -> str:
    keops = ops.get(op).keops if op in ops.REGISTRY else ()
    return keops[0] if keops else op


def to_keops(root: ir.Node, index: Callable[[int], int] | None = None, limit: int = 4000) -> str:
    """``root`` in pykeops's notation; ``index(k)`` renumbers variable ``k`` (pykeops puts
    symbolic variables first); texts longer than ``limit`` end in "...".

    >>> to_keops(ops.apply("slice", ir.var(2, 4, "p"), params=(1, 2)), index=lambda k: k + 1)
    'Extract(Var(3,4,2), 1, 2)'
    """
    text: dict[int, str] = {}
    for node in ir.topo_order(root):
        args = [text[id(a)] for a in node.args]
        if node.op == "var":
            k = node.index if index is None else index(node.index)
            out = f"Var({k},{node.dim},{CAT_CODES[node.cat]})"
        elif node.op == "const":
            out = _const(node)
        elif node.op == "mul" and len(args) == 2 and node.args[0] is node.args[1]:
            out = f"Square({args[0]})"  # a * a, as pykeops writes x ** 2
        elif node.op in _INFIX and len(args) == 2:
            out = f"({args[0]} {_INFIX[node.op]} {args[1]})"
        elif node.op == "neg":
            out = f"Minus({args[0]})"
        elif node.op in _WITH_PARAMS:
            out = _WITH_PARAMS[node.op](node, args)
        else:
            inner = ", ".join(args + [repr(p) for p in node.params])
            out = f"{_name(node.op)}({inner})"
        text[id(node)] = out if len(out) <= limit else out[: max(0, limit - 3)] + "..."
    return text[id(root)]
