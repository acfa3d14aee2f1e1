"""KeOps formula strings to IR: a tokenizer and a recursive-descent parser (never ``eval``).

Grammar (lowest precedence first, as in Python, where KeOps strings come from)::

    formula  := additive ('|' additive)*          (x|y) is the dot product
    additive := term (('+' | '-') term)*
    term     := unary (('*' | '/') unary)*
    unary    := ('-' | '+') unary | primary
    primary  := NUMBER | NAME | NAME '(' arguments ')' | '(' formula ')'

Names are looked up in tables (aliases, :data:`FUNCTIONS`, user-registered functions);
numbers go through ``int()`` / ``float()``. Nothing of the string reaches generated code
except through the IR it builds. :data:`FUNCTIONS` takes the one-to-one names from the op
registry (each op record lists its formula-string names) and the compositions
(``SqDist``, ``Mod``, ``Kron``, ...) from :mod:`lazytensor.codegen.compositions`, which the
``LazyTensor`` methods use too. Static shapes are written ``[2, 3]`` (as KeOps), ``Ind(2, 3)``
or ``(2, 3)``.

Variable indices: an alias written with an index (``"y = Vj(1, 3)"``, ``"Var(1, 3, 1)"``)
keeps it; one written without (``"x = Vi(3)"``) takes its position in the alias list,
as in KeOps. A formula may also use ``Var(index, dim, cat)``, ``Vi(index, dim)``, ... inline.
All indices together must be ``0 .. n-1``: they give the order of the call's arguments.

>>> f, variables = parse("Exp(-SqDist(x, y)) * b", ["x = Vi(3)", "y = Vj(3)", "b = Vj(1)"])
>>> [(v.name, v.index, v.cat, v.dim) for v in variables], f.dim
([('x', 0, 'i', 3), ('y', 1, 'j', 3), ('b', 2, 'j', 1)], 1)
"""

from __future__ import annotations

import difflib
import keyword
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import compositions, ir, ops

MAX_DEPTH = 64  # nesting of parentheses, calls and unary signs (Python's stack stays safe)
MAX_INDEX = 4095
MAX_DIM = 1 << 16
MAX_INT = 1 << 31
_DIGITS = frozenset("0123456789")
_IDENT_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_IDENT = _IDENT_START | _DIGITS
_PUNCT = frozenset("+-*/|(),=[]")
_CATS = {"Vi": "i", "Vj": "j", "Pm": "p"}
_KEOPS_CATS = {0: "i", 1: "j", 2: "p"}


class FormulaSyntaxError(ValueError):
    """A malformed formula or alias; the message shows the string with a caret under ``pos``."""

    def __init__(self, message: str, source: str, pos: int):
        self.source, self.pos = source, pos
        super().__init__(f"{message}\n{excerpt(source, pos)}")


def excerpt(source: str, pos: int, width: int = 60) -> str:
    """Two lines: (a window of) ``source`` and a caret under character ``pos``."""
    text = "".join(c if c.isprintable() else " " for c in source)
    start = max(0, pos - width)
    end = min(len(text), pos + width)
    prefix = "..." if start > 0 else ""
    suffix = "..." if end < len(text) else ""
    line = prefix + text[start:end] + suffix
    return f"    {line}\n    {' ' * (len(prefix) + pos - start)}^"


# ---------------------------------------------------------------------------- tokens


@dataclass(frozen=True)
class Token:
    kind: str  # "int", "float", "name", "op", "end"
    text: str
    pos: int


def tokenize(source: str) -> list[Token]:
    """Split ``source`` into tokens; raise :class:`FormulaSyntaxError` at a bad character."""
    if not isinstance(source, str):
        raise TypeError(f"a formula must be a string, got {type(source).__name__}")
    tokens, i, n = [], 0, len(source)
    while i < n:
        c = source[i]
        if c in " \t\r\n":
            i += 1
        elif c in _DIGITS or (c == "." and i + 1 < n and source[i + 1] in _DIGITS):
            tok = _scan_number(source, i)
            tokens.append(tok)
            i += len(tok.text)
        elif c in _IDENT_START:
            j = i + 1
            while j < n and source[j] in _IDENT:
                j += 1
            tokens.append(Token("name", source[i:j], i))
            i = j
        elif c in _PUNCT:
            tokens.append(Token("op", c, i))
            i += 1
        else:
            raise FormulaSyntaxError(f"unexpected character {c!r}", source, i)
    tokens.append(Token("end", "", n))
    return tokens


def _scan_number(source: str, i: int) -> Token:
    n, j = len(source), i
    while j < n and source[j] in _DIGITS:
        j += 1
    is_float = False
    if j < n and source[j] == ".":
        is_float = True
        j += 1
        while j < n and source[j] in _DIGITS:
            j += 1
    if j < n and source[j] in "eE":
        k = j + 1
        if k < n and source[k] in "+-":
            k += 1
        if k >= n or source[k] not in _DIGITS:
            raise FormulaSyntaxError("malformed exponent in number", source, j)
        while k < n and source[k] in _DIGITS:
            k += 1
        is_float, j = True, k
    if j - i > 400:
        raise FormulaSyntaxError("number literal too long", source, i)
    return Token("float" if is_float else "int", source[i:j], i)


# ---------------------------------------------------------------------------- variables


@dataclass(frozen=True)
class VarDecl:
    """A formula variable: its alias name (None for an inline ``Var(...)``), index, category, dim."""

    name: str | None
    index: int
    cat: str
    dim: int

    @property
    def node(self) -> ir.Node:
        return ir.var(self.index, self.dim, self.cat)

    def describe(self) -> str:
        kind = {"i": "Vi", "j": "Vj", "p": "Pm"}[self.cat]
        return f"{self.name + ' = ' if self.name else ''}{kind}({self.index}, {self.dim})"


class _Cursor:
    """Token stream over one string, with error reporting at a token."""

    def __init__(self, source: str):
        self.source = source
        self.tokens = tokenize(source)
        self.k = 0

    @property
    def peek(self) -> Token:
        return self.tokens[self.k]

    def advance(self) -> Token:
        tok = self.tokens[self.k]
        if tok.kind != "end":
            self.k += 1
        return tok

    def error(self, message: str, tok: Token | None = None) -> FormulaSyntaxError:
        tok = tok or self.peek
        return FormulaSyntaxError(message, self.source, tok.pos)

    def at_op(self, text: str) -> bool:
        return self.peek.kind == "op" and self.peek.text == text

    def expect_op(self, text: str) -> Token:
        if not self.at_op(text):
            raise self.error(f"expected {text!r}, found {_describe(self.peek)}")
        return self.advance()

    def expect_end(self):
        if self.peek.kind != "end":
            raise self.error(f"unexpected {_describe(self.peek)} after the end of the formula")

    def integer(self, signed: bool = False, low: int = 0, high: int = MAX_DIM) -> int:
        start = self.peek
        negative = False
        if signed and self.at_op("-"):
            self.advance()
            negative = True
        tok = self.advance()
        if tok.kind != "int":
            raise self.error(f"expected an integer, found {_describe(tok)}", tok)
        value = -int(tok.text) if negative else int(tok.text)
        if not low <= value <= high:
            raise self.error(f"integer {value} out of range [{low}, {high}]", start)
        return value


def _describe(tok: Token) -> str:
    return "the end of the string" if tok.kind == "end" else repr(tok.text)


def _var_spec(cur: _Cursor, kind: str, need_index: bool, position: int | None):
    """After ``Vi`` / ``Vj`` / ``Pm`` / ``Var``: ``(index, dim, cat)`` from the parenthesized ints."""
    open_tok = cur.expect_op("(")
    nums = [cur.integer(high=max(MAX_INDEX, MAX_DIM))]
    while cur.at_op(","):
        cur.advance()
        nums.append(cur.integer(high=max(MAX_INDEX, MAX_DIM)))
    cur.expect_op(")")
    if kind == "Var":
        if len(nums) == 2 and not need_index:
            nums = [None, *nums]
        if len(nums) != 3:
            raise cur.error("Var takes (index, dim, category)", open_tok)
        index, dim, cat_code = nums
        if cat_code not in _KEOPS_CATS:
            raise cur.error(f"Var category must be 0 (i), 1 (j) or 2 (parameter), got {cat_code}",
                            open_tok)
        cat = _KEOPS_CATS[cat_code]
    else:
        cat = _CATS[kind]
        if len(nums) == 2:
            index, dim = nums
        elif len(nums) == 1 and not need_index:
            index, dim = None, nums[0]
        else:
            what = "(index, dim)" if need_index else "(dim) or (index, dim)"
            raise cur.error(f"{kind} takes {what}", open_tok)
    if index is None:
        index = position
    if index is not None and index > MAX_INDEX:
        raise cur.error(f"variable index {index} is larger than {MAX_INDEX}", open_tok)
    if not 1 <= dim <= MAX_DIM:
        raise cur.error(f"variable dimension must be in [1, {MAX_DIM}], got {dim}", open_tok)
    return index, dim, cat


def parse_alias(text: str, position: int | None = None) -> VarDecl:
    """``"x = Vi(3)"``, ``"y = Vj(1, 3)"``, ``"p = Pm(2)"`` or ``"x = Var(0, 3, 0)"`` to a VarDecl.

    Without an explicit index the variable takes ``position`` (its place in the alias list).

    >>> parse_alias("y = Vj(1, 3)")
    VarDecl(name='y', index=1, cat='j', dim=3)
    """
    if not isinstance(text, str):
        raise TypeError(f"an alias must be a string like 'x = Vi(3)', got {type(text).__name__}")
    cur = _Cursor(text)
    name_tok = cur.advance()
    if name_tok.kind != "name":
        raise cur.error(f"expected an alias name, found {_describe(name_tok)}", name_tok)
    _check_alias_name(cur, name_tok)
    cur.expect_op("=")
    kind_tok = cur.advance()
    if kind_tok.kind != "name" or kind_tok.text not in ("Vi", "Vj", "Pm", "Var"):
        raise cur.error(f"expected Vi, Vj, Pm or Var, found {_describe(kind_tok)}", kind_tok)
    index, dim, cat = _var_spec(cur, kind_tok.text, False, position)
    if index is None:
        raise cur.error("this alias has no index (write Vi(index, dim))", kind_tok)
    cur.expect_end()
    return VarDecl(name_tok.text, index, cat, dim)


def _check_alias_name(cur: _Cursor, tok: Token):
    if tok.text in FUNCTIONS or tok.text in _USER_FUNCTIONS or tok.text in ("Var", "Vi", "Vj", "Pm"):
        raise cur.error(f"alias name {tok.text!r} is the name of a function", tok)
    if keyword.iskeyword(tok.text):
        raise cur.error(f"alias name {tok.text!r} is a Python keyword", tok)


class Scope:
    """The variables of one reduction: aliases, then inline ``Var(...)`` met while parsing."""

    def __init__(self, aliases: Sequence[str] = (), bound: dict | None = None):
        if isinstance(aliases, str):
            aliases = [aliases]
        self.bound: dict[str, ir.Node] = dict(bound or {})  # names of given IR nodes
        self.by_name: dict[str, VarDecl] = {}
        self.by_index: dict[int, VarDecl] = {}
        for position, text in enumerate(aliases):
            decl = parse_alias(text, position)
            if decl.name in self.by_name:
                raise ValueError(f"alias {decl.name!r} is defined twice: {aliases!r}")
            if decl.index in self.by_index:
                other = self.by_index[decl.index]
                raise ValueError(
                    f"aliases {other.describe()!r} and {decl.describe()!r} both have index "
                    f"{decl.index} (an alias without an index takes its position in the list)"
                )
            self.by_name[decl.name] = decl
            self.by_index[decl.index] = decl

    def declare_inline(self, cur: _Cursor, tok: Token, index: int, dim: int, cat: str) -> VarDecl:
        known = self.by_index.get(index)
        if known is not None:
            if (known.dim, known.cat) != (dim, cat):
                raise cur.error(f"variable index {index} is already {known.describe()}", tok)
            return known
        decl = VarDecl(None, index, cat, dim)
        self.by_index[index] = decl
        return decl

    def variables(self) -> list[VarDecl]:
        """All variables in index order; indices must be exactly 0 .. n-1."""
        indices = sorted(self.by_index)
        missing = sorted(set(range(len(indices))) - set(indices))
        if missing:
            raise ValueError(
                f"no variable has index {missing[0]} (indices used: {indices}); the variables "
                "are the call's arguments in index order, so indices must be 0, 1, ..., n-1"
            )
        return [self.by_index[k] for k in indices]

    def parse(self, source: str) -> ir.Node:
        return _Parser(source, self).parse()


def apply_function(name: str, operands: Sequence[ir.Node], options: Sequence = (),
                   operator: bool = False) -> ir.Node:
    """``name(*operands, *options)`` as a formula string would build it, on IR operands
    (pykeops's ``LazyTensor.unary``/``binary``/``ternary``). Options are integers, lists of
    integers, IR nodes, or text in formula syntax (``"[2, 3], [2, 2]"``); ``operator=True``
    applies a binary operator (``"+"``, ``"-"``, ``"*"``, ``"/"``, ``"|"``) instead.

    >>> x = ir.var(0, 3, "i")
    >>> apply_function("Extract", [x], [1, 2]).dim, apply_function("|", [x, x], operator=True).dim
    (2, 1)
    """
    bound = {f"_operand{k}": node for k, node in enumerate(operands)}
    if operator:
        if name not in ("+", "-", "*", "/", "|") or len(operands) != 2:
            raise ValueError(f"unknown binary operator {name!r} (expected +, -, *, / or |)")
        return Scope(bound=bound).parse(f"(_operand0 {name} _operand1)")
    if name not in FUNCTIONS and name not in _USER_FUNCTIONS:
        raise ValueError(f"unknown function {name!r}")
    texts = list(bound)
    for k, option in enumerate(options):
        if isinstance(option, ir.Node):
            bound[f"_option{k}"] = option
            texts.append(f"_option{k}")
        elif isinstance(option, (list, tuple)):
            texts.append("[" + ", ".join(str(int(v)) for v in option) + "]")
        elif isinstance(option, str):
            texts.append(option)
        elif isinstance(option, numbers.Integral) and not isinstance(option, bool):
            texts.append(str(int(option)))
        else:
            raise ValueError(f"{name}: option {option!r} is not an integer, a list of integers "
                             "or a formula")
    return Scope(bound=bound).parse(f"{name}({', '.join(texts)})")


def parse(formula: str, aliases: Sequence[str] = ()) -> tuple[ir.Node, list[VarDecl]]:
    """Formula string and aliases to ``(IR node, variables in index order)``."""
    scope = Scope(aliases)
    node = scope.parse(formula)
    return node, scope.variables()


# ---------------------------------------------------------------------------- the parser


class _Parser:
    def __init__(self, source: str, scope: Scope):
        self.cur = _Cursor(source)
        self.scope = scope
        self.depth = 0

    def parse(self) -> ir.Node:
        if self.cur.peek.kind == "end":
            raise self.cur.error("empty formula")
        node = self.formula()
        self.cur.expect_end()
        return node

    def _enter(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.cur.error(f"formula nested deeper than {MAX_DEPTH} levels")

    def build(self, tok: Token, fn, *args) -> ir.Node:
        """Run a node builder, reporting its errors (dimensions, ranges) at ``tok``."""
        try:
            return fn(*args)
        except FormulaSyntaxError:
            raise
        except (ValueError, ZeroDivisionError, OverflowError) as e:
            raise self.cur.error(str(e), tok) from None

    def formula(self) -> ir.Node:
        left = self.additive()
        while self.cur.at_op("|"):
            tok = self.cur.advance()
            left = self.build(tok, compositions.dot, left, self.additive())
        return left

    def additive(self) -> ir.Node:
        left = self.term()
        while self.cur.at_op("+") or self.cur.at_op("-"):
            tok = self.cur.advance()
            name = "add" if tok.text == "+" else "sub"
            left = self.build(tok, ops.apply, name, left, self.term())
        return left

    def term(self) -> ir.Node:
        left = self.unary()
        while self.cur.at_op("*") or self.cur.at_op("/"):
            tok = self.cur.advance()
            name = "mul" if tok.text == "*" else "div"
            left = self.build(tok, ops.apply, name, left, self.unary())
        return left

    def unary(self) -> ir.Node:
        if self.cur.at_op("-") or self.cur.at_op("+"):
            tok = self.cur.advance()
            self._enter()
            operand = self.unary()
            self.depth -= 1
            if tok.text == "+":
                return operand
            if operand.op == "const":  # a negative literal stays a literal
                return ir.const([-v for v in operand.params])
            return self.build(tok, ops.apply, "neg", operand)
        return self.primary()

    def primary(self) -> ir.Node:
        cur = self.cur
        tok = cur.advance()
        if tok.kind == "int":
            return self.build(tok, lambda: ir.const(float(int(tok.text))))
        if tok.kind == "float":
            return self.build(tok, lambda: ir.const(float(tok.text)))
        if tok.kind == "op" and tok.text == "(":
            self._enter()
            node = self.formula()
            cur.expect_op(")")
            self.depth -= 1
            return node
        if tok.kind == "name":
            if cur.at_op("("):
                self._enter()
                node = self.call(tok)
                self.depth -= 1
                return node
            if tok.text in self.scope.bound:
                return self.scope.bound[tok.text]
            decl = self.scope.by_name.get(tok.text)
            if decl is None:
                raise cur.error(self._unknown(tok.text, "name"), tok)
            return decl.node
        raise cur.error(f"expected a number, a name or '(', found {_describe(tok)}", tok)

    def _unknown(self, name: str, what: str) -> str:
        if what == "name" and (name in FUNCTIONS or name in _USER_FUNCTIONS):
            return f"{name} is a function: call it as {name}(...)"
        if what == "function" and name in self.scope.by_name:
            return f"{name!r} is a variable, not a function"
        pool = list(self.scope.by_name) if what == "name" else [*FUNCTIONS, *_USER_FUNCTIONS]
        close = difflib.get_close_matches(name, pool, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        known = f"; aliases: {', '.join(self.scope.by_name) or 'none'}" if what == "name" else ""
        return f"unknown {what} {name!r}{hint}{known}"

    def variable(self) -> ir.Node:
        """A variable argument: an alias name or an inline Var/Vi/Vj/Pm(index, ...)."""
        cur = self.cur
        tok = cur.advance()
        if tok.kind == "name" and tok.text in ("Var", "Vi", "Vj", "Pm") and cur.at_op("("):
            index, dim, cat = _var_spec(cur, tok.text, True, None)
            return self.scope.declare_inline(cur, tok, index, dim, cat).node
        if tok.kind == "name" and not cur.at_op("(") and tok.text in self.scope.bound:
            return self.scope.bound[tok.text]
        if tok.kind == "name" and not cur.at_op("("):
            decl = self.scope.by_name.get(tok.text)
            if decl is not None:
                return decl.node
            raise cur.error(self._unknown(tok.text, "name"), tok)
        raise cur.error(f"expected a variable (an alias or Var(...)), found {_describe(tok)}", tok)

    def index_tuple(self) -> tuple:
        """``[2, 3]`` or ``[]`` (KeOps's syntax), ``Ind(2, 3)``, ``(2, 3)``, ``(1,)`` or a
        single integer: a tuple of ints >= 0."""
        cur = self.cur
        if cur.peek.kind == "int":
            return (cur.integer(),)
        if cur.peek.kind == "name" and cur.peek.text == "Ind":
            cur.advance()
        close = "]" if cur.at_op("[") else ")"
        cur.expect_op("[" if close == "]" else "(")
        values = []
        while not cur.at_op(close):
            values.append(cur.integer())
            if len(values) > 64:
                raise cur.error("a list of more than 64 integers")
            if not cur.at_op(","):
                break
            cur.advance()
        cur.expect_op(close)
        return tuple(values)

    def call(self, name_tok: Token) -> ir.Node:
        cur, name = self.cur, name_tok.text
        if name in ("Var", "Vi", "Vj", "Pm"):
            index, dim, cat = _var_spec(cur, name, True, None)
            return self.scope.declare_inline(cur, name_tok, index, dim, cat).node
        spec = FUNCTIONS.get(name) or _USER_FUNCTIONS.get(name)
        if spec is None:
            raise cur.error(self._unknown(name, "function"), name_tok)
        kinds, builder = spec
        required, _, optional = kinds.partition("?")  # arguments after "?" may be left out
        kinds = required + optional
        cur.expect_op("(")
        args = []
        for k, kind in enumerate(kinds):
            if k:
                if cur.at_op(")") and k >= len(required):
                    break
                if cur.at_op(")"):
                    raise cur.error(f"{name} takes {len(kinds)} arguments, got {k}")
                cur.expect_op(",")
            if kind == "f":
                args.append(self.formula())
            elif kind == "v":
                args.append(self.variable())
            elif kind == "n":
                args.append(cur.integer())
            elif kind == "t":
                args.append(self.index_tuple())
            else:  # "z": a signed integer
                args.append(cur.integer(signed=True, low=-MAX_INT, high=MAX_INT))
        if cur.at_op(","):
            raise cur.error(f"{name} takes {len(kinds)} argument{'s' * (len(kinds) != 1)}")
        cur.expect_op(")")
        return self.build(name_tok, builder, *args)


# ---------------------------------------------------------------------------- functions


def _a(name, *args, params=()):
    return ops.apply(name, *args, params=params)


def _int_inv(n):
    if n == 0:
        raise ValueError("IntInv(0): division by zero")
    return ir.const(1.0 / n)


def _grad(f, v, g):
    from . import diff

    if g.dim != f.dim:
        raise ValueError(f"Grad: the gradient input has dimension {g.dim}, the formula {f.dim}")
    return diff.vjp(f, [v], g)[v]


# (argument kinds: "f" formula, "v" variable, "n" int >= 0, "z" int, "t" tuple of ints
# written [2, 3] (as KeOps), Ind(2, 3) or (2, 3); kinds after a "?" are optional; builder)
FunctionSpec = tuple


def _registry_functions() -> dict[str, FunctionSpec]:
    """``Name(f, ...)`` for every op whose record gives it a formula-string name."""
    out = {}
    for opdef in ops.REGISTRY.values():
        for name in opdef.keops:
            out[name] = ("f" * opdef.arity, lambda *a, _op=opdef.name: ops.apply(_op, *a))
    return out


FUNCTIONS: dict[str, FunctionSpec] = {
    **_registry_functions(),
    "IntCst": ("z", lambda n: ir.const(float(n))),
    "IntInv": ("z", _int_inv),
    "Zero": ("n", lambda d: ir.const([0.0] * d)),
    "Pow": ("fz", compositions.power),
    "Powf": ("ff", compositions.powf),
    "ClampInt": ("fzz", lambda f, a, b: _a("clamp", f, ir.const(float(a)), ir.const(float(b)))),
    "Mod": ("fff", compositions.mod),
    "Round": ("fz", compositions.round_to),
    "SqNorm2": ("f", compositions.sqnorm2),
    "Norm2": ("f", compositions.norm2),
    "Normalize": ("f", compositions.normalize),
    "SqDist": ("ff", compositions.sqdist),
    "Scalprod": ("ff", compositions.dot),
    "WeightedSqNorm": ("ff", compositions.weightedsqnorm),
    "WeightedSqDist": ("fff", compositions.weightedsqdist),
    "SumT": ("fn", lambda f, d: _a("expand", f, params=(d,))),
    "Elem": ("fn", lambda f, k: _a("slice", f, params=(k, 1))),
    "Extract": ("fnn", lambda f, start, n: _a("slice", f, params=(start, n))),
    "OneHot": ("fn", lambda f, d: _a("one_hot", f, params=(d,))),
    "Kron": ("fftt", compositions.kron),
    "TensorDot": ("fftttt?t", compositions.tensordot),
    "BSpline": ("ffn", compositions.bspline),
    "SoftDTW_SqDist": ("fff", compositions.softdtw_sqdist),
    "Grad": ("fvf", _grad),
}

_USER_FUNCTIONS: dict[str, FunctionSpec] = {}


def register_function(name: str, arity: int, builder: Callable) -> None:
    """Make ``name(f1, ..., f_arity)`` usable in formula strings (user-defined ops).

    >>> register_function("Twice", 1, lambda a: ops.apply("add", a, a))
    >>> parse("Twice(x)", ["x = Vi(2)"])[0].op
    'add'
    """
    if not (name.isidentifier() and name.isascii()) or keyword.iskeyword(name):
        raise ValueError(f"{name!r} is not a valid function name (letters, digits, _)")
    if name in FUNCTIONS or name in ("Var", "Vi", "Vj", "Pm"):
        raise ValueError(f"{name!r} is a built-in formula function")
    _USER_FUNCTIONS[name] = ("f" * int(arity), builder)
