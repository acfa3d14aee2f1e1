"""The CPU kernel's plan: IR rewrites that move work out of the pair loop.

The pair loop of the CPU kernel runs N×M times; anything in it that does not depend on
both i and j is work done M (or N) times too often. :func:`plan_cpu` rewrites a formula
into an equivalent one whose pair loop reads precomputed values:

- **dot tiling** -- ``Σ_k A_i[k] B_j[k]`` with ``D >= DOT_MIN_DIM`` (A depending on i and
  parameters only, B on one j-variable only) becomes a pseudo-variable filled, for a
  block of rows × a tile of j, by a register-tiled small matrix product; and so does
  ``|A_i - B_j|²``, as ``max(|A_i|² + |B_j|² - 2⟨A_i, B_j⟩, 0)``. That form loses the
  digits that ``|A|² + |B|²`` has beyond ``|A - B|²``, so the kernel recomputes directly
  the pairs where ``|A - B|² < (|A|² + |B|²) / 16`` (near-duplicates, the diagonal of a
  self-kernel): elsewhere the relative error stays within ~32 ulps. The norms are summed
  in double (a norm's rounding is shared by a whole row or column of pairs, where the
  product's is not) and the terms combined as ``(min - 2⟨A, B⟩) + max`` of the two norms
  (:mod:`lazytensor.codegen.cpu.gemm`). Only for D this large does the product beat the
  direct loop.
- **columns** -- a costly expression of one j-variable alone (``|B_j|²``) is computed
  once per j before the pair loop and stored like a j-variable.
- **rows** -- every maximal subexpression free of j (``|A_i|²``, ``1/σ²``) is computed
  once per row before the pair loop.
- **reciprocals** -- ``a / b`` with b free of j becomes ``a * (1/b)`` (``1/b`` is then a row
  value): a multiply instead of a divide per pair, at most one more ulp.

Pseudo-variables get indices after the formula's own variables; rows are category
``"i"``, columns and dot products category ``"j"``.

>>> from lazytensor.codegen import ir, ops
>>> x, y = ir.var(0, 32, "i"), ir.var(1, 32, "j")
>>> d = ops.apply("sum", ops.apply("square", ops.apply("sub", x, y)))
>>> plan = plan_cpu(ops.apply("exp", ops.apply("neg", d)), 2)
>>> [len(plan.dots), len(plan.rows), len(plan.cols)]
[1, 0, 1]
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import ir, ops
from ..simplify import distribute_dots
from . import DOT_MIN_DIM, MAX_DOT_DIM, dot_tiling_enabled

COL_MIN_COST = 16  # per-pair operations saved before a column is worth its memory
MAX_ROW_VALUES = 2048  # per-row scalars kept on the stack (per row of a row block)
MAX_COL_DIM = 8


@dataclass(frozen=True)
class Derived:
    """A pseudo-variable computed from the formula's variables before the pair loop."""

    var: ir.Node  # the pseudo-variable as it appears in the planned formula
    node: ir.Node  # its value, in the formula's own variables
    source: int = -1  # columns: index of the one j-variable it is computed from


@dataclass(frozen=True)
class Dot:
    """``⟨A_i, B_j⟩`` (kind "dot") or ``|A_i - B_j|²`` (kind "sqdist") for a block of rows
    and a tile of j, through a small matrix product."""

    var: ir.Node  # pseudo-variable (dimension 1, category "j") holding the value
    a: ir.Node  # i-side operand: an i-variable, or a row value's node
    b: int  # index of the j-side operand's column-major data (a j-variable or a column)
    dim: int
    kind: str = "dot"
    norm_b: int = -1  # sqdist: index of the column |B_j|²


@dataclass(frozen=True)
class LoopForm:
    formula: ir.Node
    rows: tuple  # of Derived, category "i"
    cols: tuple  # of Derived, category "j"
    dots: tuple  # of Dot

    @property
    def pseudo(self) -> tuple:
        return tuple(d.var for d in self.rows + self.cols) + tuple(d.var for d in self.dots)


def _deps(root: ir.Node) -> dict:
    """id(node) -> frozenset of the variables (nodes) it depends on."""
    out: dict[int, frozenset] = {}
    for n in ir.topo_order(root):
        if n.op == "var":
            out[id(n)] = frozenset((n,))
        else:
            s = frozenset()
            for a in n.args:
                s |= out[id(a)]
            out[id(n)] = s
    return out


def _cats(deps: frozenset) -> set:
    return {v.cat for v in deps}


def _cost(root: ir.Node) -> int:
    """Rough count of scalar operations to evaluate ``root`` once."""
    return sum(max([n.dim] + [a.dim for a in n.args]) for n in ir.topo_order(root)
               if n.op not in ("var", "const"))


class _Builder:
    def __init__(self, formula: ir.Node, n_vars: int):
        self.formula = formula
        self.next_index = max([v.index + 1 for v in ir.variables(formula)] + [n_vars])
        self.rows: list[Derived] = []
        self.cols: list[Derived] = []
        self.dots: list[Dot] = []
        self.col_of: dict = {}  # node -> column Derived

    def new_var(self, dim: int, cat: str) -> ir.Node:
        v = ir.var(self.next_index, dim, cat)
        self.next_index += 1
        return v

    def column(self, node: ir.Node, source: ir.Node) -> Derived:
        if node.op == "var":
            raise AssertionError("a variable is its own column")
        d = self.col_of.get(node)
        if d is None:
            d = Derived(self.new_var(node.dim, "j"), node, source.index)
            self.cols.append(d)
            self.col_of[node] = d
        return d


def _single_j_var(deps: frozenset):
    """The one j-variable of a j-only expression without parameters, else None."""
    if len(deps) == 1:
        (v,) = deps
        if v.cat == "j":
            return v
    return None


def _dot_operands(node: ir.Node, deps: dict):
    """(kind, A, B) when ``node`` is ⟨A_i, B_j⟩ or |A_i - B_j|² of a large dimension."""
    if node.op != "sum" or not DOT_MIN_DIM <= node.args[0].dim <= MAX_DOT_DIM:
        return None
    m = node.args[0]
    pair, kind = None, None
    square_of_sub = bool(m.args) and m.args[0].op == "sub" and (
        m.op == "square" or (m.op == "mul" and m.args[0] is m.args[1]))
    if square_of_sub:
        pair, kind = m.args[0].args, "sqdist"
    elif m.op == "mul":
        pair, kind = m.args, "dot"
    if pair is None or pair[0].dim != pair[1].dim:
        return None
    p, q = pair
    for a, b in ((p, q), (q, p)):
        ca = _cats(deps[id(a)])
        if ("j" not in ca and "i" in ca and _single_j_var(deps[id(b)]) is not None
                and (a.op == "var" or a.dim <= MAX_ROW_VALUES // 2)):
            return kind, a, b
    return None


def _rewrite_dots(b: _Builder, formula: ir.Node) -> ir.Node:
    formula = distribute_dots(formula, DOT_MIN_DIM, MAX_DOT_DIM)
    deps = _deps(formula)
    mapping = {}
    for node in ir.topo_order(formula):
        found = _dot_operands(node, deps)
        if found is None:
            continue
        kind, a, bnode = found
        src = _single_j_var(deps[id(bnode)])
        b_index = bnode.index if bnode.op == "var" else b.column(bnode, src).var.index
        g = b.new_var(1, "j")
        norm_b = -1
        if kind == "sqdist":
            norm_b = b.column(ops.apply("sum", ops.apply("mul", bnode, bnode)), src).var.index
        b.dots.append(Dot(g, a, b_index, a.dim, kind, norm_b))
        mapping[node] = g
    return ir.substitute(formula, mapping) if mapping else formula


def _top_down(root: ir.Node, take) -> dict:
    """{node: replacement} for the topmost nodes where ``take(node)`` gives one.

    Each node is looked at once (a DAG with shared subterms is not walked as a tree) and
    without recursion (formulas can be thousands of nodes deep).
    """
    mapping: dict = {}
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen or node.op in ("var", "const"):
            continue
        seen.add(id(node))
        new = take(node)
        if new is not None:
            mapping[node] = new
        else:
            stack.extend(node.args)
    return mapping


def _rewrite_columns(b: _Builder, formula: ir.Node) -> ir.Node:
    deps = _deps(formula)

    def take(node):
        src = _single_j_var(deps[id(node)])
        if (src is not None and node.dim <= MAX_COL_DIM and not _is_pseudo(b, src)
                and _cost(node) >= COL_MIN_COST):
            return b.column(node, src).var
        return None

    mapping = _top_down(formula, take)
    return ir.substitute(formula, mapping) if mapping else formula


def _is_pseudo(b: _Builder, v: ir.Node) -> bool:
    return any(v is d.var for d in b.dots) or any(v is d.var for d in b.cols)


def _rewrite_reciprocals(formula: ir.Node) -> ir.Node:
    deps = _deps(formula)

    def fn(node, args):
        if node.op == "div" and "j" not in _cats(deps[id(node.args[1])]):
            return ops.apply("mul", args[0], ops.apply("inv", args[1]))
        if args == node.args:
            return node
        return ir.make(node.op, args, node.params, node.dim)

    return ir.rebuild(formula, fn)


def _rewrite_rows(b: _Builder, formula: ir.Node) -> ir.Node:
    deps = _deps(formula)
    budget = [MAX_ROW_VALUES - sum(d.node.dim for d in b.rows)]

    def take(node):
        if "j" in _cats(deps[id(node)]) or node.dim > budget[0]:
            return None
        v = b.new_var(node.dim, "i")
        b.rows.append(Derived(v, node))
        budget[0] -= node.dim
        return v

    mapping = _top_down(formula, take)
    return ir.substitute(formula, mapping) if mapping else formula


def plan_cpu(formula: ir.Node, n_vars: int, dot_tiling: bool | None = None) -> LoopForm:
    """The planned formula and its pseudo-variables (see the module docstring).

    ``n_vars`` is the number of bound variables (pseudo-variables are numbered after).
    """
    if dot_tiling is None:
        dot_tiling = dot_tiling_enabled()
    b = _Builder(formula, n_vars)
    f = _rewrite_dots(b, formula) if dot_tiling else formula
    f = _rewrite_columns(b, f)
    f = _rewrite_reciprocals(f)
    # dot operands that are expressions are row values too (the product reads them per row)
    for dot in b.dots:
        if dot.a.op != "var":
            b.rows.append(Derived(b.new_var(dot.a.dim, "i"), dot.a))
    f = _rewrite_rows(b, f)
    return LoopForm(f, tuple(b.rows), tuple(b.cols), tuple(b.dots))
