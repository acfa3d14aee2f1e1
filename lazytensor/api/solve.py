"""Kernel linear systems ``(alpha I + K) x = b`` by conjugate gradient, differentiable in torch.

The operator is the kernel product itself (a Sum reduction), so no N×M matrix exists.
For torch inputs the solution is a node of the autograd graph: with ``A = alpha I + K``
symmetric and ``u = A⁻¹ g`` (a second solve), ``∂L/∂b = u``, ``∂L/∂alpha = -uᵀx`` and
``∂L/∂θ = -∇_θ ⟨u, K_θ x⟩`` for every variable θ of the kernel: the gradient of one more
kernel product, which the reductions' own autograd provides without an N×M buffer.

>>> import numpy as np
>>> from lazytensor import Vi, Vj
>>> x = np.random.rand(200, 2); b = np.random.rand(200, 1)
>>> K = (-Vi(x).sqdist(Vj(x)) * 10).exp()
>>> a = solve(K, b, alpha=0.1)
>>> bool(np.abs(K @ a + 0.1 * a - b).max() < 1e-4)
True
"""

from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..codegen import ir, ops, parse
from ..core.binding import Slot, Variable, bind, is_torch
from ..core.options import IGNORED_OPTIONS, check_axis, keops_backend, reduction_options
from ..core.progress import IterationProgress
from ..engine import plans as engine
from . import symbolic
from .genred import bind_arguments
from .typehints import Array


@dataclass(frozen=True, eq=False)
class KernelOperator:
    """``v -> Σ F(..., v)`` over the reduced index, where slot ``unknown`` of ``formula`` is ``v``.

    ``template`` holds the other variables (their data is replaced at each call).
    """

    formula: ir.Node
    template: tuple  # Variable per index (the unknown's entry is a placeholder)
    unknown: int
    axis: int
    opts: tuple = ()
    backend: str = "auto"
    ranges: tuple | None = None  # block-sparse (see lazytensor.scale.ranges)

    def __call__(self, datas, v):
        variables = [Variable(v if k == self.unknown else d, t.cat, t.dim, t.label)
                     for k, (t, d) in enumerate(zip(self.template, datas))]
        if self.ranges is not None:
            from ..scale import ranges

            return ranges.reduce(self.formula, variables, "sum", self.axis, dict(self.opts),
                                 self.backend, None, self.ranges)
        return engine.reduce(self.formula, variables, "sum", self.axis, dict(self.opts), self.backend)


# ---------------------------------------------------------------------- conjugate gradient


def _dot(a, b):
    """Per-column inner products over the rows axis (-2), keeping dimensions."""
    if is_torch(a):
        return (a * b).sum(dim=-2, keepdim=True)
    return (a * b).sum(axis=-2, keepdims=True)


def _safe_ratio(num, den):
    if is_torch(num):
        import torch

        return torch.where(den != 0, num / torch.where(den != 0, den, torch.ones_like(den)),
                           torch.zeros_like(num))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, num / np.where(den != 0, den, 1), 0 * num)


def _relative_residual(rs, rs0) -> float:
    """The worst column's ``‖r‖ / ‖b‖`` (0 for a zero right-hand side)."""
    return float((rs / (rs0 + (rs0 == 0))).max()) ** 0.5


def conjugate_gradient(apply, b, alpha=0.0, eps=1e-6, maxiter=None, verbose=False):
    """Solve ``alpha x + apply(x) = b`` column by column (``b`` of shape ``(*batch, rows, E)``).

    Stops when every column's residual satisfies ``‖r‖ ≤ eps ‖b‖``; warns if ``maxiter``
    iterations (default ``max(100, 10 × rows)``) do not get there. ``verbose=True``
    reports each iteration's worst relative residual on stderr (a tqdm bar when tqdm is
    installed, plain lines otherwise; see :class:`lazytensor.core.progress.IterationProgress`).
    """
    rows = b.shape[-2]
    maxiter = max(100, 10 * rows) if maxiter is None else int(maxiter)
    x = b * 0
    r = b * 1
    p = r
    rs = rs0 = _dot(r, r)
    tol2 = rs * (eps * eps)
    bar = IterationProgress("solve", eps) if verbose else None
    done = 0
    for done in range(maxiter):
        if bool((rs <= tol2).all()):
            if bar is not None:
                bar.close(done, _relative_residual(rs, rs0), converged=True)
            return x
        Ap = apply(p) + alpha * p
        step = _safe_ratio(rs, _dot(p, Ap))
        x = x + step * p
        r = r - step * Ap
        rs_new = _dot(r, r)
        p = r + _safe_ratio(rs_new, rs) * p
        rs = rs_new
        if bar is not None:
            bar.update(done + 1, _relative_residual(rs, rs0))
    converged = bool((rs <= tol2).all())
    if bar is not None:
        bar.close(maxiter, _relative_residual(rs, rs0), converged)
    if not converged:
        worst = float((rs / (tol2 + (tol2 == 0))).max() ** 0.5) * eps
        warnings.warn(f"conjugate gradient stopped after {maxiter} iterations with relative "
                      f"residual {worst:.2e} > eps={eps:g}; raise maxiter or alpha",
                      RuntimeWarning, stacklevel=3)
    return x


# ---------------------------------------------------------------------- autograd


def _solve(op: KernelOperator, datas: list, b, alpha, eps, maxiter, verbose=False):
    """``(alpha I + op) x = b``; a differentiable torch Function when something requires grad."""
    if is_torch(b):
        import torch

        tensors = [b, alpha, *datas]
        if torch.is_grad_enabled() and any(is_torch(t) and t.requires_grad for t in tensors):
            return _function().apply(op, eps, maxiter, verbose, alpha, b, *datas)
        with torch.no_grad():
            return conjugate_gradient(lambda v: op(datas, v), b, alpha, eps, maxiter, verbose)
    return conjugate_gradient(lambda v: op(datas, v), b, alpha, eps, maxiter, verbose)


_FUNCTION = None


def _function():
    global _FUNCTION
    if _FUNCTION is None:
        _FUNCTION = _make_function()
    return _FUNCTION


def _make_function():
    import torch

    class KernelSolveFunction(torch.autograd.Function):
        """``x = (alpha I + K)⁻¹ b``; backward: one more solve and one kernel-product VJP."""

        @staticmethod
        def forward(ctx, op, eps, maxiter, verbose, alpha, b, *datas):
            with torch.no_grad():
                x = conjugate_gradient(lambda v: op(datas, v), b, alpha, eps, maxiter, verbose)
            ctx.op, ctx.eps, ctx.maxiter, ctx.verbose = op, eps, maxiter, verbose
            ctx.plain = [(is_torch(d), None if is_torch(d) else d) for d in (alpha, *datas)]
            ctx.save_for_backward(x, *[d for d in (alpha, *datas) if is_torch(d)])
            return x

        @staticmethod
        def backward(ctx, g):
            x, *tensors = ctx.saved_tensors
            alpha, *datas = [tensors.pop(0) if t else d for t, d in ctx.plain]
            create_graph = torch.is_grad_enabled()
            needs = ctx.needs_input_grad
            # A = alpha I + K is symmetric: the cotangent of b is A⁻¹ g.
            u = _solve(ctx.op, datas, g, alpha, ctx.eps, ctx.maxiter, ctx.verbose)
            grad_alpha = None
            if is_torch(alpha) and needs[4]:
                grad_alpha = -(u * x).sum().reshape(alpha.shape)
            wanted = [k for k, d in enumerate(datas) if is_torch(d) and needs[6 + k]]
            grads = [None] * len(datas)
            if wanted:
                with torch.enable_grad():
                    # One view per slot: a tensor passed twice (x as Vi and as Vj) gets the
                    # partial gradient of each slot, which autograd then adds up.
                    views = [d.view_as(d) if k in wanted else d for k, d in enumerate(datas)]
                    xs = x if create_graph else x.detach()
                    us = u if create_graph else u.detach()
                    y = ctx.op(views, xs)
                    found = torch.autograd.grad(y, [views[k] for k in wanted], -us,
                                                create_graph=create_graph, allow_unused=True)
                for k, gk in zip(wanted, found):
                    grads[k] = gk if gk is not None else torch.zeros_like(datas[k])
            return (None, None, None, None, grad_alpha, u if needs[5] else None, *grads)

    return KernelSolveFunction


# ---------------------------------------------------------------------- public API


def _is_lazy(x) -> bool:
    """A LazyTensor (this module sits below :mod:`lazytensor.api.lazy`, which calls it)."""
    return isinstance(getattr(x, "formula", None), ir.Node) and hasattr(x, "variables")


def _rhs(b):
    """b as canonical (*batch, rows, E), and a function giving x the shape of b."""
    if _is_lazy(b):
        if len(b.variables) != 1 or b.formula.op != "var" or b.variables[0].cat != "i":
            raise ValueError("solve: b must be an array or an i-indexed LazyTensor leaf (Vi(b))")
        b = b.variables[0].data
    if isinstance(b, (list, tuple)):
        b = np.asarray(b, dtype=np.float64)
    if not (is_torch(b) or isinstance(b, np.ndarray)):
        raise TypeError(f"solve: b must be an array, got {type(b).__name__}")
    if b.ndim == 1:
        return b[:, None], lambda x: x[:, 0]
    return b, lambda x: x


def _check_alpha(alpha):
    if is_torch(alpha):
        if alpha.numel() != 1:
            raise ValueError(f"alpha must be a scalar, got shape {tuple(alpha.shape)}")
        return alpha
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or alpha < 0:
        raise ValueError(f"alpha must be a non-negative number, got {alpha!r}")
    return float(alpha)


def solve(K, b, alpha=0.0, eps=1e-6, maxiter=None, var=None, backend="auto", call=True,
          dtype_acc="auto", use_double_acc=False, sum_scheme="auto", verbose=False, **ignored):
    """Solve ``(alpha I + K) x = b`` for a symmetric positive (semi-)definite kernel ``K``.

    ``K`` is a scalar LazyTensor over (i, j) built on the same points on both sides
    (``K_ij = k(x_i, x_j)``); ``K @ v`` is its product. With ``var`` (a ``Vj`` leaf of ``K``),
    ``K`` is instead a formula linear in ``var`` and the operator is ``var -> K.sum(1)``.
    ``b`` is ``(N,)`` or ``(N, E)`` (or a ``Vi`` LazyTensor); ``x`` has its shape. Stops when
    ``‖r‖ ≤ eps ‖b‖`` for every column. Differentiable in ``b``, ``alpha`` and the kernel's
    tensors. As pykeops's ``K.solve``, it takes the kernel products' options (``backend``
    with pykeops's names, ``dtype_acc``, ``use_double_acc``, ``sum_scheme``) and accepts
    ``enable_chunks``/``device_id``-style ones without effect. ``call=False``, or symbolic
    variables in ``K`` or ``b`` (``Vi(0, 3)``, ...), give a :class:`DeferredSolve`, the
    solve as a function of their arrays (as pykeops). ``verbose=True`` reports the iterations and the
    relative residual on stderr (a tqdm bar when tqdm is installed).

    >>> import numpy as np
    >>> from lazytensor import Vi, Vj
    >>> x = np.random.rand(50, 1)
    >>> K = (-Vi(x).sqdist(Vj(x))).exp()
    >>> solve(K, np.ones(50), alpha=1.0).shape
    (50,)
    """
    if not _is_lazy(K):
        raise TypeError(f"solve: K must be a LazyTensor, got {type(K).__name__}")
    alpha = _check_alpha(alpha)
    if call is not True or symbolic.has_slots(K.variables) or (
            _is_lazy(b) and symbolic.has_slots(b.variables)):
        return DeferredSolve(K, b, dict(alpha=alpha, eps=eps, maxiter=maxiter, var=var,
                                        backend=backend, dtype_acc=dtype_acc,
                                        use_double_acc=use_double_acc, sum_scheme=sum_scheme,
                                        verbose=verbose, **ignored))
    unknown_kw = [k for k in ignored if k not in IGNORED_OPTIONS]
    if unknown_kw:
        raise TypeError(f"solve() got an unexpected keyword argument {unknown_kw[0]!r}")
    opts = tuple(sorted(reduction_options("sum", dtype_acc, use_double_acc, sum_scheme).items()))
    backend = keops_backend(backend)
    rhs, shape_back = _rhs(b)
    variables = list(K.variables)
    if var is None:
        if K.formula.dim != 1:
            raise ValueError(f"solve: K must be a scalar formula, got dimension {K.formula.dim}")
        unknown = len(variables)
        variables.append(Variable(rhs, "j", int(rhs.shape[-1]), "unknown"))
        formula = ops.apply("mul", K.formula, ir.var(unknown, int(rhs.shape[-1]), "j"))
    else:
        unknown = _find_leaf(K, var)
        formula = K.formula
    _check_square(bind(K.variables), variables[unknown].dim, rhs, formula)
    op = KernelOperator(formula, tuple(variables), unknown, 1, opts, backend, K.ranges)
    datas = [None if k == unknown else v.data for k, v in enumerate(variables)]
    return shape_back(_solve(op, datas, rhs, alpha, eps, maxiter, verbose))


class DeferredSolve:
    """``K.solve(b, call=False)`` (or with symbolic variables): the solve, run when called.

    Without symbolic variables, ``f()`` solves (keywords such as ``alpha`` override the
    solve's); with them, ``f(*arrays)`` takes their arrays in index order, ``b``'s too when
    ``b`` is one (``K.solve(Vi(2, 1), ...)``). ``f.callfun`` takes every array in
    pykeops's order: the symbolic variables', then ``b`` (when bound), then ``K``'s.

    >>> import numpy as np
    >>> from lazytensor import Vi, Vj
    >>> x = np.random.rand(30, 1)
    >>> K = (-Vi(x).sqdist(Vj(x))).exp()
    >>> f = K.solve(np.ones(30), alpha=1.0, call=False)
    >>> a = f()
    >>> bool(np.abs(K @ a + a - 1).max() < 1e-5), f.callfun(np.ones(30), x, x).shape
    (True, (30,))
    """

    def __init__(self, K, b, kwargs: dict):
        self.K, self.b, self.kwargs = K, b, kwargs
        self._b_slot = _is_lazy(b) and symbolic.has_slots(b.variables)
        if self._b_slot and (len(b.variables) != 1 or b.formula.op != "var"):
            raise ValueError("solve: a symbolic b must be one variable (Vi(index, dim))")
        self._slots = symbolic.slots(list(K.variables) + (list(b.variables) if self._b_slot else []))
        self.reduction_op = "Solve"

    def __call__(self, *args: Any, **kwargs: Any) -> Array:
        if len(args) != len(self._slots):
            what = (", ".join(v.label for _, v in sorted(self._slots.items())) if self._slots
                    else "no arrays: K and b are bound")
            raise TypeError(f"this solve takes {len(self._slots)} arrays ({what}), got {len(args)}")
        K, b = self.K, self.b
        if self._slots:
            K = K._new(K.formula, symbolic.bind_slots(K.variables, args))
            K.ranges = self.K.ranges
            if self._b_slot:
                b = args[b.variables[0].data.index]
        return solve(K, b, **{**self.kwargs, **kwargs})

    def callfun(self, *arrays: Any, **kwargs: Any) -> Array:
        """The solve of all its arrays, in pykeops's index order."""
        S = len(self._slots)
        bound = [v for v in self.K.variables if not isinstance(v.data, Slot)]
        wanted = S + (0 if self._b_slot else 1) + len(bound)
        if len(arrays) != wanted:
            raise TypeError(f"callfun takes {wanted} arrays (the symbolic variables', b, then "
                            f"K's), got {len(arrays)}")
        head, rest = arrays[:S], list(arrays[S:])
        b = self.b if self._b_slot else rest.pop(0)
        new = iter(rest)
        variables = [v if isinstance(v.data, Slot) else Variable(next(new), v.cat, v.dim,
                                                                         v.label)
                     for v in self.K.variables]
        K = self.K._new(self.K.formula, variables)
        K.ranges = self.K.ranges
        return DeferredSolve(K, b, self.kwargs)(*head, **kwargs)

    def __str__(self) -> str:
        return symbolic.describe(self.K) + "\n    reduction: Solve (axis=1)"  # as pykeops

    __repr__ = __str__


def _find_leaf(K, var) -> int:
    if not _is_lazy(var) or len(var.variables) != 1 or var.formula.op != "var":
        raise ValueError("solve: var must be a LazyTensor leaf (Vj(v))")
    leaf = var.variables[0]
    for k, v in enumerate(K.variables):
        if v.data is leaf.data and v.cat == leaf.cat:
            if v.cat != "j":
                raise ValueError("solve: var must be j-indexed (the reduction runs over j)")
            return k
    raise ValueError("solve: var is not a variable of K")


def _check_square(sig, E, rhs, formula):
    """The operator maps rows to rows: K is N x N and b has N rows of the unknown's dimension."""
    rows = rhs.shape[-2]
    if (sig.N, sig.M) != (rows, rows):
        raise ValueError(f"solve: K must be square (the same points on both sides) with the rows "
                         f"of b; K is {sig.N} x {sig.M}, b has {rows} rows")
    if formula.dim != E or rhs.shape[-1] != E:
        raise ValueError(f"solve: the operator maps dimension {E} to {formula.dim}, b has "
                         f"dimension {rhs.shape[-1]}")


class KernelSolve:
    """pykeops's ``KernelSolve``: solve ``(alpha I + K) a = b`` where ``formula`` is ``K(·) b``.

    ``formula`` is linear in the variable ``varinvalias``; with ``axis=1`` (reduction over j)
    it is a ``Vj`` variable, with ``axis=0`` a ``Vi``. The callable takes the arrays in index
    order, the right-hand side in the place of ``varinvalias``, and returns the solution;
    ``verbose=True`` reports the iterations and the residual (see :func:`solve`).

    >>> import numpy as np
    >>> Kinv = KernelSolve("Exp(-SqDist(x, y)) * b", ["x = Vi(2)", "y = Vj(2)", "b = Vj(1)"],
    ...                    "b", axis=1)
    >>> x = np.random.rand(40, 2)
    >>> Kinv(x, x, np.random.rand(40, 1), alpha=0.5).shape
    (40, 1)
    """

    def __init__(self, formula: str, aliases: Sequence[str], varinvalias: str, axis: int = 0,
                 dtype: str | None = None, opt_arg: int | None = None, dtype_acc: str = "auto",
                 use_double_acc: bool = False, sum_scheme: str = "auto",
                 enable_chunks: bool = True, rec_multVar_highdim: Any = None,
                 use_fast_math: bool = True, cuda_type: str | None = None):
        axis = check_axis(axis)
        scope = parse.Scope(aliases)
        self.formula = scope.parse(formula)
        self.variables = scope.variables()
        decl = scope.by_name.get(varinvalias)
        if decl is None:
            raise ValueError(f"KernelSolve: {varinvalias!r} is not one of the aliases")
        wanted = "j" if axis == 1 else "i"
        if decl.cat != wanted:
            raise ValueError(f"KernelSolve: with axis={axis} the unknown {varinvalias!r} must be "
                             f"{'Vj' if axis == 1 else 'Vi'} (the reduced index), got {decl.describe()}")
        if self.formula.dim != decl.dim:
            raise ValueError(f"KernelSolve: the formula has dimension {self.formula.dim}, the "
                             f"unknown {decl.dim}")
        self.unknown, self.axis = decl.index, axis
        self.opts = tuple(sorted(reduction_options("sum", dtype_acc, use_double_acc, sum_scheme).items()))

    def __call__(self, *args: Array | float, backend: str = "auto", device_id: int = -1,
                 alpha: float = 1e-10, eps: float = 1e-6, maxiter: int | None = None,
                 ranges: Any = None, verbose: bool = False) -> Array:
        """The solution ``a`` of ``(alpha I + K) a = b``, shaped as the right-hand side ``b``
        (given in the place of ``varinvalias``), by conjugate gradient to the relative
        residual ``eps``; differentiable for torch arrays.

        >>> Kinv = KernelSolve("Exp(-SqDist(x, y)) * b", ["x = Vi(1)", "y = Vj(1)", "b = Vj(1)"],
        ...                    "b", axis=1)
        >>> x = np.array([[0.0], [1.0], [3.0]])
        >>> a = Kinv(x, x, np.ones((3, 1)), alpha=1.0, eps=1e-10)
        >>> a.round(4).tolist()
        [[0.4232], [0.4176], [0.4961]]
        """
        alpha = _check_alpha(alpha)
        variables = bind_arguments(self.variables, args)
        rhs = variables[self.unknown].data
        if isinstance(rhs, float):
            raise TypeError("KernelSolve: the right-hand side must be an array")
        sig = bind(variables)
        if sig.N != sig.M:
            raise ValueError(f"KernelSolve: the kernel must be square, got N = {sig.N}, M = {sig.M}")
        op = KernelOperator(self.formula, tuple(variables), self.unknown, self.axis, self.opts,
                            str(keops_backend(backend)).lower(), ranges)
        datas = [None if k == self.unknown else v.data for k, v in enumerate(variables)]
        return _solve(op, datas, rhs, alpha, eps, maxiter, verbose)
