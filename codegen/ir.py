"""The formula IR: frozen, hash-consed nodes with a structural sha256 key.

A node is ``Node(op, args, params, dim)``:

- ``op == "var"``: a variable; ``params == (index, cat)`` with ``cat`` in ``"i"``, ``"j"``,
  ``"p"`` (i-indexed, j-indexed, parameter). ``dim`` is its vector dimension.
- ``op == "const"``: a constant vector; ``params`` holds its float values.
- any other ``op``: an entry of :mod:`lazytensor.codegen.ops`; ``params`` are its static arguments.

Identical nodes are the same object (hash-consing), so structural equality is identity
and common subterms are shared for free.

>>> x = var(0, 3, "i"); y = var(1, 3, "j")
>>> (x is var(0, 3, "i"), x.dim, y.cat)
(True, 3, 'j')
"""

from __future__ import annotations

import hashlib
import os
import threading
import weakref
from collections.abc import Iterable, Iterator

CATS = ("i", "j", "p")


class Node:
    """An immutable IR node; build with :func:`make`, :func:`var`, :func:`const`."""

    __slots__ = ("__weakref__", "args", "dim", "key", "op", "params")

    op: str
    args: tuple[Node, ...]
    params: tuple
    dim: int
    key: str

    def __setattr__(self, name, value):
        raise AttributeError("IR nodes are immutable")

    def __reduce__(self):
        return (make, (self.op, self.args, self.params, self.dim))

    def __repr__(self) -> str:
        return to_text(self)

    # Structural identity is object identity thanks to hash-consing.
    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other) -> bool:
        return self is other

    @property
    def is_var(self) -> bool:
        return self.op == "var"

    @property
    def is_const(self) -> bool:
        return self.op == "const"

    @property
    def index(self) -> int:
        assert self.op == "var"
        return self.params[0]

    @property
    def cat(self) -> str:
        assert self.op == "var"
        return self.params[1]


_table: weakref.WeakValueDictionary[tuple, Node] = weakref.WeakValueDictionary()
_table_lock = threading.Lock()


def _reset_in_child() -> None:
    # another thread may have held the lock at fork time: it would stay held in the child
    global _table_lock
    _table_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)


def _canon_param(p):
    """Params must be hashable and print deterministically; floats keep full precision."""
    if isinstance(p, bool):
        return p
    if isinstance(p, int):
        return int(p)
    if isinstance(p, float):
        return float(p)
    if isinstance(p, str):
        return p
    if isinstance(p, (tuple, list)):
        return tuple(_canon_param(q) for q in p)
    if hasattr(p, "item"):  # numpy scalar
        return _canon_param(p.item())
    raise TypeError(f"unsupported IR parameter {p!r} of type {type(p).__name__}")


def _param_text(p) -> str:
    if isinstance(p, float):
        return float.hex(p)
    if isinstance(p, tuple):
        return "(" + ",".join(_param_text(q) for q in p) + ")"
    return repr(p)


def make(op: str, args: Iterable[Node] = (), params: Iterable = (), dim: int = 1) -> Node:
    """Return the unique node with this structure (creating it if needed)."""
    return interner.node(op, tuple(args), params, dim)


class Interner:
    """The table of nodes and the rewrites of whole formulas, behind methods that a tracer
    running the construction of formulas (torch dynamo, :mod:`lazytensor.integrations.torch_library`)
    calls as they are (the table's lock and hashing, walks keyed by ``id``) rather than
    tracing through them."""

    def node(self, op: str, args: tuple, params, dim: int) -> Node:
        return _intern(op, args, params, dim)

    def var(self, index: int, dim: int, cat: str) -> Node:
        return _var(index, dim, cat)

    def substitute(self, root: Node, pairs: tuple) -> Node:
        return _substitute(root, dict(pairs))

    def swap_ij(self, root: Node) -> Node:
        return _swap_ij(root)

    def __eq__(self, other) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


interner = Interner()


def _intern(op: str, args: tuple, params, dim: int) -> Node:
    params = _canon_param(tuple(params)) if params else ()
    dim = int(dim)
    if dim < 1:
        raise ValueError(f"IR node {op!r} would have dimension {dim}; dimensions are >= 1")
    ident = (op, tuple([a.key for a in args]), params, dim)
    with _table_lock:
        node = _table.get(ident)
        if node is not None:
            return node
        node = object.__new__(Node)
        text = f"{op}|{dim}|{_param_text(params)}|" + ",".join(a.key for a in args)
        for name, value in (
            ("op", op),
            ("args", args),
            ("params", params),
            ("dim", dim),
            ("key", hashlib.sha256(text.encode()).hexdigest()),
        ):
            object.__setattr__(node, name, value)
        _table[ident] = node
        return node


# Variables are built on every LazyTensor construction and reduction call: they are
# looked up here first (few distinct ones, kept alive for the process).
_vars: dict = {}


def var(index: int, dim: int, cat: str) -> Node:
    """A variable: ``cat`` is ``"i"`` (indexed by i), ``"j"`` (by j) or ``"p"`` (parameter)."""
    return interner.var(index, dim, cat)


def _var(index: int, dim: int, cat: str) -> Node:
    key = (index, dim, cat)
    node = _vars.get(key) if type(index) is int and type(dim) is int else None
    if node is not None:
        return node
    if cat not in CATS:
        raise ValueError(f"variable category must be one of {CATS}, got {cat!r}")
    node = make("var", (), (int(index), cat), dim)
    if type(index) is int and type(dim) is int and len(_vars) < 65536:
        _vars[key] = node
    return node


def const(values) -> Node:
    """A constant scalar or small vector."""
    if isinstance(values, (int, float)) or hasattr(values, "item") and getattr(values, "ndim", 1) == 0:
        values = (float(values),)
    values = tuple(float(v) for v in values)
    return make("const", (), values, len(values))


def const_value(node: Node):
    """The constant's scalar value if ``node`` is a constant with all entries equal, else None."""
    if node.op == "const" and all(v == node.params[0] for v in node.params):
        return node.params[0]
    return None


def topo_order(roots: Node | Iterable[Node]) -> list[Node]:
    """Nodes reachable from ``roots``, each once, children before parents."""
    if isinstance(roots, Node):
        roots = [roots]
    order: list[Node] = []
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(r, False) for r in reversed(list(roots))]
    while stack:
        node, expanded = stack.pop()
        if id(node) in seen:
            continue
        if expanded:
            seen.add(id(node))
            order.append(node)
            continue
        stack.append((node, True))
        for a in reversed(node.args):
            if id(a) not in seen:
                stack.append((a, False))
    return order


def variables(root: Node | Iterable[Node]) -> list[Node]:
    """The distinct variables of a formula, sorted by index."""
    vs = {n.index: n for n in topo_order(root) if n.op == "var"}
    return [vs[k] for k in sorted(vs)]


def rebuild(root: Node, fn) -> Node:
    """Bottom-up rewrite: ``fn(node, new_args)`` returns the replacement of each node."""
    memo: dict[int, Node] = {}
    for node in topo_order(root):
        new_args = tuple(memo[id(a)] for a in node.args)
        memo[id(node)] = fn(node, new_args)
    return memo[id(root)]


def substitute(root: Node, mapping: dict[Node, Node]) -> Node:
    """Replace nodes (typically variables) by other nodes of the same dimension."""
    return interner.substitute(root, tuple(mapping.items()))


def _substitute(root: Node, mapping: dict[Node, Node]) -> Node:

    def fn(node, new_args):
        if node in mapping:
            return mapping[node]
        if new_args == node.args:
            return node
        return make(node.op, new_args, node.params, node.dim)

    return rebuild(root, fn)


_SWAPPED = {"i": "j", "j": "i", "p": "p"}


def swap_cat(cat: str) -> str:
    """The category of a variable once i and j are exchanged."""
    return _SWAPPED[cat]


def swap_ij(root: Node) -> Node:
    """The same formula with the roles of i and j exchanged (reduction over i)."""
    return interner.swap_ij(root)


def _swap_ij(root: Node) -> Node:
    mapping = {v: var(v.index, v.dim, _SWAPPED[v.cat]) for v in variables(root)}
    return substitute(root, mapping)


def iter_ops(root: Node) -> Iterator[str]:
    for n in topo_order(root):
        yield n.op


def to_text(root: Node, limit: int = 4000) -> str:
    """A readable, KeOps-like rendering (for messages and debugging only; never parsed).

    Shared subterms print once per use, so a DAG's text can be exponentially long: every
    partial text is cut at ``limit`` characters (ending in "..."), and the walk is
    iterative, so deep or heavily shared formulas print in O(nodes * limit).

    >>> x = var(0, 1, "i")
    >>> to_text(make("mul", (x, x), (), 1))
    'mul(Vi(0,1), Vi(0,1))'
    """
    names = {"i": "Vi", "j": "Vj", "p": "Pm"}
    text: dict[int, str] = {}
    for node in topo_order(root):
        if node.op == "var":
            out = f"{names[node.cat]}({node.index},{node.dim})"
        elif node.op == "const":
            vals = ",".join(f"{v:g}" for v in node.params)
            out = vals if node.dim == 1 else f"[{vals}]"
        else:
            inner = ", ".join(text[id(a)] for a in node.args)
            if node.params:
                inner += (", " if inner else "") + ", ".join(map(repr, node.params))
            out = f"{node.op}({inner})"
        text[id(node)] = out if len(out) <= limit else out[: max(0, limit - 3)] + "..."
    return text[id(root)]
