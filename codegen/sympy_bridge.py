"""Between sympy and the IR: C text of scalar expressions, and sympy results back to IR.

sympy is imported lazily: a process that only loads cached kernels never pays for it.

>>> import sympy
>>> u = sympy.Symbol("a0")
>>> c_expression(sympy.exp(-u**2), "float64", ["x"])
'exp(-(x*x))'
"""

from __future__ import annotations

import functools
import re

from . import ir


@functools.cache
def _printer(dtype: str):
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

    settings = {"type_aliases": {real: float32}} if dtype == "float32" else {}
    return KernelPrinter(settings)


_ARG_RE = re.compile(r"\ba(\d+)\b")


def c_expression(expr, dtype: str, arg_texts: list[str]) -> str:
    """C text of a sympy expression in symbols ``a0, a1, ...`` with arguments substituted."""
    text = _printer(dtype).doprint(expr)
    return _ARG_RE.sub(lambda m: arg_texts[int(m.group(1))], text)


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
