"""Between sympy and the IR: C text of scalar expressions, and sympy results back to IR.

sympy is imported lazily: a process that only loads cached kernels never pays for it.
What reaches the printer from a user is checked first (:func:`check_expression`): names
are identifiers, literals fit float64 and print as exact floating literals (a C integer
literal past 64 bits is silently truncated), and only nodes with a C translation pass;
the printed text is checked again before it goes into a kernel (:func:`check_c_text`).

>>> import sympy
>>> u = sympy.Symbol("a0")
>>> c_expression(sympy.exp(-u**2), "float64", ["x"])
'exp(-(x*x))'
>>> c_expression(u * 10**20, "float64", ["x"])
'1.0e20*x'
"""

from __future__ import annotations

import functools
import re
from decimal import Decimal, localcontext

from . import ir

_INT_MAX = 2**31 - 1  # larger integers are printed as floating literals
_EXACT = 2**53  # p.0/q.0 is exact while both are below this
_FLT_MAX = 3.4028234663852886e38
_FLT_TRUE_MIN = 1.401298464324817e-45
_DIGITS = 40  # significant digits of a literal that is not exact in decimal


@functools.cache
def _printer(dtype: str, functions: tuple = ()):
    """The printer of ``dtype`` kernels; ``functions``: the backend's own maths functions
    as (C name, its name) pairs (see :class:`lazytensor.codegen.ops.CDialect`)."""
    import sympy
    from sympy.codegen.ast import float32, real
    from sympy.printing.c import C99CodePrinter

    class KernelPrinter(C99CodePrinter):
        """C99 printer that expands small integer powers into products (no pow calls)."""

        def _print_Pow(self, expr):
            base, exp = expr.args
            if exp.is_Integer and 1 <= abs(int(exp)) <= 8:
                b = self.parenthesize(base, 100)  # always parenthesized: base is a product term
                n = abs(int(exp))
                prod = "(" + "*".join([b] * n) + ")"
                if exp < 0:
                    return f"({self._print(sympy.Integer(1))}/{prod})"
                return prod
            if exp == sympy.Rational(1, 2):
                return f"{self._print_Function_name('sqrt')}({self._print(base)})"
            if exp == -sympy.Rational(1, 2):
                return f"(1/{self._print_Function_name('sqrt')}({self._print(base)}))"
            return super()._print_Pow(expr)

        def _print_Function_name(self, name):
            return name + ("f" if dtype == "float32" else "")

        def _print_Heaviside(self, expr):
            # step(0) = 1 as in KeOps; NaN propagates.
            a = self._print(expr.args[0])
            return f"(({a}) < 0 ? ({a})*0 : ({a}) == ({a}) ? 1 : ({a}))"

        def _print_Mod(self, expr):
            # sympy's Mod takes the sign of the divisor (floored); C's fmod truncates.
            a, b = (self.parenthesize(x, 100) for x in expr.args)
            return f"({a} - {b}*{self._print_Function_name('floor')}({a}/{b}))"

        def _print_sign(self, expr):
            a = self._print(expr.args[0])
            return f"(({a}) > 0 ? 1 : ({a}) < 0 ? -1 : ({a})*0)"

        def _print_Integer(self, expr):
            n = int(expr)
            return str(n) if abs(n) <= _INT_MAX else self._literal(expr)

        def _print_Rational(self, expr):
            if abs(expr.p) < _EXACT and expr.q < _EXACT:
                return super()._print_Rational(expr)
            return self._literal(expr)

        def _print_Float(self, expr):
            if expr != 0 and dtype == "float32" and not _in_float32_range(_finite(expr)):
                return _printer("float64")._print_Float(expr)  # as a float: 0 or inf
            return super()._print_Float(expr)

        def _print_NumberSymbol(self, expr):
            if expr in self.math_macros:
                return super()._print_NumberSymbol(expr)
            return self._literal(sympy.Rational(expr.evalf(_DIGITS + 5)))

        def _literal(self, value):
            """A floating literal the compiler rounds to the nearest value of its type."""
            suffix = self._get_literal_suffix(real)
            if dtype == "float32" and not _in_float32_range(_finite(value)):
                suffix = ""  # a double literal: as a float it would be 0 or inf
            return literal_text(value) + suffix

    settings = {"type_aliases": {real: float32}} if dtype == "float32" else {}
    printer = KernelPrinter(settings)
    own = dict(functions)
    for sympy_name, c_name in printer.known_functions.items():  # the backend's own, by name
        if isinstance(c_name, str) and c_name in own:
            setattr(KernelPrinter, f"_print_{sympy_name}", _own_function(own[c_name]))
    return printer


def _own_function(name: str):
    def print_call(self, expr):
        return f"{name}({', '.join(self._print(a) for a in expr.args)})"

    return print_call


def _finite(value) -> float:
    """``value`` as a float64, refused when it overflows or underflows to zero there."""
    approx = float(value)
    if approx in (float("inf"), float("-inf")) or (approx == 0 and value != 0):
        text = str(value)
        if len(text) > 24:
            import sympy

            text = str(sympy.Float(value, 6))
        raise ValueError(f"the literal {text} is outside the float64 range (it would be "
                         f"{approx})")
    return approx


def _in_float32_range(approx: float) -> bool:
    return approx == 0 or _FLT_TRUE_MIN <= abs(approx) <= _FLT_MAX


def literal_text(value) -> str:
    """Decimal text of a rational ``value`` (a sympy Rational), exact for integers and for
    fractions with a short decimal expansion, else to 40 significant digits.

    >>> import sympy
    >>> literal_text(sympy.Integer(2**64)), literal_text(sympy.Rational(1, 3))
    ('18446744073709551616.0', '3.333333333333333333333333333333333333333e-1')
    """
    p, q = int(value.p), int(value.q)
    if q == 1:
        digits = str(abs(p))
        stripped = digits.rstrip("0")
        zeros = len(digits) - len(stripped)
        sign = "-" if p < 0 else ""
        if zeros > 3:
            return f"{sign}{stripped or '0'}.0e{zeros}"
        return f"{sign}{digits}.0"
    with localcontext() as context:
        context.prec = _DIGITS
        return f"{Decimal(p) / Decimal(q):e}"


_ARG_RE = re.compile(r"\ba(\d+)\b")


def c_expression(expr, dtype: str, arg_texts: list[str], functions: tuple = ()) -> str:
    """C text of a sympy expression in symbols ``a0, a1, ...`` with arguments substituted
    (``functions``: the backend's own maths functions, see :func:`_printer`)."""
    text = check_c_text(_printer(dtype, functions).doprint(expr), {own for _, own in functions})
    return _ARG_RE.sub(lambda m: arg_texts[int(m.group(1))], text)


# ---------------------------------------------------------------- what the printer may get

_TOKEN_RE = re.compile(
    r"(?P<space>\s+)|(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?[Ff]?)"
    r"|(?P<name>[A-Za-z_]\w*)|(?P<op>==|!=|<=|>=|&&|\|\||[-+*/%()<>!?:,])"
)
_MACROS = {"INFINITY", "NAN", "HUGE_VAL", "HUGE_VALF", "true", "false"}
_OWN_FUNCTIONS = {"Heaviside", "Mod", "sign"}  # printed by KernelPrinter itself
_EXPANDED_TERMS = 256  # at most this many terms of a finite Sum/Product are written out


@functools.cache
def _c_names() -> frozenset:
    """Every identifier the printers may write: functions (both precisions), macros."""
    printer = _printer("float64")
    names = {"pow", "sqrt", "floor", "fabs", "abs"}
    for value in printer.known_functions.values():
        names.update([value] if isinstance(value, str) else [name for _, name in value])
    names |= {name + "f" for name in names}
    return frozenset(names | set(printer.math_macros.values()) | _MACROS)


def check_c_text(text: str, own: set | frozenset = frozenset()) -> str:
    """Return ``text`` if it holds only numbers, argument names ``a0, a1, ...``, known C
    functions (and the backend's ``own``) and macros, and operators; else raise ``ValueError`` (nothing else, such
    as a ``#`` line, a quote or a comment, ever goes into a kernel).

    >>> check_c_text("exp(-a0)*1.5F")
    'exp(-a0)*1.5F'
    >>> check_c_text('a0\\n#include "x"')
    Traceback (most recent call last):
    ValueError: the C printer produced text that is not an expression of known names: '#include "x"'
    """
    position = 0
    while position < len(text):
        match = _TOKEN_RE.match(text, position)
        name = match and match.group("name")
        if match is None or (name and name not in _c_names() and name not in own
                             and not _ARG_RE.fullmatch(name)):
            raise ValueError("the C printer produced text that is not an expression of known "
                             f"names: {text[position:position + 60]!r}")
        position = match.end()
    return text


def _is_identifier(name: object) -> bool:
    return isinstance(name, str) and name.isascii() and name.isidentifier()


def _expand_sums(expr):
    """Subs and Derivative evaluated; a Sum or Product with integer bounds written out."""
    import sympy

    def expand(node):
        if isinstance(node, (sympy.Subs, sympy.Derivative)):
            return node.doit(deep=False)
        (var, low, high), *more = node.limits
        if more or not (low.is_Integer and high.is_Integer) or high - low >= _EXPANDED_TERMS:
            raise ValueError(f"{type(node).__name__} {node} has no C translation: only a "
                             f"single index with integer bounds and at most "
                             f"{_EXPANDED_TERMS} terms is written out")
        terms = [node.function.xreplace({var: sympy.Integer(k)})
                 for k in range(int(low), int(high) + 1)]
        return sympy.Add(*terms) if isinstance(node, sympy.Sum) else sympy.Mul(*terms)

    kinds = (sympy.Subs, sympy.Derivative, sympy.Sum, sympy.Product)
    for _ in range(8):  # nested ones come out one level at a time
        if not expr.has(*kinds):
            return expr
        expr = expr.replace(lambda node: isinstance(node, kinds), expand)
    raise ValueError(f"{expr} nests Sum/Product/Subs/Derivative too deeply")


def _refusal(node, allowed: set) -> str | None:
    """Why one node of a user expression cannot be printed exactly as C, or ``None``."""
    import sympy
    from sympy.core.function import AppliedUndef
    from sympy.logic.boolalg import Boolean

    if isinstance(node, sympy.Symbol):
        return None if node in allowed else f"the symbol {node.name} is not an argument"
    if node is sympy.zoo or node is sympy.I:
        return f"{node} is not a real number"
    if node.is_Number:
        if node.is_finite is False or node is sympy.nan:
            return None  # INFINITY, NAN
        try:
            _finite(node)
        except ValueError as error:
            return str(error)
        return None
    if node.is_NumberSymbol or isinstance(node, (sympy.Add, sympy.Mul, sympy.Pow, sympy.Max,
                                                  sympy.Min,
                                                  sympy.Piecewise, sympy.core.relational.Relational,
                                                  sympy.functions.elementary.piecewise.ExprCondPair)):
        return None
    if isinstance(node, AppliedUndef):
        return f"{node.func} is an undefined function: no C translation"
    if isinstance(node, sympy.Function):
        name = node.func.__name__
        if name in _printer("float64").known_functions or name in _OWN_FUNCTIONS:
            return None
        return f"no C translation for the function {name}"
    if isinstance(node, Boolean) and isinstance(node, (sympy.And, sympy.Or, sympy.Not)) or \
            node in (sympy.true, sympy.false):
        return None
    return f"no C translation for {type(node).__name__} ({node})"


def check_expression(expr, syms):
    """The expression of a user function, ready to print, or ``ValueError`` saying why not.

    Symbol and function names must be identifiers; Subs and Derivative are evaluated,
    a short finite Sum or Product is written out; every literal must be finite and
    nonzero in float64 (large integers then print as exact floating literals); constants
    such as EulerGamma print as their value; any other node without a C translation is
    refused here, at definition time, rather than by the compiler.

    >>> import sympy
    >>> u, = symbols(1)
    >>> check_expression(u * sympy.EulerGamma, [u])
    EulerGamma*a0
    >>> check_expression(u * 10**400, [u])
    Traceback (most recent call last):
    ValueError: the literal 1.00000e+400 is outside the float64 range (it would be inf)
    """
    import sympy

    for atom in expr.atoms(sympy.Symbol, sympy.core.function.AppliedUndef):
        name = atom.name if isinstance(atom, sympy.Symbol) else atom.func.__name__
        if not _is_identifier(name):
            raise ValueError(f"the name {name!r} in the expression is not an identifier")
    expr = _expand_sums(expr)
    allowed = set(syms)
    for node in sympy.preorder_traversal(expr):
        reason = _refusal(node, allowed)
        if reason is not None:
            raise ValueError(reason)
    return expr


def symbols(n: int):
    import sympy

    return [sympy.Symbol(f"a{k}", real=True) for k in range(n)]


# ---------------------------------------------------------------- sympy -> IR


def to_ir(expr, args: list[ir.Node]) -> ir.Node:
    """Translate a sympy expression in ``a0, a1, ...`` to IR, ``ak`` standing for ``args[k]``.

    Used to bring derivatives computed by sympy back into the IR, where the vector rules
    and the simplifier work on them.
    """
    import sympy

    from . import ops

    dim = max(a.dim for a in args) if args else 1
    syms = {s: args[k] for k, s in enumerate(symbols(len(args)))}

    def conv(e) -> ir.Node:
        if e in syms:
            return syms[e]
        if e.is_Number or e.is_NumberSymbol:
            return ir.const(float(e))
        if isinstance(e, sympy.Add):
            terms = [conv(t) for t in e.args]
            out = terms[0]
            for t in terms[1:]:
                out = ops.apply("add", out, t)
            return out
        if isinstance(e, sympy.Mul):
            out = None
            for t in e.args:
                c = conv(t)
                out = c if out is None else ops.apply("mul", out, c)
            return out
        if isinstance(e, sympy.Pow):
            base, exp = e.args
            if exp.is_Number:
                return ops.apply("pow", conv(base), params=(float(exp),))
            return ops.apply("exp", ops.apply("mul", conv(exp), ops.apply("log", conv(base))))
        if isinstance(e, sympy.Mod):  # floored: a - b floor(a / b)
            a, b = conv(e.args[0]), conv(e.args[1])
            return ops.apply("sub", a, ops.apply("mul", b, ops.apply("floor", ops.apply("div", a, b))))
        if isinstance(e, sympy.DiracDelta):
            return ir.const(0.0)
        if isinstance(e, sympy.Heaviside):
            return ops.apply("step", conv(e.args[0]))
        if isinstance(e, sympy.Piecewise):
            return _piecewise(e, conv)
        if isinstance(e, (sympy.Max, sympy.Min)):
            name = "max2" if isinstance(e, sympy.Max) else "min2"
            out = conv(e.args[0])
            for t in e.args[1:]:
                out = ops.apply(name, out, conv(t))
            return out
        if isinstance(e, sympy.Function):
            name = ops.op_for_sympy_function(e.func)
            if name is None:
                raise NotImplementedError(f"no IR op for sympy function {e.func}")
            return ops.apply(name, *[conv(a) for a in e.args])
        raise NotImplementedError(f"cannot translate sympy expression {e!r} to IR")

    node = conv(sympy.sympify(expr))
    if node.dim != dim and node.dim == 1 and dim > 1:
        node = ops.apply("expand", node, params=(dim,))
    return node


def _piecewise(e, conv):
    """``Piecewise((a, cond), ..., (b, True))`` as nested ``ifelse`` (c >= 0 selects a)."""
    import sympy

    from . import ops

    (val, cond), rest = e.args[0], e.args[1:]
    other = conv(sympy.Piecewise(*rest)) if rest and rest[0][1] is not sympy.true else (
        conv(rest[0][0]) if rest else ir.const(float("nan"))
    )
    if cond is sympy.true:
        return conv(val)
    lhs, rhs = cond.lhs, cond.rhs
    if isinstance(cond, (sympy.GreaterThan, sympy.StrictGreaterThan)):
        c, a, b = conv(lhs - rhs), conv(val), other
    elif isinstance(cond, (sympy.LessThan, sympy.StrictLessThan)):
        c, a, b = conv(rhs - lhs), conv(val), other
    else:
        raise NotImplementedError(f"cannot translate condition {cond} to IR")
    return ops.apply("ifelse", c, a, b)
