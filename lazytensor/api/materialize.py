"""Materialising a LazyTensor as a dense array, on purpose only (``K.dense()``).

A LazyTensor stands for an array of shape ``(*batch, N, M, D)`` that is never built:
reductions stream over it. :func:`dense` builds it anyway, for small problems and
debugging, chunk by chunk over the rows (bounded temporaries) with the reference
evaluator in the data's own library, dtype and device, so torch gradients flow through
it. It refuses above ``max_bytes``. Implicit conversions (``np.asarray(K)``,
``torch.as_tensor(K)``) refuse with :func:`refuse_implicit`, which says how big the
array would be.

>>> import numpy as np
>>> from lazytensor import Vi, Vj
>>> x, y = np.random.rand(4, 2), np.random.rand(3, 2)
>>> D = Vi(x).sqdist(Vj(y)).dense()
>>> D.shape, bool(np.allclose(D, ((x[:, None] - y[None]) ** 2).sum(-1)))
((4, 3), True)
"""

from __future__ import annotations

import math

import numpy as np

from ..codegen import arraymath, ir
from ..codegen.evaluate import evaluate
from ..core.binding import Slot, bind

DEFAULT_MAX_BYTES = 1 << 28  # 256 MiB: a 8192 x 8192 float32 kernel
CHUNK_ELEMENTS = 1 << 22  # pair-components evaluated at once (as the reference evaluator)


def _size_text(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} bytes"


def dense_shape(K) -> tuple:
    """``K.shape``: ``(*batch, N, M, D)``, or ``(*batch, N, M)`` for a scalar formula."""
    return tuple(K.shape)


def dense_nbytes(K) -> int:
    """Bytes of the dense array ``K`` stands for (in its data's dtype, float64 without data)."""
    itemsize = np.dtype(bind(K.variables).dtype).itemsize if K.variables else 8
    return math.prod(dense_shape(K)) * itemsize


def describe_dense(K) -> str:
    """``shape (1000, 2000), float32: 7.6 MiB`` for messages."""
    dtype = bind(K.variables).dtype if K.variables else "float64"
    return f"shape {dense_shape(K)}, {dtype}: {_size_text(dense_nbytes(K))}"


def refuse_implicit(K, what: str):
    """Raise the TypeError of an implicit dense conversion (``np.asarray(K)``, ...)."""
    raise TypeError(
        f"{what}: a LazyTensor is a symbolic array and is not converted implicitly (the dense "
        f"array would have {describe_dense(K)}). Reduce it (K.sum(dim=1), K @ v, np.sum(K, "
        "axis=1), torch.logsumexp(K, dim=1), ...) or materialise it on purpose with "
        "K.dense(max_bytes=...)")


def dense(K, max_bytes: int = DEFAULT_MAX_BYTES):
    """The dense array of shape ``K.shape``, in the library, dtype and device of K's data.

    Evaluated by chunks of rows with the reference evaluator; differentiable for torch
    data. Refuses (ValueError) when the array would take more than ``max_bytes``, and for
    block-sparse ``K`` (``K.ranges``: pairs outside the blocks have no value).

    >>> import torch
    >>> from lazytensor import Vi, Vj
    >>> x = torch.rand(5, 3, requires_grad=True)
    >>> G = (-Vi(x).sqdist(Vj(x))).exp().dense()
    >>> G.shape, G.dtype
    (torch.Size([5, 5]), torch.float32)
    >>> G.sum().backward(); x.grad.shape
    torch.Size([5, 3])
    """
    symbolic = [v.label for v in K.variables if isinstance(v.data, Slot)]
    if symbolic:
        raise ValueError(f"K.dense(): K holds symbolic variables ({', '.join(symbolic)}), which "
                         "have no arrays until a reduction of K is called; reduce K "
                         "(f = K.sum(dim=1); f(x, y)) or build K on the arrays")
    if K.ranges is not None:
        raise ValueError("K.dense(): K has block-sparse ranges (pairs outside the blocks are "
                         "left out of the reductions and have no dense value); drop K.ranges first")
    nbytes = dense_nbytes(K)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, float)):
        raise TypeError(f"K.dense(): max_bytes must be a number of bytes, got {max_bytes!r}")
    if nbytes > max_bytes:
        raise ValueError(
            f"K.dense(): the dense array would have {describe_dense(K)}, more than "
            f"max_bytes={int(max_bytes)} ({_size_text(int(max_bytes))}); pass a larger max_bytes "
            "if you mean it, or reduce K instead (K.sum(dim=1), K @ v, K.argKmin(k, dim=1))")
    sig = bind(K.variables) if K.variables else None
    torch_lib = sig is not None and sig.library == "torch"
    xp = arraymath.torch_namespace() if torch_lib else arraymath.numpy_namespace()
    batch, N, M = (sig.batch, sig.N, sig.M) if sig else ((), 1, 1)
    D = K.formula.dim
    dtype = sig.dtype if sig else "float64"
    used = {v.index for v in ir.variables(K.formula)}
    width = max(n.dim for n in ir.topo_order(K.formula))
    step = max(1, CHUNK_ELEMENTS // max(1, math.prod(batch) * M * width))
    chunks = []
    with np.errstate(all="ignore"):
        for i0 in range(0, N, step):
            i1 = min(N, i0 + step)
            env = {k: _chunk_view(v, len(batch), i0, i1, dtype, sig)
                   for k, v in enumerate(K.variables) if k in used}
            if not env:  # a formula of constants
                env = {-1: _full((1, 1, 1), 0.0, dtype, sig)}
            values = evaluate(K.formula, env, xp)
            shape = (*batch, i1 - i0, M, D)
            if torch_lib:
                chunks.append(values.to(getattr(_torch(), dtype)).broadcast_to(shape))
            else:
                chunks.append(np.broadcast_to(values.astype(dtype, copy=False), shape))
    if torch_lib:
        out = _torch().cat(chunks, dim=-3) if chunks else _torch().empty(
            (*batch, 0, M, D), dtype=getattr(_torch(), dtype), device=sig.device)
    else:
        out = np.concatenate(chunks, axis=-3) if chunks else np.empty((*batch, 0, M, D), dtype)
    return out[..., 0] if D == 1 else out


def _torch():
    import torch

    return torch


def _full(shape, value, dtype, sig):
    if sig is not None and sig.library == "torch":
        torch = _torch()
        return torch.full(shape, float(value), dtype=getattr(torch, dtype), device=sig.device)
    return np.full(shape, float(value), dtype=dtype)


def _chunk_view(v, nbd: int, i0: int, i1: int, dtype: str, sig):
    """Variable ``v`` on rows ``i0:i1``, shaped to broadcast to ``(*batch, rows, M, dim)``."""
    if v.is_scalar:
        return _full((1, 1, 1), v.data, dtype, sig)
    a = v.data
    a = a.reshape((1,) * (nbd - len(v.batch)) + tuple(a.shape))
    if v.cat == "i":
        return a[..., i0:i1, None, :]
    if v.cat == "j":
        return a[..., None, :, :]
    return a[..., None, None, :]


__all__ = ["DEFAULT_MAX_BYTES", "dense", "dense_nbytes", "describe_dense", "refuse_implicit"]
