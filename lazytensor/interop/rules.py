"""What NumPy and torch functions become on LazyTensors (the rules of :mod:`lazytensor.interop.protocols`).

Elementwise functions stay lazy; reductions over the i or j axis run one kernel, then
any other reduced axis (a batch axis, the other index) is reduced densely on the
O(N·D) result. Shapes follow NumPy/torch on ``K.shape``: ``(*batch, N, M)`` for a scalar
formula, ``(*batch, N, M, D)`` otherwise, so ``axis=-1`` is the j axis of a scalar
formula and the vector axis of a vector one, and ``np.sum(K, axis=1)`` has shape
``(N,)`` where the method ``K.sum(dim=1)`` gives pykeops's ``(N, 1)``.

>>> import numpy as np
>>> from lazytensor import Vi, Vj
>>> x, y = np.random.rand(5, 2), np.random.rand(4, 2)
>>> K = (-Vi(x).sqdist(Vj(y))).exp()
>>> reduce_axes(K, "sum", axis_set(K, 1), keepdims=False).shape
(5,)
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..api.lazy import LazyTensor
from ..core.binding import is_torch
from .softmax import SoftmaxLazyTensor, lse_leaf


class Unsupported(TypeError):
    """A call that has no lazy meaning; the dispatcher adds the function's name."""


# ---------------------------------------------------------------------- operands


def lazy_args(*objs) -> list:
    """``objs`` as LazyTensors; the others converted as ``K + o`` converts ``o``.

    Boolean arrays (conditions) take the dtype of the LazyTensors' data.
    """
    like = next(o for o in objs if isinstance(o, LazyTensor))
    out = []
    for o in objs:
        if not isinstance(o, LazyTensor):
            if _is_bool_array(o):
                o = _cast(o, like.dtype)
            # the conversion K + o applies: arrays by their shape, lists as K's dtype
            o = like._operand(o)
        out.append(o)
    return out


def _is_bool_array(o) -> bool:
    if is_torch(o):
        import torch

        return o.dtype == torch.bool
    return isinstance(o, np.ndarray) and o.dtype == np.bool_


def _cast(o, dtype):
    if is_torch(o):
        import torch

        return o.to(dtype if isinstance(dtype, torch.dtype) else torch.float64)
    return o.astype(dtype if isinstance(dtype, np.dtype) else np.float64)


def _lib_swap(v):
    """``v`` with its last two axes exchanged (NumPy or torch)."""
    return v.transpose(-1, -2) if is_torch(v) else np.swapaxes(v, -1, -2)


def _expand(res, axis: int):
    return res.unsqueeze(axis) if is_torch(res) else np.expand_dims(res, axis)


def _squeeze(res, formula_dim: int):
    """Drop the reductions' trailing vector axis of a scalar formula (NumPy shapes)."""
    return res[..., 0] if formula_dim == 1 else res


# ---------------------------------------------------------------------- axes


def _geometry(K):
    """(number of batch axes, the vector axis or None, number of axes of ``K.shape``)."""
    nb = K.nbatchdims
    vec = nb + 2 if K.formula.dim > 1 else None
    return nb, vec, nb + 2 + (vec is not None)


def axis_set(K, axis, empty_means_all: bool = False) -> tuple:
    """``axis`` (None, an int or a tuple, negative counted from the end of ``K.shape``) as
    sorted non-negative axes; None means every axis."""
    nd = _geometry(K)[2]
    if axis is None or (empty_means_all and isinstance(axis, (tuple, list)) and not axis):
        return tuple(range(nd))
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    out = []
    for a in items:
        if isinstance(a, bool) or not isinstance(a, numbers.Integral):
            raise Unsupported(f"axis must be an integer or a tuple of integers, got {axis!r}")
        b = int(a) + nd if a < 0 else int(a)
        if not 0 <= b < nd:
            raise ValueError(f"axis {a} is out of bounds for a LazyTensor of shape {K.shape}")
        if b in out:
            raise ValueError(f"repeated axis {a} in {axis!r}")
        out.append(b)
    return tuple(sorted(out))


def single_axis(K, axis, what: str) -> int:
    if axis is None or isinstance(axis, (tuple, list)):
        raise Unsupported(f"{what} needs one axis (axis=/dim= an integer), got {axis!r}")
    return axis_set(K, axis)[0]


def _index_axis(K, a: int, what: str) -> int:
    nb, vec, _ = _geometry(K)
    if a not in (nb, nb + 1):
        kind = "the vector axis" if a == vec else "a batch axis"
        raise ValueError(
            f"{what}: axis {a} of a LazyTensor of shape {K.shape} is {kind}; a lazy "
            f"{what} runs over i (axis {nb}) or j (axis {nb + 1})")
    return a


def _check_scalar(K, what: str):
    if K.formula.dim != 1:
        raise Unsupported(f"{what} over i or j needs a scalar formula (shape (..., N, M)), got "
                          f"{K.formula.dim} components (shape {K.shape}); take one with K[k]")


# ---------------------------------------------------------------------- reductions

_VECTOR = {"sum": lambda K: K.sum(-1), "min": lambda K: K.min(-1), "max": lambda K: K.max(-1)}
_INDEX = {"sum": "sum", "min": "min", "max": "max", "logsumexp": "logsumexp"}


def _dense_reduce(kind: str, res, axes: tuple):
    if is_torch(res):
        import torch

        return {"sum": torch.sum, "min": torch.amin, "max": torch.amax,
                "logsumexp": torch.logsumexp}[kind](res, dim=axes)
    if kind == "logsumexp":
        from scipy.special import logsumexp

        return logsumexp(res, axis=axes)
    return {"sum": np.sum, "min": np.min, "max": np.max}[kind](res, axis=axes)


def reduce_axes(K, kind: str, axes: tuple, keepdims: bool):
    """``kind`` ("sum", "mean", "min", "max", "logsumexp") of ``K`` over ``axes`` of ``K.shape``.

    The vector axis reduces symbolically; i or j with one kernel (j when both are
    reduced); the remaining reduced axes densely, on the kernel's output.
    """
    nb, vec, nd = _geometry(K)
    base = "sum" if kind == "mean" else kind
    count = int(np.prod([K.shape[a] for a in axes])) if kind == "mean" else 1
    out = K
    if vec in axes:
        if base not in _VECTOR:
            raise Unsupported(f"{kind} over the vector axis is not supported; reduce over i or j")
        out = _VECTOR[base](K)
    index = [a for a in axes if a in (nb, nb + 1)]
    if not index:
        if any(a != vec for a in axes):
            _index_axis(K, next(a for a in axes if a != vec), kind)
        if keepdims:
            raise Unsupported("keepdims=True over the vector axis only: the result is a "
                              "LazyTensor of one component (shape (..., N, M)); drop keepdims")
        return out / count if count != 1 else out
    dim = index[-1]
    if base == "logsumexp":
        _check_scalar(K, "logsumexp")
    res = _squeeze(getattr(out, _INDEX[base])(dim=dim), out.formula.dim)
    remaining = [a for a in range(nd) if a != dim and not (a == vec and vec in axes)]
    rest = tuple(remaining.index(a) for a in axes if a in remaining)
    if rest:
        res = _dense_reduce(base, res, rest)
    if count != 1:
        res = res / count
    if keepdims:
        for a in axes:
            res = _expand(res, a)
    return res


def arg_reduce(K, kind: str, axis, keepdims: bool):
    """``argmin``/``argmax`` of ``K`` along one axis (int64 indices; lazy on the vector axis)."""
    if axis is None:
        raise Unsupported(f"{kind} without an axis (a flat index into the N×M array) is not "
                          "supported; pass axis=/dim= (the i or j axis)")
    nb, vec, _ = _geometry(K)
    a = single_axis(K, axis, kind)
    if a == vec:
        if keepdims:
            raise Unsupported("keepdims=True over the vector axis: drop keepdims")
        return getattr(K, kind)(-1)
    res = _squeeze(getattr(K, kind)(dim=_index_axis(K, a, kind)), K.formula.dim)
    return _expand(res, a) if keepdims else res


def value_and_index(K, kind: str, axis, keepdims: bool):
    """``(min, argmin)`` or ``(max, argmax)`` along one axis, as ``torch.min(K, dim)``."""
    nb, vec, _ = _geometry(K)
    a = single_axis(K, axis, kind)
    if a == vec:
        if keepdims:
            raise Unsupported("keepdims=True over the vector axis: drop keepdims")
        return getattr(K, kind)(-1), getattr(K, "arg" + kind)(-1)
    pair = getattr(K, f"{kind}_arg{kind}")(dim=_index_axis(K, a, kind))
    pair = [_squeeze(r, K.formula.dim) for r in pair]
    return tuple(_expand(r, a) if keepdims else r for r in pair)


def topk(K, k, axis, largest: bool):
    """``(values, indices)`` of the k smallest (largest) along i or j, sorted, as ``torch.topk``."""
    nb, vec, _ = _geometry(K)
    a = _index_axis(K, single_axis(K, axis, "topk"), "topk")
    values, indices = (-K if largest else K).Kmin_argKmin(k, dim=a)
    if largest:
        values = -values
    if a == nb:  # over i: the k axis takes the place of i, before j (the methods put it after)
        first = -2 if K.formula.dim == 1 else -3
        values, indices = (np.swapaxes(r, first, first + 1) if not is_torch(r)
                           else r.transpose(first, first + 1) for r in (values, indices))
    return values, indices


# ---------------------------------------------------------------------- softmax


def softmax(K, axis, log: bool):
    """``softmax`` (a :class:`SoftmaxLazyTensor`) or ``log_softmax`` of K over i or j."""
    if axis is None:
        raise Unsupported("needs dim= (the i or j axis)")
    a = _index_axis(K, single_axis(K, axis, "softmax"), "softmax")
    _check_scalar(K, "softmax")
    if log:
        return K - lse_leaf(K, a)
    return SoftmaxLazyTensor(K, a)


# ---------------------------------------------------------------------- elementwise


def maximum(a, b):
    a, b = lazy_args(a, b)
    return a._op("max2", b)


def minimum(a, b):
    a, b = lazy_args(a, b)
    return a._op("min2", b)


def clip(x, low, high):
    """``min(max(x, low), high)``, NumPy's and torch's definition (``high`` wins if low > high).

    With bounds that are numbers, the ``clamp`` op: its gradient is torch.clamp's (x's own
    inside ``[low, high]``, edges included). Formula bounds go through ``maximum`` and
    ``minimum``, which split the gradient of a tie as torch's maximum and minimum do, and
    carry a NaN bound into the result as NumPy does."""
    if low is None and high is None:
        raise Unsupported("needs a lower or an upper bound")
    numbers_only = all(b is None or (isinstance(b, numbers.Real) and not isinstance(b, bool)
                                     and b == b) for b in (low, high))
    if numbers_only and isinstance(x, LazyTensor):
        lo = -math.inf if low is None else float(low)
        hi = math.inf if high is None else float(high)
        return x._op("clamp", min(lo, hi), hi)
    out = x if low is None else maximum(x, low)
    return out if high is None else minimum(out, high)


def where(condition, a, b):
    """``a`` where ``condition`` is non-zero (true), else ``b``: an ``ifelse`` on the mask."""
    if a is None or b is None:
        raise Unsupported("the one-argument form (indices of the non-zero entries) has no lazy "
                          "meaning; pass both values")
    c, a, b = lazy_args(condition, a, b)
    if c.formula.op not in ("lt", "le", "gt", "ge", "eq", "ne"):
        c = c != 0  # a comparison is already 0/1
    return (c - 0.5).ifelse(a, b)


def round_half_even(x: LazyTensor, decimals: int = 0) -> LazyTensor:
    """Round half to even, as ``np.round`` and ``torch.round`` (the method rounds half away
    from zero, as C): ``round(x)`` moved back by one at exact ties that land on an odd integer."""
    if isinstance(decimals, bool) or not isinstance(decimals, numbers.Integral):
        raise Unsupported(f"decimals must be an integer, got {decimals!r}")
    if decimals > 0:
        return round_half_even(x * float(10 ** decimals)) / float(10 ** decimals)
    if decimals < 0:
        return round_half_even(x / float(10 ** -decimals)) * float(10 ** -decimals)
    r = x.round()
    tie = (x - x.floor()) == 0.5
    odd = (r - 2 * (r / 2).floor()) == 1
    return r - x.sign() * tie * odd


def softplus(x: LazyTensor, beta=1.0, threshold=20.0) -> LazyTensor:
    """``torch.nn.functional.softplus``: ``softplus(beta x) / beta``, ``x`` where ``beta x >
    threshold``. At the default threshold (20) the overflow-free softplus is within 1e-9 of
    ``x``, so the branch is only taken for another threshold."""
    z = x * beta if beta != 1 else x
    out = z.softplus() if beta == 1 else z.softplus() / beta
    return out if threshold == 20 else where(z > threshold, x, out)


def arithmetic(name: str, input, a, b):
    """``a name b`` (add, sub, mul, div) for ``a, b = lazy_args(input, other)``: when
    ``input`` is not a LazyTensor (``torch.add(t, K)``, ``t * K``), the formula of the
    reflected operator (``K.__radd__(t)``: K's variables first, as pykeops numbers them)."""
    if not isinstance(input, LazyTensor) and name in ("add", "sub", "mul", "div"):
        return b._rop(name, a)
    return a._op(name, b)


def divide(a, b, rounding_mode=None):
    input = a
    a, b = lazy_args(a, b)
    q = arithmetic("div", input, a, b)
    if rounding_mode is None:
        return q
    if rounding_mode == "floor":
        return q.floor()
    if rounding_mode == "trunc":
        return q.sign() * q.abs().floor()
    raise ValueError(f"rounding_mode must be None, 'floor' or 'trunc', got {rounding_mode!r}")


def power(base, exponent):
    if isinstance(base, LazyTensor):
        return base ** exponent
    return exponent.__rpow__(base)


# ---------------------------------------------------------------------- products, norms


def matmul(a, b):
    """``K @ v`` (a reduction over j), or ``v @ K`` as ``(Kᵀ @ vᵀ)ᵀ`` (a reduction over i)."""
    if isinstance(a, LazyTensor):
        if isinstance(b, LazyTensor):
            raise Unsupported("a product of two LazyTensors has no lazy form; one side must be "
                              "a dense array")
        # the method itself: torch dynamo sends an ``@`` with a tensor operand back
        # through __torch_function__ (here), where Python calls __matmul__
        return a.__matmul__(b)
    v = a if hasattr(a, "ndim") else np.asarray(a, dtype=np.float64)
    if v.ndim == 1:
        return b.T @ v
    return _lib_swap(b.T @ _lib_swap(v))


def norm(K, ord, axis, keepdims: bool, empty_means_all: bool = False):
    """The 2-norm over ``axis`` (Frobenius over several axes): ``sqrt(Σ K²)``."""
    axes = axis_set(K, axis, empty_means_all)
    if ord is not None and (isinstance(ord, bool) or ord != 2 or len(axes) != 1):
        raise Unsupported(f"ord={ord!r} over {len(axes)} axes is not supported on LazyTensors; "
                          "the 2-norm over one axis (ord=None or 2) and the Frobenius norm over "
                          "several (ord=None) are")
    _, vec, _ = _geometry(K)
    if axes == (vec,) and not keepdims:
        return K.norm2()
    res = reduce_axes(K.square(), "sum", axes, keepdims)
    if isinstance(res, LazyTensor):
        return res.sqrt()
    return res.sqrt() if is_torch(res) else np.sqrt(res)


__all__ = ["Unsupported", "arg_reduce", "axis_set", "clip", "divide",
           "lazy_args", "matmul", "maximum", "minimum", "norm", "power", "reduce_axes",
           "round_half_even", "single_axis", "softmax", "softplus", "topk", "value_and_index",
           "where"]
