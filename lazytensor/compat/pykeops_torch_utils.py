"""pykeops.torch.utils for the alias: ``torchtools``, ``squared_distances``, ``torch_kernel``.

Imports torch (as the module it stands for). See :mod:`lazytensor.compat.pykeops_utils`.

>>> import torch
>>> x = torch.tensor([[0.0], [1.0]])
>>> torch_kernel(x, x, 1.0, "gaussian").tolist()
[[1.0, 0.3678794503211975], [0.3678794503211975, 1.0]]
"""

from __future__ import annotations

import torch

from ..api.genred import Genred as _Genred
from ..api.solve import KernelSolve as _KernelSolve
from ..scale.cluster import swap_axes as _swap_axes
from .pykeops_utils import KERNELS, _kernel_name, squared_distances

__all__ = ["is_on_device", "squared_distances", "torch_kernel", "torchsolve", "torchtools"]


def is_on_device(x) -> bool:
    """Whether the tensor is on a CUDA device."""
    return x.is_cuda


def torchsolve(A, B):
    """``A⁻¹ B`` (``torch.linalg.solve``)."""
    return torch.linalg.solve(A, B)


def torch_kernel(x, y, s, kernel):
    """Dense kernel matrix of width ``s`` (the kernels of ``np_kernel``), in torch."""
    u = squared_distances(x, y) / (s * s)
    forms = {"gaussian": lambda: torch.exp(-u), "laplacian": lambda: torch.exp(-torch.sqrt(u)),
             "cauchy": lambda: 1.0 / (1 + u), "inverse_multiquadric": lambda: torch.rsqrt(1 + u)}
    return forms[_kernel_name(kernel, KERNELS)]()


_DTYPES = {"float16": torch.float16, "float32": torch.float32, "float64": torch.float64,
           "int32": torch.int32, "int64": torch.int64}


def _dtypename(dtype):
    if dtype is int:
        return int
    if dtype is list:
        return "float32"
    names = {torch.float16: "float16", torch.float32: "float32", torch.float64: "float64"}
    if dtype not in names:
        raise ValueError(f"[KeOps] {dtype} data type incompatible with KeOps.")
    return names[dtype]


def _array(x, dtype, device):
    if dtype not in _DTYPES:
        raise ValueError(f"[KeOps] data type {dtype} is incompatible with KeOps.")
    return torch.tensor(x, dtype=_DTYPES[dtype], device=device)


def _view_as_complex(x):
    return torch.view_as_complex(x.view(*x.shape[:-1], x.shape[-1] // 2, 2))


def _view_as_real(x):
    return torch.view_as_real(x).view(*x.shape[:-1], 2 * x.shape[-1])


class torchtools:  # noqa: N801  (pykeops's name)
    """pykeops's torch "tools": the tensor operations its generic code calls by name."""

    copy = staticmethod(torch.clone)
    exp = staticmethod(torch.exp)
    log = staticmethod(torch.log)
    norm = staticmethod(torch.norm)
    swap_axes = staticmethod(_swap_axes)
    Genred = staticmethod(_Genred)
    KernelSolve = staticmethod(_KernelSolve)
    arraytype = torch.Tensor
    float_types = [float]

    eq = staticmethod(torch.eq)
    transpose = staticmethod(lambda x: x.t())
    permute = staticmethod(lambda x, *dims: x.permute(*dims))
    contiguous = staticmethod(lambda x: x.contiguous())
    solve = staticmethod(lambda A, b: torchsolve(A, b).contiguous())
    arraysum = staticmethod(lambda x, axis=None: x.sum() if axis is None else x.sum(dim=axis))
    long = staticmethod(lambda x: x.long())
    size = staticmethod(lambda x: x.numel())
    tile = staticmethod(lambda *args: torch.Tensor.repeat(*args))
    numpy = staticmethod(lambda x: x.detach().cpu().numpy())
    view = staticmethod(lambda x, s: x.view(s))
    is_tensor = staticmethod(lambda x: isinstance(x, torch.Tensor))
    dtype = staticmethod(lambda x: x.dtype if hasattr(x, "dtype") else type(x))
    detect_complex = staticmethod(lambda x: any(isinstance(v, complex) for v in x)
                                  if isinstance(x, list) else torch.is_complex(x)
                                  if isinstance(x, torch.Tensor) else isinstance(x, complex))
    view_as_complex = staticmethod(_view_as_complex)
    view_as_real = staticmethod(_view_as_real)
    dtypename = staticmethod(_dtypename)
    rand = staticmethod(lambda m, n, dtype, device: torch.rand(m, n, dtype=dtype, device=device))
    randn = staticmethod(lambda m, n, dtype, device: torch.randn(m, n, dtype=dtype, device=device))
    zeros = staticmethod(lambda shape, dtype, device, requires_grad=False: torch.zeros(
        *shape, dtype=dtype, device=device, requires_grad=requires_grad))
    empty = staticmethod(lambda shape, dtype, device, requires_grad=False: torch.empty(
        *shape, dtype=dtype, device=device, requires_grad=requires_grad))
    eye = staticmethod(lambda n, dtype, device: torch.eye(n, dtype=dtype, device=device))
    array = staticmethod(_array)
    device = staticmethod(lambda x: x.device if isinstance(x, torch.Tensor) else None)
    get_pointer = staticmethod(lambda x: x.data_ptr())
    device_type_index = staticmethod(lambda x: (x.device.type, x.device.index)
                                     if isinstance(x, torch.Tensor) else (None, None))
    pointer = staticmethod(lambda x: x.data.data_ptr())
