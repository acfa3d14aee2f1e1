"""Memory of the generated per-pair code: each IR node's local array, and which go elsewhere.

:func:`lazytensor.codegen.render_c.render_function` declares one local array per IR node
(``T t5[D];``), so a function's stack frame holds the sum of its nodes' sizes: a formula
whose *intermediate* values are large (a 1024 x 1024 ``tensorprod`` summed to a scalar, a
difference of two 600 000-dimensional vectors) overflows a thread's stack even when its
result is a scalar. :func:`function_footprint` sizes every node of a function and, given
a stack budget, moves the largest values off the stack until the rest fits: computed
values into a per-thread heap buffer (CPU), constants into static storage. A node of
more than :data:`MAX_NODE_DIM` components is refused (its loops count in ``int``).

>>> from lazytensor.codegen import ir, ops
>>> from lazytensor.codegen.render_c import VarSpec
>>> x, y = ir.var(0, 1024, "i"), ir.var(1, 1024, "j")
>>> f = ops.apply("sum", ops.apply("tensorprod", x, y))
>>> specs = [VarSpec(0, 1024, "i"), VarSpec(1, 1024, "j")]
>>> fp = function_footprint([f], specs, "float64", stack_budget=FUNCTION_STACK_BYTES)
>>> fp.stack, fp.heap_elements
(8, 1048576)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import ir

# The node arrays one generated function keeps on the stack before the largest go to the
# heap: far below a thread's stack (8 MB by default, less for some OpenMP workers), and
# above what any formula of ordinary dimensions needs (D = 784: 3 KB per float32 node).
FUNCTION_STACK_BYTES = 256 << 10
MAX_NODE_DIM = (1 << 31) - 1  # the emitted loops count components in int


def element_size(dtype: str) -> int:
    return 4 if dtype == "float32" else 8


def node_bytes(node: ir.Node, size: int) -> int:
    """Bytes of the local arrays the renderer declares for ``node`` (its value, and the
    index tables of ``gather`` / ``scatter``)."""
    extra = 0
    if node.op == "gather":
        extra = 4 * node.dim
    elif node.op == "scatter":
        extra = 4 * node.args[0].dim
    return node.dim * size + extra


@dataclass(frozen=True)
class Footprint:
    """Where one function's node values live.

    ``stack``: bytes of the arrays left on the stack; ``heap``: ``{node: offset}`` (in
    elements) of the values computed into the heap buffer, ``heap_elements`` its length;
    ``static``: constants emitted as ``static const`` arrays."""

    stack: int
    heap: dict = field(default_factory=dict)
    heap_elements: int = 0
    static: frozenset = frozenset()


@dataclass(frozen=True)
class Storage:
    """How a backend stores the node values of the functions it renders: ``heap``, the C
    expression of its per-thread buffer (None: every value on the stack), and ``align``,
    the alignment given to arrays of 32 bytes or more (0: the compiler's). g++ 12 may
    otherwise place a local array, whose alignment its vectorizer raised afterwards, in a
    stack slot shared with a less aligned one, and store to it with aligned AVX moves
    (a segfault: seen with a 900-component ``tensorprod`` computed per row)."""

    heap: str | None = None
    align: int = 0


class FormulaTooLarge(ValueError):
    """A formula whose values cannot be held by a generated kernel (raised before any
    compilation)."""


def check_dims(roots) -> None:
    """Refuse nodes too large for the emitted ``int`` loops."""
    for node in ir.topo_order(roots):
        if node.dim > MAX_NODE_DIM:
            raise FormulaTooLarge(
                f"formula too large: the value {ir.to_text(node, limit=120)} has {node.dim} "
                f"components (at most {MAX_NODE_DIM}); split the formula into smaller pieces")


def function_footprint(roots, var_specs, dtype: str,
                       stack_budget: int | None = None) -> Footprint:
    """The footprint of the function computing ``roots`` from the variables ``var_specs``
    (as :func:`~lazytensor.codegen.render_c.render_function` emits it). With
    ``stack_budget``, the largest values leave the stack until the rest fits in it."""
    size = element_size(dtype)
    bound = {ir.var(v.index, v.dim, v.cat) for v in var_specs}
    nodes = [n for n in ir.topo_order(roots) if n not in bound and n.op != "var"]
    sizes = {n: node_bytes(n, size) for n in nodes}
    stack = sum(sizes.values())
    if stack_budget is None or stack <= stack_budget:
        return Footprint(stack)
    heap, static, offset = {}, set(), 0
    for n in sorted(nodes, key=lambda n: -sizes[n]):  # stable: topological among equals
        if stack <= stack_budget:
            break
        stack -= sizes[n]
        if n.op == "const":
            static.add(n)
        else:
            heap[n] = offset
            offset += n.dim
            stack += sizes[n] - n.dim * size  # index tables stay on the stack
    return Footprint(stack, heap, offset, frozenset(static))


__all__ = ["FUNCTION_STACK_BYTES", "MAX_NODE_DIM", "Footprint", "FormulaTooLarge", "Storage",
           "check_dims", "element_size", "function_footprint", "node_bytes"]
