"""Sums of vector-valued terms as weighted sums of vectors.

A CPU kernel vectorizes a formula across j when its terms are narrow; a term of a large
dimension E (``K @ V`` with 64 columns, the gradient of a kernel in dimension 64) is
evaluated pair by pair instead, E operations each, in loops along the vector. Most such
terms are linear combinations of scalar weights and vectors that do not depend on both
i and j:

- ``K @ V``: ``k_ij V_j``;
- a gradient in x: ``c_ij (x_i - y_j) = c_ij x_i - c_ij y_j``.

:func:`linearize` writes ``F_ij = Σ_t coef_t s_t(i, j) L_t + (narrow components)`` with
scalar weights ``s_t`` and factors ``L_t`` that are either free of j (computed once per
row) or a j-variable, so that

    ``Σ_j F_ij = Σ_t coef_t (L_t(i) Σ_j s_t  +  Σ_j s_t B_t(j))``

where the first sums are narrow (vectorized across j like any scalar formula) and the
second a product of the (rows × j) matrix of weights with the (j × E) matrix of B: a
kernel accumulates it with the vector along E and the weight broadcast. The formula
dimension the pair loop sees drops from E to the number of distinct weights.

The thresholds (which formulas are wide, how many weights the pair loop may carry, which
dot products a gradient distributes) are the backend's: every pass here takes its
:class:`~lazytensor.codegen.tuning.Tuning` and imports no backend.

>>> from lazytensor.codegen import ir, ops
>>> from lazytensor.codegen.tuning import Tuning
>>> tuning = Tuning(wide=16, dot_min_dim=16, max_dot_dim=4096)
>>> x, y, v = ir.var(0, 3, "i"), ir.var(1, 3, "j"), ir.var(2, 64, "j")
>>> k = ops.apply("exp", ops.apply("neg", ops.apply("sum", ops.apply("square", ops.apply("sub", x, y)))))
>>> lin = linearize(ops.apply("mul", k, v), tuning)
>>> lin.narrow.dim, [(t.weight, t.factor.index, t.offset, t.coef) for t in lin.col_terms]
(1, [(0, 2, 0, 1.0)])
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ir, ops, reductions
from .simplify import distribute_dots, simplify
from .tuning import Tuning


@dataclass(frozen=True)
class Term:
    """``coef * s_weight(i, j) * factor`` added to output components [offset, offset + dim)."""

    weight: int  # component of ``Linear.narrow``
    factor: ir.Node  # free of j (row term), or a j-variable or a slice of one (column term)
    offset: int
    coef: float

    @property
    def dim(self) -> int:
        return self.factor.dim


@dataclass(frozen=True)
class Linear:
    narrow: ir.Node  # the weights, then the direct components: what the pair loop sums
    row_terms: tuple  # Terms whose factor is free of j
    col_terms: tuple  # Terms whose factor is a j-variable
    direct: tuple  # (component of narrow, output component): scalars summed as they are
    dim: int  # the formula's dimension
    components: tuple = ()  # narrow's components, one node each

    @property
    def n_weights(self) -> int:
        return self.narrow.dim - len(self.direct)


def is_column(node: ir.Node) -> bool:
    """A factor read from a j-variable's rows: the variable, or a slice of it."""
    if node.op == "slice":
        node = node.args[0]
    return node.op == "var" and node.cat == "j"


def column_source(node: ir.Node) -> tuple:
    """(variable index, first component, row length) of a column factor."""
    if node.op == "slice":
        return node.args[0].index, node.params[0], node.args[0].dim
    return node.index, 0, node.dim


def _pieces(node: ir.Node, offset: int = 0):
    """(offset, node) of the components a concat tree puts side by side."""
    if node.op == "concat":
        a, b = node.args
        yield from _pieces(a, offset)
        yield from _pieces(b, offset + a.dim)
    else:
        yield offset, node


def _has_j(node: ir.Node, memo: dict) -> bool:
    key = id(node)
    if key not in memo:
        if node.op == "var":
            memo[key] = node.cat == "j"
        else:
            memo[key] = any(_has_j(a, memo) for a in node.args)
    return memo[key]


_ONE = ir.const(1.0)  # the weight of a factor taken as it is


def _scale(terms, s: ir.Node, sign: float = 1.0):
    """Terms multiplied by the scalar ``s``."""
    out = []
    for w, f, c in terms:
        w2 = s if w is _ONE else (w if s is _ONE else ops.apply("mul", s, w))
        out.append((w2, f, c * sign))
    return out


def _lin(node: ir.Node, memo: dict, depth: int = 0):
    """[(scalar weight, factor, coef)] with node = Σ coef * weight * factor, or None."""
    if depth > 64:
        return None
    if not _has_j(node, memo):
        return [(_ONE, node, 1.0)]
    op = node.op
    if is_column(node):  # a j-variable, or a slice of one
        return [(_ONE, node, 1.0)]
    if op == "neg":
        inner = _lin(node.args[0], memo, depth + 1)
        return None if inner is None else [(w, f, -c) for w, f, c in inner]
    if op in ("add", "sub"):
        a, b = node.args
        if a.dim != node.dim or b.dim != node.dim:
            return None  # a broadcast scalar added to a vector: not a weighted vector
        la, lb = _lin(a, memo, depth + 1), _lin(b, memo, depth + 1)
        if la is None or lb is None:
            return None
        return la + (lb if op == "add" else [(w, f, -c) for w, f, c in lb])
    if op == "mul":
        a, b = node.args
        for s, v in ((a, b), (b, a)):
            if s.dim == 1 and v.dim == node.dim:
                inner = _lin(v, memo, depth + 1)
                return None if inner is None else _scale(inner, s)
            if s.op == "expand" and s.args[0].dim == 1 and v.dim == node.dim:
                inner = _lin(v, memo, depth + 1)
                return None if inner is None else _scale(inner, s.args[0])
        return None
    if op == "div":
        a, b = node.args
        if b.dim == 1 and a.dim == node.dim:
            inner = _lin(a, memo, depth + 1)
            return None if inner is None else _scale(inner, ops.apply("inv", b))
        return None
    if op == "expand" and node.args[0].dim == 1:  # s * (1, ..., 1)
        return [(node.args[0], ir.const([1.0] * node.dim), 1.0)]
    return None


def linearize(formula: ir.Node, tuning: Tuning, max_narrow: int | None = None) -> Linear | None:
    """The weighted-sum form of ``formula`` (see the module docstring), or None when it
    does not pay: narrow formulas (up to ``tuning.wide`` components: they vectorize across
    j as they are), terms that are not linear in vectors free of i or of j, no j-variable
    factor, or more than ``max_narrow`` (default ``tuning.wide``) weights and direct
    components."""
    if max_narrow is None:
        max_narrow = tuning.wide
    if formula.dim <= tuning.wide:
        return None
    memo: dict = {}
    weights: dict = {}  # weight node -> component
    grouped: dict = {}  # (factor node, offset) -> {weight node: coef}
    direct_nodes = []
    for offset, piece in _pieces(formula):
        if piece.dim == 1:
            direct_nodes.append((offset, piece))
            continue
        terms = _lin(piece, memo)
        if terms is None:
            return None
        for w, f, c in terms:
            if not (is_column(f) or not _has_j(f, memo)):
                return None
            if f.op == "const" and not any(f.params):
                continue  # a zero vector (split_rows leaves them where only row terms were)
            w = simplify(w)
            by_weight = grouped.setdefault((f, offset), {})
            by_weight[w] = by_weight.get(w, 0.0) + c
    if not any(is_column(f) for (f, _) in grouped):
        return None
    row_terms, col_terms = [], []
    for (f, offset), by_weight in grouped.items():
        by_weight = {w: c for w, c in by_weight.items() if c != 0.0}
        if not by_weight:
            continue
        if len(by_weight) == 1:  # one weight (c x_i - c y_j, k_ij V_j): keep it, with its coef
            (w, c), = by_weight.items()
        else:  # one factor, several weights: one weight Σ c_t s_t, so one product per factor
            w, c = None, 1.0
            for wt, ct in by_weight.items():
                scaled = wt if ct == 1.0 else ops.apply("mul", ir.const(ct), wt)
                w = scaled if w is None else ops.apply("add", w, scaled)
            w = simplify(w)
        if w not in weights:
            weights[w] = len(weights)
        t = Term(weights[w], f, offset, c)
        (col_terms if is_column(f) else row_terms).append(t)
    comps = list(weights) + [p for _, p in direct_nodes]
    if len(comps) > max_narrow or not col_terms:
        return None
    direct = tuple((len(weights) + k, off) for k, (off, _) in enumerate(direct_nodes))
    narrow = comps[0]
    for c in comps[1:]:
        narrow = ops.apply("concat", narrow, c)
    return Linear(narrow, tuple(row_terms), tuple(col_terms), direct, formula.dim, tuple(comps))


def wide_sum(formula: ir.Node, reduction: str, tuning: Tuning) -> Linear | None:
    """The weighted-sum form a kernel of the backend tuned by ``tuning`` can use, or None:
    a Sum (or a softmax-weighted sum / weighted log-sum-exp, whose weight is the wide part:
    the reductions whose ``wide`` is "sum" or "softmax") whose wide terms are all weights
    times j-variables (row terms are split off before, by the caller)."""
    wide = reductions.get(reduction).wide
    if wide is None or formula.dim <= tuning.wide:
        return None
    lin = linearize(formula, tuning)
    if lin is None or lin.row_terms or not lin.col_terms:
        return None
    if wide == "softmax" and not any(off == 0 for _, off in lin.direct):
        return None  # the scalar f (component 0) must be one of the narrow components
    return lin


@dataclass(frozen=True)
class RowSplit:
    """``Σ_j F = (Σ_j G)[:, :F.dim] + Σ_t coef_t L_t(i) (Σ_j G)[:, weight_t]`` at the terms'
    offsets: ``G`` has no row terms left (its sums run as weighted sums of j-vectors)."""

    G: ir.Node
    terms: tuple  # Terms whose ``weight`` is a component of G (>= F.dim) and factor free of j
    dim: int


def split_rows(formula: ir.Node, tuning: Tuning) -> RowSplit | None:
    """Move the row terms ``coef s(i, j) L(i)`` of a wide formula out of the pair loop: the
    kernel sums the weights ``s`` (one more component each), the caller multiplies by
    ``L(i)`` once per row. None when the formula has no row terms (or is not linear)."""
    lin = linearize(formula, tuning)
    if lin is None or not lin.row_terms:
        return None
    comps = lin.components
    direct = {off: comps[q] for q, off in lin.direct}
    regions = []
    for offset, piece in _pieces(formula):
        if piece.dim == 1:
            regions.append(direct[offset])
            continue
        acc = None
        for t in lin.col_terms:
            if t.offset == offset:
                w = comps[t.weight]
                if t.coef != 1.0:
                    w = ops.apply("mul", ir.const(t.coef), w)
                term = ops.apply("mul", w, t.factor)
                acc = term if acc is None else ops.apply("add", acc, term)
        regions.append(acc if acc is not None else ir.const([0.0] * piece.dim))
    weights = sorted({t.weight for t in lin.row_terms})
    index = {w: formula.dim + k for k, w in enumerate(weights)}
    G = regions[0]
    for r in regions[1:] + [comps[w] for w in weights]:
        G = ops.apply("concat", G, r)
    terms = tuple(Term(index[t.weight], t.factor, t.offset, t.coef) for t in lin.row_terms)
    return RowSplit(G, terms, formula.dim)


@dataclass(frozen=True)
class GradientForm:
    """A gradient Sum in the form its kernel runs fastest (see :func:`plan_gradient_sum`):
    the ``formula`` the kernel sums, reading the ``hoisted`` values (j-only, computed once
    per j before the kernel) as j-variables numbered from ``n_vars``; and the row terms
    ``split`` off it (multiplied in after the kernel), or None."""

    formula: ir.Node
    hoisted: tuple
    split: RowSplit | None


def plan_gradient_sum(formula: ir.Node, n_vars: int, tuning: Tuning) -> GradientForm:
    """The structure of a gradient formula, worked out once per formula (no arrays), for a
    backend tuned by ``tuning``.

    ``⟨g_j, v_i - out_j⟩`` is first written ``⟨g_j, v_i⟩ - ⟨g_j, out_j⟩``; then narrow
    values of the reduced side alone that read wide vectors of several j-variables (the
    second term, in the i-side gradient of a softmax-weighted sum) are hoisted: in the
    pair loop they would cost a wide loop per pair (the CPU plan hoists values of one
    j-variable itself). Then the row terms are split off (:func:`split_rows`).

    >>> x, y = ir.var(0, 3, "i"), ir.var(1, 3, "j")
    >>> plan_gradient_sum(ops.apply("mul", x, y), 2, Tuning(16, 16, 4096)).hoisted
    ()
    """
    formula = distribute_dots(formula, tuning.dot_min_dim, tuning.max_dot_dim)
    wide = tuning.wide
    info: dict = {}  # node -> (reads only j-variables, widest vector read, variables read)
    for n in ir.topo_order(formula):
        if n.op == "var":
            info[n] = (n.cat == "j", n.dim, frozenset((n.index,)))
        elif n.op == "const":
            info[n] = (True, 0, frozenset())
        else:
            parts = [info[a] for a in n.args]
            info[n] = (all(p[0] for p in parts), max(p[1] for p in parts),
                       frozenset().union(*(p[2] for p in parts)))
    hoisted: dict = {}  # the topmost such values, in a fixed order
    stack, seen = [formula], set()
    while stack:
        n = stack.pop()
        if n in seen or n.op in ("var", "const"):
            continue
        seen.add(n)
        only_j, widest, used = info[n]
        if only_j and n.dim <= wide and widest > wide and len(used) >= 2:
            hoisted[n] = None
            continue
        stack.extend(n.args)
    if hoisted:
        formula = ir.substitute(formula, {n: ir.var(n_vars + k, n.dim, "j")
                                          for k, n in enumerate(hoisted)})
    return GradientForm(formula, tuple(hoisted), split_rows(formula, tuning))
