"""Elementwise ops: scalar functions applied componentwise, broadcasting dimension 1.

An elementwise op is a few lines: its scalar expression (a sympy expression in
``a0, a1, ...``, or a C template where the C needs care), its reference, and, when
sympy's derivative is not the numerically best form, its partial derivatives as IR.
The VJP and JVP rules are derived from the partial derivatives once, for all of them.
Each :func:`define` registers one :class:`~lazytensor.codegen.ops.OpDef` that keeps the
definition; :data:`ELEMENTWISE` lists them by name.

>>> from lazytensor.codegen import ir, ops
>>> x = ir.var(0, 2, "i")
>>> ops.apply("sigmoid", x).dim
2
>>> ELEMENTWISE["sigmoid"] is ops.get("sigmoid")
True
"""

from __future__ import annotations

import functools
import operator
from typing import Callable, Optional

from . import ir
from .evaluate import evaluate
from .ops import CDialect, OpDef, apply, broadcast_dim, c_literal, elem, get, register

ELEMENTWISE: dict[str, OpDef] = {}  # the ops defined here (and by users), by name


def _vjp_from_partials(node: ir.Node, g: ir.Node):
    partials = partial_derivatives(node)
    out = []
    for a, p in zip(node.args, partials):
        if p is None:
            out.append(None)
            continue
        contrib = apply("mul", g, p)
        if a.dim == 1 and contrib.dim > 1:
            contrib = apply("sum", contrib)
        out.append(contrib)
    return out


def _jvp_from_partials(node: ir.Node, tangents):
    partials = partial_derivatives(node)
    total = None
    for p, t in zip(partials, tangents):
        if p is None or t is None:
            continue
        term = apply("mul", p, t)
        total = term if total is None else apply("add", total, term)
    if total is not None and total.dim != node.dim:
        total = apply("expand", total, params=(node.dim,))
    return total


def partial_derivatives(node: ir.Node) -> list:
    """``[∂node/∂arg_k]`` as IR (None where the op has no derivative in that argument)."""
    opdef = get(node.op)
    if opdef.partials is not None:
        return list(opdef.partials(*node.args, *node.params))
    if opdef.sym is None:
        return [None] * len(node.args)
    return _sympy_partials(node.op, node.params, node.args)


def _sympy_partials(name, params, args):
    from . import sympy_bridge

    exprs = _sympy_derivative_exprs(name, params)
    return [None if e is None else sympy_bridge.to_ir(e, list(args)) for e in exprs]


@functools.cache
def _sympy_derivative_exprs(name, params):
    import sympy

    from . import sympy_bridge

    opdef = get(name)
    syms = sympy_bridge.symbols(opdef.arity)
    expr = opdef.sym(*syms, *params)
    out = []
    for s in syms:
        d = sympy.diff(expr, s)
        d = d.replace(sympy.DiracDelta, lambda *a: sympy.Integer(0))
        out.append(None if d == 0 else d)
    return out


def _c_text(name: str, dialect: CDialect, arg_texts, params) -> str:
    opdef = get(name)
    if opdef.c is not None:
        return opdef.c(dialect, *arg_texts, *params)
    return _sympy_c_text(name, dialect, tuple(arg_texts), params)


@functools.lru_cache(maxsize=4096)
def _sympy_c_text(name, dialect: CDialect, arg_texts, params):
    from . import sympy_bridge

    opdef = get(name)
    expr = opdef.sym(*sympy_bridge.symbols(opdef.arity), *params)
    return sympy_bridge.c_expression(expr, dialect.dtype, list(arg_texts), dialect.functions)


def _lambdified_ref(name: str, arity: int):
    @functools.cache
    def compiled(xp_name, params):
        import sympy

        from . import arraymath, sympy_bridge

        xp = arraymath.numpy_namespace() if xp_name == "numpy" else arraymath.torch_namespace()
        table = {
            "exp": xp.exp, "log": xp.log, "sqrt": xp.sqrt, "sin": xp.sin, "cos": xp.cos,
            "tan": xp.tan, "tanh": xp.tanh, "sinh": xp.sinh, "cosh": xp.cosh,
            "asin": xp.arcsin, "acos": xp.arccos, "atan": xp.arctan, "atan2": xp.arctan2,
            "asinh": xp.arcsinh, "acosh": xp.arccosh, "atanh": xp.arctanh, "erf": xp.erf,
            "erfc": xp.erfc, "log1p": xp.log1p, "expm1": xp.expm1, "floor": xp.floor,
            "ceiling": xp.ceil, "sign": xp.sign, "Abs": xp.abs, "abs": xp.abs, "pi": xp.pi,
            "E": 2.718281828459045,
        }  # fmt: skip
        syms = sympy_bridge.symbols(arity)
        expr = get(name).sym(*syms, *params)
        # Through the IR first: Piecewise, Max/Min, Heaviside, Mod then follow the ops'
        # references (lambdify would print them as Python `if`/`max`, which fail on arrays).
        placeholders = [ir.var(k, 1, "i") for k in range(arity)]
        try:
            node = sympy_bridge.to_ir(expr, placeholders)
        except (NotImplementedError, TypeError):
            node = None
        if node is not None and name not in set(ir.iter_ops(node)):
            return lambda *arrays: _evaluate_ir(node, arrays, xp)
        return sympy.lambdify(syms, expr, modules=[table])

    def ref(xp, arrays, params):
        return compiled(xp.name, tuple(params))(*arrays)

    return ref


def _evaluate_ir(node: ir.Node, arrays, xp):
    """Value of a scalar IR expression in the placeholders ``Vi(k, 1)`` bound to
    ``arrays[k]``, with the arguments' broadcast shape."""
    out = evaluate(node, dict(enumerate(arrays)), xp, like=arrays[0])
    for a in arrays:  # a constant or one-argument result still takes the broadcast shape
        out = xp.where(a == a, out, out)
    return out


def define(
    name: str,
    arity: int,
    sym: Optional[Callable] = None,
    c: Optional[Callable] = None,
    ref: Optional[Callable] = None,
    derivs: Optional[Callable] = None,
    sympy_func: Optional[str] = None,
    differentiable: bool = True,
    doc: str = "",
    keops: tuple = (),
    method: Optional[str] = None,
    example: str = "",
    interop: tuple = (),
    user: bool = False,
) -> OpDef:
    """Register an elementwise op.

    ``sym(a0, ..., *params)`` returns its sympy expression; ``c(dialect, a0, ..., *params)``
    optionally overrides its C text (``dialect``: an :class:`~lazytensor.codegen.ops.CDialect`,
    whose ``call`` names the backend's maths functions); ``ref(xp, arrays, params)`` its reference;
    ``derivs(a0, ..., *params)`` its partial derivatives as IR (default: sympy's);
    ``keops`` its names in formula strings, ``method`` its ``LazyTensor`` method, ``doc``
    and ``example`` that method's docstring, ``interop`` the NumPy/SciPy/torch functions
    that build it, ``user`` whether a user defined it at run time (see
    :class:`~lazytensor.codegen.ops.OpDef`).
    """
    if not differentiable:
        derivs = lambda *a: [None] * arity  # noqa: E731

    def emit(node, out, args, dtype, functions=()):
        dims = [a.dim for a in node.args]
        texts = [elem(a, d, "k") for a, d in zip(args, dims)]
        expr = _c_text(node.op, CDialect(dtype, functions), texts, node.params)
        if node.dim == 1:
            return f"{out}[0] = {expr};"
        return f"for (int k = 0; k < {node.dim}; ++k) {out}[k] = {expr};"

    opdef = register(OpDef(
        name=name, arity=arity, dim_rule=broadcast_dim(name), emit=emit,
        ref=ref if ref is not None else _lambdified_ref(name, arity),
        vjp=_vjp_from_partials, jvp=_jvp_from_partials, sympy_func=sympy_func,
        differentiable=differentiable, doc=doc, keops=tuple(keops), method=method,
        elementwise=True, sym=sym, c=c, partials=derivs, example=example,
        interop=tuple(interop), user=user,
    ))
    ELEMENTWISE[name] = opdef
    return opdef


# ------------------------------------------------------------------ helpers for rules


def _c(v: float):
    return ir.const(v)


def _step(x):
    return apply("step", x)


def _fn(name):
    """The C text of a call of maths function ``name``, as the dialect names it."""
    return lambda dialect, *a: dialect.call(name, *a)


def _np(fname):
    return lambda xp, arrays, params: getattr(xp, fname)(*arrays)


def _sp(fname):
    def sym(*a):
        import sympy

        return getattr(sympy, fname)(*a)

    return sym


def _nan_guard(expr: str, *args: str) -> str:
    """Make a branchy C expression propagate NaN from its operands, as NumPy does."""
    test = " || ".join(f"{a} != {a}" for a in args)
    return f"(({test}) ? ({' + '.join(args)}) : {expr})"


def _example(method: str, values: tuple, result: str) -> str:
    """The doctest of a one-operand method: ``Vi(x).method()`` at two points, dense."""
    rows = ", ".join(f"[{v!r}]" for v in values)
    return (f">>> x = Vi(np.array([{rows}]))\n"
            f">>> x.{method}().dense().round(4).tolist()\n{result}")


def _example2(expr: str, result: str) -> str:
    """The doctest of a two-operand method: ``expr`` of x = (1, 2) (i) and y = (0, 1, 2)
    (j), dense: the (2, 3) table of all pairs."""
    return (">>> x, y = Vi(np.array([[1.0], [2.0]])), Vj(np.array([[0.0], [1.0], [2.0]]))\n"
            f">>> ({expr}).dense().round(4).tolist()\n{result}")


# ------------------------------------------------------------------ arithmetic

define("add", 2, sym=lambda a, b: a + b, c=lambda dl, a, b: f"({a} + {b})",
       ref=lambda xp, t, p: t[0] + t[1], derivs=lambda a, b: [_c(1), _c(1)],
       keops=("Add",), method="__add__", doc="``self + other``",
       example=_example2("x + y", "[[1.0, 2.0, 3.0], [2.0, 3.0, 4.0]]"))
define("sub", 2, sym=lambda a, b: a - b, c=lambda dl, a, b: f"({a} - {b})",
       ref=lambda xp, t, p: t[0] - t[1], derivs=lambda a, b: [_c(1), _c(-1)],
       keops=("Subtract",), method="__sub__", doc="``self - other``",
       example=_example2("x - y", "[[1.0, 0.0, -1.0], [2.0, 1.0, 0.0]]"))
define("mul", 2, interop=("numpy.multiply", "torch.mul", "torch.multiply", "torch.Tensor.mul"),
       sym=lambda a, b: a * b, c=lambda dl, a, b: f"({a} * {b})",
       ref=lambda xp, t, p: t[0] * t[1], derivs=lambda a, b: [b, a],
       keops=("Mult",), method="__mul__", doc="``self * other``",
       example=_example2("x * y", "[[0.0, 1.0, 2.0], [0.0, 2.0, 4.0]]"))
define("div", 2, sym=lambda a, b: a / b, c=lambda dl, a, b: f"({a} / {b})",
       ref=lambda xp, t, p: t[0] / t[1],
       derivs=lambda a, b: [apply("pow", b, params=(-1.0,)),
                            apply("neg", apply("div", a, apply("mul", b, b)))],
       keops=("Divide",), method="__truediv__", doc="``self / other``",
       example=_example2("y / x", "[[0.0, 1.0, 2.0], [0.0, 0.5, 1.0]]"))
define("neg", 1, interop=("numpy.negative", "torch.neg", "torch.negative"),
       sym=lambda a: -a, c=lambda dl, a: f"(-{a})",
       ref=lambda xp, t, p: -t[0], derivs=lambda a: [_c(-1)], keops=("Minus",), method="__neg__",
       doc="``-self``", example=(">>> x = Vi(np.array([[-1.0], [2.0]]))\n"
                                 ">>> (-x).dense().round(4).tolist()\n[[1.0], [-2.0]]"))


def _pow_c(dialect, a, p):
    p = float(p)  # inf and NaN are exponents too (C pow's values are NumPy's)
    if p.is_integer() and 0 <= p <= 16:
        n = int(p)
        return "((T)1)" if n == 0 else "(" + "*".join([a] * n) + ")"
    if p.is_integer() and -16 <= p < 0:
        return "((T)1/(" + "*".join([a] * int(-p)) + "))"
    if p == 0.5:
        return _fn("sqrt")(dialect, a)
    if p == -0.5:
        return f"((T)1/{_fn('sqrt')(dialect, a)})"
    return _fn("pow")(dialect, a, c_literal(p, dialect.dtype))


def _pow_ref(xp, t, params):
    (p,) = params
    if p == 0.5:
        return xp.sqrt(t[0])
    if p == -0.5:
        return 1 / xp.sqrt(t[0])
    return t[0] ** (int(p) if float(p).is_integer() else p)


define("pow", 1, sym=lambda a, p: a ** p, c=_pow_c, ref=_pow_ref,
       derivs=lambda a, p: [None if p == 0 else
                            apply("mul", _c(p), apply("pow", a, params=(p - 1.0,)))],
       doc="a ** p for a static exponent p (int, float, 0.5, -0.5)")


# ------------------------------------------------------------------ branches and comparisons

define("ifelse", 3, c=lambda dl, c, a, b: f"({c} >= 0 ? {a} : {b})",
       ref=lambda xp, t, p: xp.where(t[0] >= 0, t[1], t[2]),
       derivs=lambda c, a, b: [None, _step(c), apply("sub", _c(1), _step(c))],
       doc="a where c >= 0, else b (as pykeops)", keops=("IfElse",), method="ifelse",
       example=_example2("(x - y).ifelse(x, -y)", "[[1.0, 1.0, -2.0], [2.0, 2.0, 2.0]]"))
# step and relu return literal zeros: `a * 0` would turn -inf into NaN (relu(-inf) = 0).
define("step", 1, sym=lambda a: _sp("Heaviside")(a),
       c=lambda dl, a: f"({a} < 0 ? (T)0 : ({a} == {a} ? (T)1 : {a}))",
       ref=lambda xp, t, p: xp.where(t[0] != t[0], t[0], xp.as_float(t[0] >= 0, t[0])),
       differentiable=False, doc="1 where a >= 0, 0 where a < 0, NaN for NaN (step(0) = 1)",
       keops=("Step",), method="step", example=_example("step", (-1.0, 0.0), "[[0.0], [1.0]]"))
define("sign", 1, interop=("numpy.sign", "torch.sign"),
       sym=lambda a: _sp("sign")(a), sympy_func="sign",
       ref=_np("sign"), differentiable=False, keops=("Sign",), method="sign",
       doc="the sign of a: -1, 0 or 1 (NaN for NaN)",
       example=_example("sign", (-2.0, 0.0), "[[-1.0], [0.0]]"))
# the reference takes 0 at 0 as well, so that its torch gradient there is torch's relu's, 0
define("relu", 1, c=lambda dl, a: f"({a} < 0 ? (T)0 : {a})",
       ref=lambda xp, t, p: xp.where(t[0] <= 0, xp.zeros_like(t[0]), t[0]),
       derivs=lambda a: [apply("sub", _c(1), _step(apply("neg", a)))], keops=("ReLU",),
       method="relu", doc="max(a, 0) (relu(-inf) = 0)",
       example=_example("relu", (-1.0, 2.0), "[[0.0], [2.0]]"))
define("abs", 1, interop=("numpy.absolute", "numpy.fabs", "torch.abs", "torch.absolute"),
       c=_fn("fabs"), ref=_np("abs"), sympy_func="Abs",
       derivs=lambda a: [apply("sign", a)], keops=("Abs",), method="abs",
       doc="absolute value ``|a|``",
       example=_example("abs", (-1.0, 2.0), "[[1.0], [2.0]]"))
def _share_of_first(a, b):
    """∂max(a, b)/∂a as torch's ``maximum``: 1 where a > b, 0 where a < b, 1/2 at a tie
    (the gradient split evenly), NaN for NaN: (step(a - b) + 1 - step(b - a)) / 2."""
    return apply("mul", _c(0.5), apply("add", _step(apply("sub", a, b)),
                                       apply("sub", _c(1), _step(apply("sub", b, a)))))


define("min2", 2, c=lambda dl, a, b: _nan_guard(f"({a} <= {b} ? {a} : {b})", a, b),
       ref=_np("minimum"), derivs=lambda a, b: [_share_of_first(b, a), _share_of_first(a, b)],
       doc="the smaller of a and b (NaN for NaN); a tie splits the gradient, as torch.minimum")
define("max2", 2, c=lambda dl, a, b: _nan_guard(f"({a} >= {b} ? {a} : {b})", a, b),
       ref=_np("maximum"), derivs=lambda a, b: [_share_of_first(a, b), _share_of_first(b, a)],
       doc="the larger of a and b (NaN for NaN); a tie splits the gradient, as torch.maximum")
define("clamp", 3, c=lambda dl, x, a, b: f"({x} < {a} ? {a} : ({x} > {b} ? {b} : {x}))",
       ref=lambda xp, t, p: xp.where(t[0] < t[1], t[1], xp.where(t[0] > t[2], t[2], t[0])),
       # torch.clamp's: x's own on [a, b], edges included; a bound's beyond it; 0 for NaN
       derivs=lambda x, a, b: [
           apply("mul", apply("ge", x, a), apply("le", x, b)),
           apply("lt", x, a),
           apply("mul", apply("ge", x, a), apply("gt", x, b)),
       ], doc="x clamped to [a, b]", keops=("Clamp",), method="clamp",
       example=_example2("y.clamp(x - 1, x)", "[[0.0, 1.0, 1.0], [1.0, 1.0, 2.0]]"))

# name: C operator, Python operator, the doctest's table for x = (1, 2) against y = (0, 1, 2)
_COMPARISONS = {
    "eq": ("==", operator.eq, "[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]"),
    "ne": ("!=", operator.ne, "[[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]"),
    "lt": ("<", operator.lt, "[[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]"),
    "gt": (">", operator.gt, "[[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]"),
    "le": ("<=", operator.le, "[[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]]"),
    "ge": (">=", operator.ge, "[[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]"),
}
# the NumPy and torch functions of each comparison (a tensor's method too: t < K calls
# Tensor.lt(t, K))
_COMPARISON_FUNCTIONS = {
    "lt": ("numpy.less", "torch.lt", "torch.less", "torch.Tensor.lt"),
    "le": ("numpy.less_equal", "torch.le", "torch.less_equal", "torch.Tensor.le"),
    "gt": ("numpy.greater", "torch.gt", "torch.greater", "torch.Tensor.gt"),
    "ge": ("numpy.greater_equal", "torch.ge", "torch.greater_equal", "torch.Tensor.ge"),
    "eq": ("numpy.equal", "torch.eq", "torch.Tensor.eq"),
    "ne": ("numpy.not_equal", "torch.ne", "torch.not_equal", "torch.Tensor.ne"),
}
for _name, (_op, _pyop, _table) in _COMPARISONS.items():
    define(_name, 2, interop=_COMPARISON_FUNCTIONS[_name],
           c=lambda dl, a, b, _op=_op: f"(({a} {_op} {b}) ? (T)1 : (T)0)",
           ref=lambda xp, t, p, _pyop=_pyop: xp.as_float(_pyop(t[0], t[1]), t[0]),
           differentiable=False, doc=f"1.0 where ``self {_op} other``, else 0.0",
           method=f"__{_name}__", example=_example2(f"x {_op} y", _table))

define("floor", 1, interop=("numpy.floor", "torch.floor"),
       c=_fn("floor"), ref=_np("floor"), sympy_func="floor", differentiable=False,
       keops=("Floor",), method="floor", doc="the largest integer <= a",
       example=_example("floor", (-1.5, 1.5), "[[-2.0], [1.0]]"))
define("ceil", 1, interop=("numpy.ceil", "torch.ceil"),
       c=_fn("ceil"), ref=_np("ceil"), sympy_func="ceiling", differentiable=False,
       keops=("Ceil",), method="ceil", doc="the smallest integer >= a",
       example=_example("ceil", (-1.5, 1.5), "[[-1.0], [2.0]]"))
define("round", 1, c=_fn("round"), differentiable=False,
       ref=lambda xp, t, p: xp.sign(t[0]) * xp.floor(xp.abs(t[0]) + 0.5),
       doc="round half away from zero, as C round()", method="round",
       example=_example("round", (-1.5, 0.5), "[[-2.0], [1.0]]"))

# ------------------------------------------------------------------ transcendental functions

def _interop(name: str, np_name: str) -> tuple:
    """The NumPy (SciPy for erf, erfc) and torch functions of a transcendental function;
    torch spells the inverse functions both ways (``torch.asin``, ``torch.arcsin``)."""
    numpy = f"scipy.special.{name}" if name in ("erf", "erfc") else f"numpy.{np_name}"
    torch = (f"torch.{name}",) + ((f"torch.{np_name}",) if np_name != name else ()) + \
        ((f"torch.special.{name}",) if name in ("erf", "erfc") else ())
    return (numpy, *torch)


# name (also the sympy function, the C function and the LazyTensor method), NumPy name,
# what it is, and its doctest: two inputs, the outputs rounded
for _name, _np_name, _what, _inputs, _outputs in (
    ("exp", "exp", "exponential", (0.0, 1.0), "[[1.0], [2.7183]]"),
    ("log", "log", "natural logarithm", (1.0, 2.0), "[[0.0], [0.6931]]"),
    ("sin", "sin", "sine", (0.0, 1.0), "[[0.0], [0.8415]]"),
    ("cos", "cos", "cosine", (0.0, 1.0), "[[1.0], [0.5403]]"),
    ("tan", "tan", "tangent", (0.0, 1.0), "[[0.0], [1.5574]]"),
    ("sinh", "sinh", "hyperbolic sine", (0.0, 1.0), "[[0.0], [1.1752]]"),
    ("cosh", "cosh", "hyperbolic cosine", (0.0, 1.0), "[[1.0], [1.5431]]"),
    ("asin", "arcsin", "inverse sine", (0.0, 0.5), "[[0.0], [0.5236]]"),
    ("acos", "arccos", "inverse cosine", (1.0, 0.5), "[[0.0], [1.0472]]"),
    ("atan", "arctan", "inverse tangent", (0.0, 1.0), "[[0.0], [0.7854]]"),
    ("asinh", "arcsinh", "inverse hyperbolic sine", (0.0, 1.0), "[[0.0], [0.8814]]"),
    ("acosh", "arccosh", "inverse hyperbolic cosine", (1.0, 2.0), "[[0.0], [1.317]]"),
    ("atanh", "arctanh", "inverse hyperbolic tangent", (0.0, 0.5), "[[0.0], [0.5493]]"),
    ("erf", "erf", "error function", (0.0, 1.0), "[[0.0], [0.8427]]"),
    ("erfc", "erfc", "complementary error function 1 - erf(a)", (0.0, 1.0), "[[1.0], [0.1573]]"),
):  # fmt: skip
    define(_name, 1, sym=_sp(_name), c=_fn(_name), ref=_np(_np_name), sympy_func=_name,
           interop=_interop(_name, _np_name), keops=(_name.capitalize(),), method=_name,
           doc=f"{_what} {_name}(a)",
           example=_example(_name, _inputs, _outputs))

def _inv_or_zero(r):
    """1 / r, and 0 where r == 0 (r >= 0 here): the value torch gives the derivatives whose
    denominator vanishes at a singular point (atan2 at the origin)."""
    return apply("ifelse", apply("neg", r), _c(0), apply("inv", r))


def _atan2_derivatives(a, b):
    """∂atan2(a, b) = (b, -a) / (a² + b²); 0 at the origin, as torch (not 0 / 0)."""
    scale = _inv_or_zero(apply("add", apply("square", a), apply("square", b)))
    return [apply("mul", b, scale), apply("neg", apply("mul", a, scale))]


define("atan2", 2, interop=("numpy.arctan2", "torch.atan2", "torch.arctan2", "torch.Tensor.atan2"),
       sym=_sp("atan2"), c=_fn("atan2"), ref=_np("arctan2"), sympy_func="atan2",
       derivs=_atan2_derivatives,
       keops=("Atan2",), method="atan2",
       doc="atan2(self, other), the angle of the point (other, self)",
       example=_example2("y.atan2(x)", "[[0.0, 0.7854, 1.1071], [0.0, 0.4636, 0.7854]]"))
define("tanh", 1, interop=("numpy.tanh", "torch.tanh"),
       sym=_sp("tanh"), c=_fn("tanh"), ref=_np("tanh"), sympy_func="tanh",
       derivs=lambda a: [apply("sub", _c(1), apply("square", apply("tanh", a)))],
       keops=("Tanh",), method="tanh", doc="hyperbolic tangent tanh(a)",
       example=_example("tanh", (0.0, 1.0), "[[0.0], [0.7616]]"))
define("log1p", 1, interop=("numpy.log1p", "torch.log1p", "torch.special.log1p"),
       sym=lambda a: _sp("log")(1 + a), c=_fn("log1p"), ref=_np("log1p"),
       derivs=lambda a: [apply("pow", apply("add", _c(1), a), params=(-1.0,))],
       keops=("Log1p",), method="log1p", doc="log(1 + a), accurate for small a",
       example=_example("log1p", (0.0, 1.0), "[[0.0], [0.6931]]"))
define("expm1", 1, interop=("numpy.expm1", "torch.expm1", "torch.special.expm1"),
       sym=lambda a: _sp("exp")(a) - 1, c=_fn("expm1"), ref=_np("expm1"),
       derivs=lambda a: [apply("exp", a)], keops=("Expm1",), method="expm1",
       doc="exp(a) - 1, accurate for small a",
       example=_example("expm1", (0.0, 1.0), "[[0.0], [1.7183]]"))
define("square", 1, interop=("numpy.square", "torch.square"),
       sym=lambda a: a * a, c=lambda dl, a: f"({a} * {a})",
       ref=lambda xp, t, p: t[0] * t[0], derivs=lambda a: [apply("mul", _c(2), a)],
       keops=("Square",), method="square", doc="a * a",
       example=_example("square", (-2.0, 3.0), "[[4.0], [9.0]]"))
define("inv", 1, interop=("numpy.reciprocal", "torch.reciprocal"),
       sym=lambda a: 1 / a, c=lambda dl, a: f"((T)1 / {a})",
       ref=lambda xp, t, p: 1 / t[0], derivs=lambda a: [apply("neg", apply("pow", a, params=(-2.0,)))],
       keops=("Inv",), method="inv", doc="1 / a",
       example=_example("inv", (2.0, 4.0), "[[0.5], [0.25]]"))
# As KeOps: rsqrt(0) = 0, and sqrt'(a) = rsqrt(a) / 2, so that the gradient of a distance
# sqrt(|x - y|²) at x = y is 0 (|x - y|'s subgradient), not inf * 0 = NaN.
define("sqrt", 1, interop=("numpy.sqrt", "torch.sqrt"),
       sym=_sp("sqrt"), c=_fn("sqrt"), ref=_np("sqrt"), sympy_func="sqrt",
       derivs=lambda a: [apply("mul", _c(0.5), apply("rsqrt", a))], keops=("Sqrt",),
       method="sqrt", doc="square root sqrt(a) (its derivative at 0 is 0, as KeOps)",
       example=_example("sqrt", (0.0, 4.0), "[[0.0], [2.0]]"))
define("rsqrt", 1, interop=("torch.rsqrt",),
       sym=lambda a: a ** _sp("Rational")(-1, 2),
       c=lambda dl, a: f"({a} == 0 ? (T)0 : (T)1 / {_fn('sqrt')(dl, a)})",
       ref=lambda xp, t, p: xp.where(t[0] == 0, 0 * t[0],
                                     1 / xp.sqrt(xp.where(t[0] == 0, 1 + 0 * t[0], t[0]))),
       derivs=lambda a: [apply("mul", _c(-0.5), apply("pow", apply("rsqrt", a), params=(3.0,)))],
       keops=("Rsqrt",), method="rsqrt", doc="1 / sqrt(a), 0 at 0 (as KeOps)",
       example=_example("rsqrt", (0.0, 4.0), "[[0.0], [0.5]]"))
def _powf_derivatives(a, b):
    """b a^(b-1) and log(a) a^b, with torch's values where they are 0 · inf: 0 for the
    base at b = 0, 0 for the exponent at a = 0 with b >= 0."""
    zero_b = apply("neg", apply("abs", b))  # >= 0 only where b == 0
    zero_a = apply("min2", apply("neg", apply("abs", a)), b)  # >= 0 where a == 0 <= b
    return [apply("ifelse", zero_b, _c(0), apply("mul", b, apply("powf", a, apply("sub", b, _c(1))))),
            apply("ifelse", zero_a, _c(0), apply("mul", apply("log", a), apply("powf", a, b)))]


define("powf", 2, sym=lambda a, b: a ** b, c=_fn("pow"), ref=lambda xp, t, p: t[0] ** t[1],
       derivs=_powf_derivatives,
       keops=("Powf",), method="powf",
       doc="a ** b for a formula exponent, as C pow: signed for a < 0 and integer-valued b",
       example=_example2("x.powf(y)", "[[1.0, 1.0, 1.0], [1.0, 2.0, 4.0]]"))
define("sigmoid", 1, interop=("scipy.special.expit", "torch.sigmoid", "torch.special.expit"),
       sym=lambda a: 1 / (1 + _sp("exp")(-a)),
       c=lambda dl, a: f"((T)1 / ((T)1 + {_fn('exp')(dl, '-' + a)}))",
       ref=lambda xp, t, p: 1 / (1 + xp.exp(-t[0])),
       derivs=lambda a: [apply("mul", apply("sigmoid", a), apply("sub", _c(1), apply("sigmoid", a)))],
       keops=("Sigmoid",), method="sigmoid", doc="logistic function 1 / (1 + exp(-a))",
       example=_example("sigmoid", (0.0, 1.0), "[[0.5], [0.7311]]"))
define("softplus", 1, sym=lambda a: _sp("log")(1 + _sp("exp")(a)),
       c=lambda dl, a: f"({a} > 0 ? {a} + {_fn('log1p')(dl, _fn('exp')(dl, '-' + a))} : "
                       f"{_fn('log1p')(dl, _fn('exp')(dl, a))})",
       ref=lambda xp, t, p: xp.maximum(t[0], xp.zeros_like(t[0])) + xp.log1p(xp.exp(-xp.abs(t[0]))),
       derivs=lambda a: [apply("sigmoid", a)], doc="log(1 + exp(a)), overflow-free",
       keops=("Softplus",), method="softplus",
       example=_example("softplus", (0.0, 1.0), "[[0.6931], [1.3133]]"))
define("logsigmoid", 1, interop=("scipy.special.log_expit", "torch.nn.functional.logsigmoid"),
       sym=lambda a: -_sp("log")(1 + _sp("exp")(-a)),
       c=lambda dl, a: f"(-({a} < 0 ? -{a} + {_fn('log1p')(dl, _fn('exp')(dl, a))} : "
                       f"{_fn('log1p')(dl, _fn('exp')(dl, '-' + a))}))",
       ref=lambda xp, t, p: -(xp.maximum(-t[0], xp.zeros_like(t[0])) + xp.log1p(xp.exp(-xp.abs(t[0])))),
       derivs=lambda a: [apply("sigmoid", apply("neg", a))], keops=("LogSigmoid",),
       method="logsigmoid", doc="log(sigmoid(a)) = -softplus(-a), overflow-free",
       example=_example("logsigmoid", (0.0, 1.0), "[[-0.6931], [-0.3133]]"))
define("xlogx", 1, sym=lambda a: a * _sp("log")(a),
       c=lambda dl, a: f"({a} == 0 ? (T)0 : {a} * {_fn('log')(dl, a)})",
       ref=lambda xp, t, p: xp.where(t[0] == 0, 0 * t[0], t[0] * xp.log(xp.where(t[0] == 0, 1 + 0 * t[0], t[0]))),
       derivs=lambda a: [apply("add", apply("log", a), _c(1))], doc="x log x, 0 at 0",
       keops=("XLogX",), method="xlogx", example=_example("xlogx", (0.0, 2.0), "[[0.0], [1.3863]]"))
define("sinxdivx", 1, sym=lambda a: _sp("sin")(a) / a,
       c=lambda dl, a: f"({a} == 0 ? (T)1 : {_fn('sin')(dl, a)} / {a})",
       ref=lambda xp, t, p: xp.where(t[0] == 0, 1 + 0 * t[0], xp.sin(t[0]) / xp.where(t[0] == 0, 1 + 0 * t[0], t[0])),
       derivs=lambda a: [_sinxdivx_derivative(a)],
       doc="sin(x)/x, 1 at 0", keops=("SinXDivX",), method="sinxdivx",
       example=_example("sinxdivx", (0.0, 1.0), "[[1.0], [0.8415]]"))


def _softmax_weight_c(dialect, f, lse, limit):
    fr = f"lt_rounded({f})"
    inf = f"({fr} == {lse} && {lse} == (T)INFINITY) ? (T)1 : " if limit else ""
    return f"({inf}{_fn('exp')(dialect, f'{fr} - {lse}')})"


def _softmax_weight_ref(xp, t, params):
    f, lse = t
    with_limit = xp.where((f == lse) & (lse == float("inf")), 1 + xp.zeros_like(f), xp.exp(f - lse))
    return with_limit if params[0] else xp.exp(f - lse)


# exp(f - lse), the weight of a term f in the gradients of the log-sum-exp family. f is
# rounded to the kernel's precision first (lt_rounded): the forward stored it before it
# took the maximum, and a product contracted with the subtraction (FMA) would differ from
# it by up to half an ulp of f, which exp amplifies (f = -|x - y|^2 / 1e-2 ~ -1e5 in
# float32: errors of 1e-3 and more). With ``limit``, a term at +inf where the log-sum-exp
# is +inf weighs 1 (the limit the forward and dual mode follow) instead of exp(inf - inf).
define("softmax_weight", 2, c=_softmax_weight_c, ref=_softmax_weight_ref,
       derivs=lambda f, lse, limit: [apply("softmax_weight", f, lse, params=(limit,)),
                                     apply("neg", apply("softmax_weight", f, lse, params=(limit,)))],
       doc="exp(f - lse) of f rounded first (the log-sum-exp family's gradients)")


def _sinxdivx_derivative(a):
    """(cos a - sin(a)/a) / a, which cancels catastrophically near 0: there, its series
    -a/3 + a³/30 (error below 1e-16 for |a| < 1e-3), and 0 at 0 instead of 0/0."""
    exact = apply("div", apply("sub", apply("cos", a), apply("sinxdivx", a)), a)
    series = apply("mul", a, apply("add", _c(-1.0 / 3.0), apply("mul", _c(1.0 / 30.0), apply("square", a))))
    return apply("ifelse", apply("sub", _c(1e-3), apply("abs", a)), series, exact)
