"""pykeops's LazyTensor methods beyond arithmetic, mixed into :class:`~lazytensor.LazyTensor`.

Symbolic calculus (``diff``, ``grad_matrix``, ``divergence``, ``laplacian``,
``trace_operator``), B-spline bases and soft-DTW, the generic ``reduction(...)`` and
``unary``/``binary``/``ternary`` entry points that take KeOps operation names, and the
attributes and no-op steps of pykeops that client code calls (``_shape``,
``fixvariables``, ``factorize``). Every method returns a symbolic LazyTensor (or, for
``reduction``, the reduced array), like the rest of the API.

>>> import numpy as np
>>> from lazytensor import Vi, Vj
>>> x, y = Vi(np.random.rand(4, 3)), Vj(np.random.rand(5, 3))
>>> f = (-x.sqdist(y)).exp()
>>> f.laplacian(x).sum(1).shape, f.grad_matrix(x).ndim, f._shape
((4, 1), 3, (4, 5, 1))
"""

from __future__ import annotations

from typing import Any, TypeVar

from ..codegen import compositions, diff, ir, ops, parse, reductions
from .method_docs import document_op_methods
from .typehints import Array, Reduced

# the LazyTensor these methods are called on (and return): lazy.py imports this module
Self = TypeVar("Self", bound="KeOpsMethods")


def _basis(dim: int, k: int) -> ir.Node:
    return ir.const([1.0 if n == k else 0.0 for n in range(dim)])


def _sum_nodes(nodes: list) -> ir.Node:
    total = nodes[0]
    for n in nodes[1:]:
        total = ops.apply("add", total, n)
    return total


class KeOpsMethods:
    """The methods; :class:`~lazytensor.LazyTensor` inherits them."""

    def __init_subclass__(cls, **kwargs):
        # the methods that build one registered op take their docstring from its record
        super().__init_subclass__(**kwargs)
        document_op_methods(cls)

    # ------------------------------------------------------------------ attributes

    @property
    def _shape(self) -> tuple:
        """``(*batch, N, M, D)``, D included even when it is 1 (pykeops's internal shape,
        which geomloss reads to recognise a KeOps object)."""
        return (*self.batchdims, self.ni, self.nj, self.formula.dim)

    def fixvariables(self: Self) -> None:
        """pykeops numbers a formula's variables before a call; a lazytensor formula holds its
        variables from the start, so there is nothing to do.

        >>> import numpy as np; from lazytensor import Vi
        >>> Vi(np.ones((2, 1))).fixvariables() is None
        True
        """

    def factorize(self: Self, other: Self) -> Self:
        """The same formula, ``other``'s occurrences computed once (pykeops's ``Factorize``):
        identical subterms already are one node here, evaluated once per pair.

        >>> import numpy as np; from lazytensor import Vi
        >>> x = Vi(np.array([[1.0, 2.0]]))
        >>> x.sqnorm2().factorize(x).dense().tolist()
        [[5.0]]
        """
        if not isinstance(other, type(self)):
            raise TypeError(f"factorize: expected a LazyTensor, got {type(other).__name__}")
        return self._build(lambda f: f)

    def auto_factorize(self: Self) -> Self:
        """The same formula, shared subterms computed once (pykeops's ``AutoFactorize``):
        the IR shares identical subterms already.

        >>> import numpy as np; from lazytensor import Vi
        >>> Vi(np.array([[1.0, 2.0]])).sqnorm2().auto_factorize().dense().tolist()
        [[5.0]]
        """
        return self._build(lambda f: f)

    # ------------------------------------------------------------------ reductions

    def reduction(self: Self, reduction_op: str, other: Self | Array | float | None = None,
                  opt_arg: int | None = None, axis: int | None = None, dim: int | None = None,
                  call: bool = True, is_complex: bool | None = None, backend: str = "auto",
                  **kwargs: Any) -> Reduced:
        """Any reduction by its pykeops name: ``K.reduction("LogSumExp", other=w, dim=1)``,
        ``K.reduction("ArgKMin", opt_arg=5, dim=1)``; keywords as the named methods. The
        name, K and the weight are read from the reduction registry.

        >>> import numpy as np; from lazytensor import Vi, Vj
        >>> x = np.random.rand(4, 2)
        >>> Vi(x).sqdist(Vj(x)).reduction("ArgKMin", opt_arg=2, dim=1)[:, 0].tolist()
        [0, 1, 2, 3]
        """
        from ..core.options import keops_reduction, split_reduction_keywords

        if is_complex:
            raise NotImplementedError("reduction: complex LazyTensors are not supported")
        name, opts = keops_reduction(reduction_op, opt_arg, other)
        target = self._with_weight(other, reduction_op) if reductions.get(name).weighted else self
        index = self._index_dim(dim, axis, "reduction")
        backend, opts, kwargs = split_reduction_keywords(name, backend, kwargs, opts)
        return target._reduce(name, index, None, backend, opts, call=call, **kwargs)

    # ------------------------------------------------------------------ KeOps operation names

    def unary(self: Self, operation: str, dimres: int | None = None, opt_arg: Any = None,
              opt_arg2: Any = None, is_complex: bool | None = None) -> Self:
        """``operation(self, opt_arg, opt_arg2)`` by its KeOps name (``x.unary("Exp")``,
        ``x.unary("Extract", opt_arg=1, opt_arg2=2)``); ``dimres`` is checked.

        >>> import numpy as np; from lazytensor import Vi
        >>> Vi(np.random.rand(4, 3)).unary("Extract", opt_arg=1, opt_arg2=2).ndim
        2
        """
        options = [o for o in (opt_arg, opt_arg2) if o is not None]
        return self._named(operation, [self], options, dimres, is_complex=is_complex)

    def binary(self: Self, other: Self | Array | float, operation: str, is_operator: bool = False,
               dimres: int | None = None, dimcheck: str | None = "sameor1", opt_arg: Any = None,
               opt_pos: str = "last", rversion: bool = False,
               is_complex: bool | None = None) -> Self:
        """``operation(self, other, opt_arg)`` by its KeOps name, or ``self operation other``
        for an operator (``x.binary(y, "+", is_operator=True)``); ``dimcheck`` is
        pykeops's ("same", "sameor1", "vecand1" or None).

        >>> import numpy as np; from lazytensor import Vi, Vj
        >>> x, y = Vi(np.array([[1.0, 2.0]])), Vj(np.array([[0.0, 1.0]]))
        >>> x.binary(y, "+", is_operator=True).dense().tolist()
        [[[1.0, 3.0]]]
        >>> x.binary(y, "SqDist").dense().tolist()
        [[2.0]]
        """
        other = other if isinstance(other, type(self)) else self._operand(other)
        _check_dims(operation, dimcheck, [self.formula.dim, other.formula.dim])
        operands = [other, self] if rversion else [self, other]
        options = [] if opt_arg is None else [opt_arg]
        if options and opt_pos == "middle":
            if not isinstance(opt_arg, type(self)):
                raise TypeError(f"{operation}: opt_pos='middle' takes a LazyTensor opt_arg, got "
                                f"{type(opt_arg).__name__}")
            operands, options = [operands[0], options[0], operands[1]], []
        return self._named(operation, operands, options, dimres, operator=is_operator,
                           is_complex=is_complex)

    def ternary(self: Self, other1: Self | Array | float, other2: Self | Array | float,
                operation: str,
                dimres: int | None = None, dimcheck: str | None = "sameor1",
                opt_arg: Any = None) -> Self:
        """``operation(self, other1, other2, opt_arg)`` by its KeOps name
        (``x.ternary(a, b, "Clamp")``).

        >>> import numpy as np; from lazytensor import Vi
        >>> Vi(np.array([[-2.0], [3.0]])).ternary(-1.0, 1.0, "Clamp").dense().tolist()
        [[-1.0], [1.0]]
        """
        operands = [o if isinstance(o, type(self)) else self._operand(o) for o in (other1, other2)]
        _check_dims(operation, dimcheck, [self.formula.dim] + [o.formula.dim for o in operands])
        return self._named(operation, [self, *operands], [] if opt_arg is None else [opt_arg],
                           dimres)

    def _named(self, operation, operands, options, dimres, operator=False, is_complex=None):
        if is_complex:
            raise NotImplementedError(f"{operation}: complex LazyTensors are not supported")
        if not isinstance(operation, str):
            raise TypeError(f"the operation must be a KeOps name (a string), got {operation!r}")
        lazies = [o for o in (*operands, *options) if isinstance(o, type(self))]

        def build(*nodes):
            node_of = {id(lt): n for lt, n in zip(lazies, nodes[1:])}
            node = parse.apply_function(operation, [node_of[id(o)] for o in operands],
                                        [node_of.get(id(o), o) for o in options],
                                        operator=operator)
            if dimres is not None and int(dimres) != node.dim:
                raise ValueError(f"{operation}: the result has dimension {node.dim}, not "
                                 f"dimres={dimres}")
            return node

        return self._build(build, *lazies)

    # ------------------------------------------------------------------ symbolic calculus

    def diff(self: Self, v: Self, u: Self | Array | float) -> Self:
        """The directional derivative ``(∂self/∂v) u`` (pykeops's ``Diff``), ``u`` of v's
        dimension (or 1).

        >>> import numpy as np; from lazytensor import Vi
        >>> x = Vi(np.random.rand(3, 2))
        >>> bool((x.sqnorm2().diff(x, x) - 2 * x.sqnorm2()).abs().sum(0)[0, 0] < 1e-12)
        True
        """

        def build(f, x, t):
            if t.dim not in (1, x.dim):
                raise ValueError(f"diff: the direction has dimension {t.dim}, the variable "
                                 f"{x.dim}")
            if t.dim != x.dim:
                t = ops.apply("expand", t, params=(x.dim,))
            return diff.jvp(f, {x: t})

        return self._build(build, _leaf(v, "diff"), u)

    def grad_matrix(self: Self, v: Self) -> Self:
        """The Jacobian of ``self`` (dimension F) in ``v`` (dimension D), row-major: an F·D
        vector whose entry ``k·D + l`` is ``∂self_k/∂v_l`` (pykeops's ``GradMatrix``).

        >>> import numpy as np; from lazytensor import Vi
        >>> x = Vi(np.array([[1.0, 2.0]]))
        >>> (x * x).grad_matrix(x).dense().tolist()     # diag(2 x)
        [[[2.0, 0.0, 0.0, 4.0]]]
        """
        return self._build(lambda f, x: compositions.concat_all(
            [diff.vjp(f, [x], _basis(f.dim, k))[x] for k in range(f.dim)]),
            _leaf(v, "grad_matrix"))

    def divergence(self: Self, v: Self) -> Self:
        """``Σ_k ∂self_k/∂v_k`` for ``self`` of v's dimension: dimension 1.

        >>> import numpy as np; from lazytensor import Vi
        >>> x = Vi(np.array([[1.0, 2.0]]))
        >>> (x * x).divergence(x).dense().tolist()      # 2 x_0 + 2 x_1
        [[6.0]]
        """
        return self._build(_divergence, _leaf(v, "divergence"))

    def laplacian(self: Self, v: Self) -> Self:
        """``Σ_k ∂²self/∂v_k²`` for a scalar ``self``: dimension 1.

        >>> import numpy as np; from lazytensor import Vi
        >>> x = Vi(np.array([[1.0, 2.0]]))
        >>> x.sqnorm2().laplacian(x).dense().tolist()   # 2 per component
        [[4.0]]
        """

        def build(f, x):
            if f.dim != 1:
                raise ValueError(f"laplacian: the formula must be scalar, got dimension {f.dim}")
            return _divergence(diff.vjp(f, [x], ir.const(1.0))[x], x)

        return self._build(build, _leaf(v, "laplacian"))

    def trace_operator(self: Self, v: Self) -> Self:
        """The trace of ``v ↦ self`` for a formula linear in ``v`` (of v's dimension):
        ``Σ_k self(v = e_k)_k`` (pykeops's ``TraceOperator``): dimension 1.

        >>> import numpy as np; from lazytensor import Pm, Vi
        >>> x, A = Vi(np.array([[1.0, 2.0]])), Pm(np.array([1.0, 2.0, 3.0, 4.0]))
        >>> A.matvecmult(x).trace_operator(x).dense().tolist()   # trace [[1, 2], [3, 4]]
        [[5.0]]
        """

        def build(f, x):
            if f.dim != x.dim:
                raise ValueError(f"trace_operator: the formula has dimension {f.dim}, the "
                                 f"variable {x.dim}; they must be equal")
            return _sum_nodes([ops.apply("slice", ir.substitute(f, {x: _basis(x.dim, k)}),
                                         params=(k, 1)) for k in range(x.dim)])

        return self._build(build, _leaf(v, "trace_operator"))

    # ------------------------------------------------------------------ splines and DTW

    def bspline(self: Self, x: Self | Array | float, k: int = 0) -> Self:
        """The B-spline basis of order ``k`` on the knots ``self`` (non-decreasing), at the
        scalar ``x``: a vector of dimension ``self.ndim - k - 1`` (pykeops's ``BSpline``).

        >>> import numpy as np; from lazytensor import Pm, Vi
        >>> knots, t = Pm(np.array([0.0, 1.0, 2.0, 3.0])), Vi(np.array([[0.5], [1.5]]))
        >>> knots.bspline(t, 1).dense().tolist()        # hat functions at 1 and 2
        [[[0.5, 0.0]], [[0.5, 0.5]]]
        """
        return self._build(lambda knots, t: compositions.bspline(knots, t, int(k)), x)

    def softdtw_sqdist(self: Self, other: Self | Array | float,
                       gamma: Self | Array | float) -> Self:
        """Soft-DTW between the sequences ``self`` and ``other`` for the squared difference,
        smoothing ``gamma`` (pykeops's ``SoftDTW_SqDist``); differentiable in all three.
        Sequences of lengths D and E give dimension 1.

        >>> import numpy as np; from lazytensor import Pm, Vi, Vj
        >>> a, b = Vi(np.array([[0.0, 1.0, 2.0]])), Vj(np.array([[0.0, 2.0]]))
        >>> a.softdtw_sqdist(b, Pm(0.1)).dense().round(4).tolist()
        [[0.9307]]
        """
        return self._build(compositions.softdtw_sqdist, other, gamma)


def _leaf(v, what: str):
    """``v``, checked to be a LazyTensor of one variable (what is differentiated)."""
    if not (getattr(v, "formula", None) is not None and v.formula.op == "var"
            and len(v.variables) == 1):
        raise ValueError(f"{what}: the variable must be a LazyTensor that wraps one array "
                         "(Vi(x), Vj(y), Pm(p)), not a formula")
    return v


def _divergence(f: ir.Node, x: ir.Node) -> ir.Node:
    if f.dim != x.dim:
        raise ValueError(f"divergence: the formula has dimension {f.dim}, the variable {x.dim}; "
                         "they must be equal")
    return _sum_nodes([ops.apply("slice", diff.jvp(f, {x: _basis(x.dim, k)}), params=(k, 1))
                       for k in range(x.dim)])


def _check_dims(operation, dimcheck, dims):
    """pykeops's operand checks: "same", "sameor1", "vecand1" or None."""
    if dimcheck is None:
        return
    if dimcheck == "same":
        ok = len(set(dims)) == 1
    elif dimcheck == "sameor1":
        ok = len({d for d in dims if d != 1}) <= 1
    elif dimcheck == "vecand1":
        ok = dims[-1] == 1
    else:
        raise ValueError(f"dimcheck must be 'same', 'sameor1', 'vecand1' or None, got {dimcheck!r}")
    if not ok:
        raise ValueError(f"{operation}: operands of dimensions {dims} do not pass dimcheck="
                         f"{dimcheck!r}")


__all__ = ["KeOpsMethods"]
