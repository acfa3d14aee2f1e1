"""``Genred``: pykeops-style generic reductions defined by formula strings.

The strings are parsed once into IR by :mod:`codegen.parse`; the callable binds arrays to
the variables (in index order, which is alias order for aliases written without an index)
and runs :func:`lazytensor.engine.plans.reduce`. ``axis=1`` reduces over j (the output is indexed
by i), ``axis=0`` over i, as in pykeops.

>>> import numpy as np
>>> gauss = Genred("Exp(-SqDist(x, y)) * b", ["x = Vi(3)", "y = Vj(3)", "b = Vj(2)"],
...                reduction_op="Sum", axis=1)
>>> x, y, b = np.random.rand(100, 3), np.random.rand(80, 3), np.random.rand(80, 2)
>>> gauss(x, y, b).shape
(100, 2)
"""

from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np

from .. import fastsum
from ..codegen import ops, parse, reductions
from ..core import half
from ..core.binding import Variable, check_dense, copy_into, is_torch
from ..core.options import check_axis, gpu_options, keops_reduction, reduction_options
from ..engine import plans as engine
from ..errors import ArgumentTypeError
from .typehints import Array


class Genred:
    """A reduction ``reduction_op`` of ``formula`` over i (``axis=0``) or j (``axis=1``).

    ``aliases`` name the variables (``"x = Vi(3)"``, ``"y = Vj(1, 3)"``, ``"p = Pm(2)"``);
    the callable takes one array per variable in index order: ``(N, D)`` for ``Vi``,
    ``(M, D)`` for ``Vj``, ``(D,)`` for ``Pm``, with optional leading batch dimensions
    (``(B, N, D)``, ``(B, D)``). ``opt_arg`` is K for the K-min reductions; ``formula2``
    the weights of ``LogSumExp`` and ``SumSoftMaxWeight``. ``dtype``, ``cuda_type``,
    ``enable_chunks`` and ``rec_multVar_highdim`` are accepted for compatibility and have no
    effect (the arrays' dtype decides, as in pykeops 2); ``use_fast_math=True`` lets CUDA
    kernels use approximate intrinsics (unlike pykeops, not the default). The call takes
    pykeops's backend names too ("CPU", "GPU", "GPU_1D", ...) and ``device_id`` (NumPy
    arrays with ``backend="GPU"`` are copied to that GPU and back). ``tol`` (Sum only)
    evaluates it to that tolerance (:mod:`lazytensor.fastsum`).

    >>> import numpy as np
    >>> nn = Genred("SqDist(x, y)", ["x = Vi(2)", "y = Vj(2)"], "ArgKMin", axis=1, opt_arg=3)
    >>> nn(np.random.rand(10, 2), np.random.rand(20, 2)).shape
    (10, 3)
    """

    def __init__(self, formula: str, aliases: Sequence[str], reduction_op: str = "Sum",
                 axis: int = 0, dtype: str | None = None, opt_arg: int | None = None,
                 formula2: str | None = None, dtype_acc: str = "auto",
                 use_double_acc: bool = False, sum_scheme: str = "auto",
                 enable_chunks: bool = True, rec_multVar_highdim: Any = None,
                 use_fast_math: bool | None = None, cuda_type: str | None = None,
                 tol: float | None = None):
        axis = check_axis(axis)
        self.reduction, self.opts = keops_reduction(reduction_op, opt_arg, formula2)
        self.opts.update(gpu_options("auto", None, use_fast_math)[1])
        scope = parse.Scope(aliases)
        node = scope.parse(formula)
        if formula2 is not None:
            weight = scope.parse(formula2)
            if node.dim != 1:
                raise ValueError(f"{reduction_op}: the formula must be scalar, got dimension {node.dim}")
            node = ops.apply("concat", node, weight)
        self.variables = scope.variables()
        self.formula = node
        self.axis = axis
        self.reduction_op = reduction_op
        self.opts.update(reduction_options(self.reduction, dtype_acc, use_double_acc, sum_scheme))
        self.tol = tol if tol is None else fastsum.resolve_tol(tol, self.reduction)

    @classmethod
    def from_ir(cls, formula, variables: Sequence[parse.VarDecl], reduction: str, axis: int,
                opts: dict | None = None) -> Genred:
        """The Genred of an IR ``formula`` whose variable k is ``variables[k]`` and of
        our ``reduction`` (with its ``opts``): a LazyTensor reduction as a function of its
        arrays (pykeops's ``callfun``).

        >>> from lazytensor.codegen import ir
        >>> f = Genred.from_ir(ir.var(0, 1, "j"), [parse.VarDecl("b", 0, "j", 1)], "sum", 1)
        >>> f(np.ones((3, 1))).tolist(), f.reduction_op
        ([[3.0]], 'Sum')
        """
        red = object.__new__(cls)
        red.formula, red.variables = formula, list(variables)
        red.reduction, red.axis, red.opts, red.tol = reduction, check_axis(axis), dict(opts or {}), None
        red.reduction_op = reductions.get(reduction).keops_name or reduction
        return red

    def __repr__(self) -> str:
        args = ", ".join(v.describe() for v in self.variables)
        return f"Genred({self.reduction_op}, axis={self.axis}, [{args}])"

    def __call__(self, *args: Array | float, backend: str = "auto", device_id: int = -1,
                 ranges: Any = None, out: Array | None = None) -> Array | tuple:
        """Run the reduction on one array per variable (index order): an ``(N, F)`` array
        for ``axis=1`` (``(M, F)`` for ``axis=0``), in the arrays' library and dtype;
        ``(N, K)`` for the K-min family, a tuple for the reductions with two outputs.
        ``out`` receives the result; ``ranges`` are block-sparse ranges
        (:mod:`lazytensor.scale.ranges`).

        >>> sqdist_sum = Genred("SqDist(x, y)", ["x = Vi(1)", "y = Vj(1)"], "Sum", axis=1)
        >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
        >>> sqdist_sum(x, y).tolist()
        [[4.0], [2.0], [10.0]]
        """
        backend = str(gpu_options(backend, device_id)[0]).lower()
        variables = bind_arguments(self.variables, args)
        io_dtype = half.output_dtype(variables)
        if engine.torch_compiling():  # torch.compile/export: the torch.library op
            if ranges is not None:
                raise NotImplementedError("Genred: block-sparse ranges are not supported under "
                                          "torch.compile or torch.export")
            result = engine.torch_library().traced_reduce(
                self.formula, variables, self.reduction, self.axis, self.opts, backend)
        elif ranges is not None:  # block-sparse (see lazytensor.scale.ranges)
            from ..scale import ranges as ranges_mod

            result = ranges_mod.reduce(self.formula, variables, self.reduction, self.axis,
                                       self.opts, str(backend).lower(), None, ranges)
        else:  # a Sum to a tolerance: lazytensor.fastsum
            tol = fastsum.resolve_tol(self.tol, self.reduction)
            reduce = engine.reduce if tol is None else fastsum.reducer(tol)
            result = reduce(self.formula, variables, self.reduction, self.axis, self.opts,
                            str(backend).lower())
        if io_dtype:
            result = half.cast_outputs(result, io_dtype)
        if out is not None:
            return copy_into(out, result)
        return result


def bind_arguments(decls, args) -> list:
    """Canonical :class:`Variable` objects for the call's arrays, checked against the aliases."""
    if len(args) != len(decls):
        names = ", ".join(d.describe() for d in decls)
        raise ArgumentTypeError(f"expected {len(decls)} arrays ({names}), got {len(args)}")
    bound = [bind_one(d, a, k) for k, (d, a) in enumerate(zip(decls, args))]
    return _drop_unit_parameter_batches(bound)


def _drop_unit_parameter_batches(variables: list) -> list:
    """A parameter of shape ``(1, D)`` (or ``(1, 1, D)``) with unbatched variables is a
    ``(D,)`` parameter, as in pykeops (whose batch dimensions are ``max(ndim) - 2``):
    Falkon passes its kernel parameters as ``(1, 1)`` tensors."""
    nb = max([0, *(len(v.batch) for v in variables if v.cat != "p" and not v.is_scalar)])
    out = []
    for v in variables:
        extra = len(v.batch) - nb
        if v.cat == "p" and not v.is_scalar and extra > 0 and all(b == 1 for b in v.batch[:extra]):
            v = Variable(v.data.reshape(v.data.shape[extra:]), "p", v.dim, v.label)
        out.append(v)
    return out


def bind_one(decl, x, k):
    """The :class:`Variable` of array ``x``, argument ``k`` of a call, checked against ``decl``."""
    what = f"argument {k} ({decl.describe()})"
    if isinstance(x, numbers.Number) and not isinstance(x, bool):
        if decl.cat != "p" or decl.dim != 1:
            raise ArgumentTypeError(f"{what}: got a number, expected an array")
        return Variable(float(x), "p", 1, decl.name or "")
    if isinstance(x, (list, tuple)):
        x = np.asarray(x, dtype=np.float64)
    if not (is_torch(x) or isinstance(x, np.ndarray)):
        raise ArgumentTypeError(f"{what}: expected a NumPy array or a torch tensor, got {type(x).__name__}")
    check_dense(x, what)
    io_dtype = half.half_dtype(x)
    if io_dtype:
        x = half.to_compute(x)
    if decl.cat == "p":
        if x.ndim == 0:
            x = x.reshape(1)
        expected = f"({decl.dim},) or (*batch, {decl.dim})"
    else:
        if x.ndim == 1 and decl.dim == 1:
            x = x.reshape(-1, 1)
        expected = f"({'N' if decl.cat == 'i' else 'M'}, {decl.dim}) or (*batch, rows, {decl.dim})"
        if x.ndim < 2:
            raise ValueError(f"{what}: got shape {tuple(x.shape)}, expected {expected}")
    if x.shape[-1] != decl.dim:
        raise ValueError(f"{what}: got shape {tuple(x.shape)}, expected {expected}")
    return Variable(x, decl.cat, decl.dim, decl.name or "", io_dtype)


# ------------------------------------------------------------------ pykeops generic_* helpers


def _output_axis(output: str):
    decl = parse.parse_alias(output, 0)
    if decl.cat == "p":
        raise ValueError(f"output {output!r}: the output is indexed by i (Vi) or j (Vj), not Pm")
    return (1 if decl.cat == "i" else 0), decl.dim


def generic_sum(formula: str, output: str, *aliases: str, **kwargs: Any) -> Genred:
    """``Genred(formula, aliases, "Sum")``; ``output = "a = Vi(D)"`` reduces over j, ``Vj`` over i.

    >>> import numpy as np
    >>> f = generic_sum("x * y", "a = Vi(1)", "x = Vi(1)", "y = Vj(1)")
    >>> f(np.ones((3, 1)), np.ones((5, 1)))[:, 0].tolist()
    [5.0, 5.0, 5.0]
    """
    axis, dim = _output_axis(output)
    red = Genred(formula, list(aliases), reduction_op="Sum", axis=axis, **kwargs)
    _check_output_dim(output, dim, red.formula.dim)
    return red


def generic_logsumexp(formula: str, output: str, *aliases: str, **kwargs: Any) -> Genred:
    """``Genred(formula, aliases, "LogSumExp")`` with the axis given by ``output``
    (``"a = Vi(1)"``: over j, one value per i).

    >>> import numpy as np
    >>> lse = generic_logsumexp("-SqDist(x, y)", "a = Vi(1)", "x = Vi(1)", "y = Vj(1)")
    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
    >>> lse(x, y).round(4).tolist()
    [[0.0181], [-0.3069], [-0.9997]]
    """
    axis, dim = _output_axis(output)
    red = Genred(formula, list(aliases), reduction_op="LogSumExp", axis=axis, **kwargs)
    _check_output_dim(output, dim, 1)
    return red


def generic_argmin(formula: str, output: str, *aliases: str, **kwargs: Any) -> Genred:
    """``Genred(formula, aliases, "ArgMin")`` with the axis given by ``output``: the index
    (int64) of the nearest y for each x below.

    >>> import numpy as np
    >>> nearest = generic_argmin("SqDist(x, y)", "a = Vi(1)", "x = Vi(1)", "y = Vj(1)")
    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
    >>> nearest(x, y).tolist()
    [[0], [0], [1]]
    """
    axis, dim = _output_axis(output)
    red = Genred(formula, list(aliases), reduction_op="ArgMin", axis=axis, **kwargs)
    _check_output_dim(output, dim, red.formula.dim)
    return red


def generic_argkmin(formula: str, output: str, *aliases: str, **kwargs: Any) -> Genred:
    """``Genred(formula, aliases, "ArgKMin", opt_arg=K)``: ``output = "a = Vi(K)"`` gives K,
    and an ``(N, K)`` array of indices (int64), nearest first.

    >>> import numpy as np
    >>> knn = generic_argkmin("SqDist(x, y)", "a = Vi(2)", "x = Vi(1)", "y = Vj(1)")
    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
    >>> knn(x, y).tolist()
    [[0, 1], [0, 1], [1, 0]]
    """
    axis, K = _output_axis(output)
    return Genred(formula, list(aliases), reduction_op="ArgKMin", axis=axis, opt_arg=K, **kwargs)


def _check_output_dim(output, declared, actual):
    if declared != actual:
        raise ValueError(f"output {output!r} declares dimension {declared}, the reduction gives {actual}")
