"""Array namespaces used by the op references: NumPy for the oracle, torch for gathers.

Each op's reference is written once against this small namespace, so the same code
evaluates a formula densely in NumPy (the test oracle) and in torch (differentiable
evaluation at gathered indices, e.g. the gradient of a min reduction).
Arrays have the vector dimension last.
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import numpy as np

_SAME_NAMES = ("exp log sqrt abs sin cos tan tanh sinh cosh arcsin arccos arctan arctan2 arcsinh "
               "arccosh arctanh log1p expm1 floor ceil sign where maximum minimum").split()


def _numpy_erf(name):
    def f(a):
        from scipy import special

        return getattr(special, name)(a)

    return f


@functools.cache
def numpy_namespace() -> SimpleNamespace:
    ns = {name: getattr(np, name) for name in _SAME_NAMES}
    ns.update(
        erf=_numpy_erf("erf"),
        erfc=_numpy_erf("erfc"),
        vsum=lambda a: a.sum(axis=-1, keepdims=True),
        vmax=lambda a: a.max(axis=-1, keepdims=True),
        vmin=lambda a: a.min(axis=-1, keepdims=True),
        vargmax=lambda a: a.argmax(axis=-1)[..., None].astype(a.dtype),
        vargmin=lambda a: a.argmin(axis=-1)[..., None].astype(a.dtype),
        concat=lambda arrays: np.concatenate(_broadcast_leading(arrays, np), axis=-1),
        zeros_like=np.zeros_like,
        as_float=lambda cond, like: np.asarray(cond).astype(like.dtype),
        arange=lambda n, like: np.arange(n, dtype=like.dtype),
        asarray=lambda v, like: np.asarray(v, dtype=like.dtype),
        take_along=np.take_along_axis,
        stack=lambda arrays, axis: np.stack(arrays, axis=axis),
        cat=lambda arrays, axis: np.concatenate(arrays, axis=axis),
        float64=lambda a: np.asarray(a, dtype=np.float64),
        full=lambda shape, value, like: np.full(shape, value, dtype=like.dtype),
        pi=math.pi,
        name="numpy",
    )
    return SimpleNamespace(**ns)


def _broadcast_leading(arrays, lib):
    """Broadcast all but the last axis, so arrays can be concatenated on the last one."""
    shape = lib.broadcast_shapes(*[tuple(a.shape[:-1]) for a in arrays])
    return [lib.broadcast_to(a, (*shape, a.shape[-1])) for a in arrays]


def _torch_sqrt(a):
    """sqrt whose derivative at 0 is 0, as the sqrt op's (KeOps's convention; torch's is
    inf): the gradients computed through these references (of min, max and the K-min
    family, at the pairs their indices select) then agree with the kernels'."""
    import torch

    if not a.requires_grad:
        return torch.sqrt(a)
    zero = a == 0
    return torch.where(zero, torch.zeros_like(a), torch.sqrt(torch.where(zero, torch.ones_like(a), a)))


@functools.cache
def torch_namespace() -> SimpleNamespace:
    import torch

    ns = {name: getattr(torch, name) for name in _SAME_NAMES}
    ns.update(
        sqrt=_torch_sqrt,
        erf=torch.erf,
        erfc=torch.erfc,
        vsum=lambda a: a.sum(dim=-1, keepdim=True),
        vmax=lambda a: a.max(dim=-1, keepdim=True).values,
        vmin=lambda a: a.min(dim=-1, keepdim=True).values,
        vargmax=lambda a: a.argmax(dim=-1, keepdim=True).to(a.dtype),
        vargmin=lambda a: a.argmin(dim=-1, keepdim=True).to(a.dtype),
        concat=lambda arrays: torch.cat(_broadcast_leading(arrays, torch), dim=-1),
        zeros_like=torch.zeros_like,
        as_float=lambda cond, like: cond.to(like.dtype),
        arange=lambda n, like: torch.arange(n, dtype=like.dtype, device=like.device),
        asarray=lambda v, like: torch.as_tensor(v, dtype=like.dtype, device=like.device),
        take_along=lambda a, index, axis: torch.gather(a, axis, index),
        stack=lambda arrays, axis: torch.stack(arrays, dim=axis),
        cat=lambda arrays, axis: torch.cat(arrays, dim=axis),
        float64=lambda a: a.to(torch.float64),
        full=lambda shape, value, like: torch.full(shape, value, dtype=like.dtype,
                                                   device=like.device),
        pi=math.pi,
        name="torch",
    )
    return SimpleNamespace(**ns)


def namespace_of(array) -> SimpleNamespace:
    """The namespace of an array's library: torch for torch tensors, else NumPy."""
    if type(array).__module__.startswith("torch"):
        return torch_namespace()
    return numpy_namespace()
