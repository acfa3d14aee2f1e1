"""pykeops's small helper modules, for the alias: ``pykeops.numpy.utils``, the messages of
``pykeops.common.utils`` and ``pykeops.common.gpu_utils`` (``pykeops.torch.utils``:
:mod:`lazytensor.compat.pykeops_torch_utils`; the rest of ``pykeops.common.utils``:
:mod:`lazytensor.compat.pykeops_common`).

KeOps's documentation scripts and benchmarks import dense reference kernels from them
(``np_kernel``, ``torch_kernel``, ``squared_distances``), warm-up calls (``WarmUpGpu``),
messages (``pyKeOps_Message``) and the GPU count (``get_gpu_number``); pykeops's own code
uses the array "tools" (``numpytools``, ``torchtools``). Each function here computes what
pykeops 2.3's does, on lazytensor. One deliberate difference: an unknown kernel name is
an error naming the known ones (pykeops's NumPy helpers return None).

>>> import numpy as np
>>> x, y = np.array([[0.0, 0.0], [1.0, 0.0]]), np.array([[0.0, 1.0]])
>>> squared_distances(x, y).tolist()
[[1.0], [2.0]]
>>> np_kernel(x, y, 1.0, "cauchy").tolist()
[[0.5], [0.3333333333333333]]
"""

from __future__ import annotations

import sys

import numpy as np

from ..api.genred import Genred as _Genred
from ..api.solve import KernelSolve as _KernelSolve
from ..scale.cluster import swap_axes as _swap_axes

KERNELS = ("gaussian", "laplacian", "cauchy", "inverse_multiquadric")

# ---------------------------------------------------------------------------- messages


def _verbose() -> bool:
    top = sys.modules.get("pykeops")
    return bool(getattr(top, "verbose", True))


def pyKeOps_Print(message, **kwargs) -> None:  # noqa: N802  (pykeops's names)
    """``print(message)`` unless ``pykeops.set_verbose(False)``."""
    if _verbose():
        print(message, **kwargs)


def pyKeOps_Message(message, use_tag: bool = True, **kwargs) -> None:  # noqa: N802
    """``[pyKeOps] message`` (without the tag for ``use_tag=False``), unless silenced.

    >>> pyKeOps_Message("hello")
    [pyKeOps] hello
    """
    pyKeOps_Print(("[pyKeOps] " if use_tag else "") + message, **kwargs)


def pyKeOps_Warning(message) -> None:  # noqa: N802
    """``[pyKeOps] Warning : message`` on stdout, unless silenced (as pykeops)."""
    pyKeOps_Print("[pyKeOps] Warning : " + message)


# ---------------------------------------------------------------------------- gpu_utils


def get_gpu_number() -> int:
    """The number of CUDA devices lazytensor can use (0 without a GPU or without torch)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# ---------------------------------------------------------------------------- numpy.utils


def squared_distances(x, y):
    """Dense ``|x_i - y_j|²`` (N, M) as ``|x|² + |y|² - 2 x yᵀ`` (NumPy or torch, as
    pykeops's two helpers of this name)."""
    x_norm = (x**2).sum(1).reshape(-1, 1)
    y_norm = (y**2).sum(1).reshape(1, -1)
    return x_norm + y_norm - 2.0 * (x @ y.T)


def differences(x, y):
    """``(D, N, M)`` array of ``x_i[d] - y_j[d]``."""
    return x.T[:, :, None] - y.T[:, None, :]


def _kernel_name(kernel, known=KERNELS):
    if kernel not in known:
        raise ValueError(f"unknown kernel {kernel!r}; expected one of {', '.join(known)}")
    return kernel


def np_kernel(x, y, s, kernel):
    """Dense kernel matrix ``k(x_i, y_j)`` of width ``s``: ``"gaussian"`` exp(-d²/s²),
    ``"laplacian"`` exp(-d/s), ``"cauchy"`` 1/(1 + d²/s²), ``"inverse_multiquadric"``
    1/sqrt(1 + d²/s²)."""
    u = squared_distances(x, y) / (s * s)
    return {"gaussian": lambda: np.exp(-u), "laplacian": lambda: np.exp(-np.sqrt(u)),
            "cauchy": lambda: 1.0 / (1 + u),
            "inverse_multiquadric": lambda: np.sqrt(1.0 / (1 + u))}[_kernel_name(kernel)]()


def log_np_kernel(x, y, s, kernel):
    """``log`` of :func:`np_kernel`, computed directly."""
    u = squared_distances(x, y) / (s * s)
    return {"gaussian": lambda: -u, "laplacian": lambda: -np.sqrt(u),
            "cauchy": lambda: -np.log(1 + u),
            "inverse_multiquadric": lambda: -0.5 * np.log(1.0 + u)}[_kernel_name(kernel)]()


def grad_np_kernel(x, y, s, kernel):
    """The derivative of :func:`np_kernel` with respect to the squared distance d²."""
    sq = squared_distances(x, y)
    u = sq / (s * s)
    if _kernel_name(kernel) == "gaussian":
        return -np.exp(-u) / (s * s)
    if kernel == "laplacian":
        t = -np.sqrt(u)
        return np.exp(t) / (2 * s * s * t)
    if kernel == "cauchy":
        return -1.0 / (s * (u + 1)) ** 2
    return -0.5 / ((s**2) * ((u + 1) ** 1.5))


def chain_rules(q, ax, by, Aa, p):
    """``res[i, d] = Σ_j q[i, j'] (2 (ax[i, d] - by[j, d]) Aa[i, j]) @ p`` per dimension d,
    in float32: the dense gradient that pykeops's tests compare with."""
    res = np.zeros(ax.shape, dtype=np.float32)
    for d in range(ax.shape[1]):
        diff = ax[:, d][:, None] - by[:, d][None, :]
        res[:, d] = np.sum(q * ((2 * diff * Aa) @ p), axis=1)
    return res


def log_sum_exp(mat, axis=0):
    """``log Σ exp(mat)`` along ``axis``, shifted by the maximum (stable).

    >>> bool(np.isclose(log_sum_exp(np.array([0.0, 0.0]), axis=0), np.log(2)))
    True
    """
    top = mat.max(axis=axis)
    return top + np.log(np.sum(np.exp(mat - np.expand_dims(top, axis=axis)), axis=axis))


def np_kernel_sphere(nalpha, nbeta, s, kernel):
    """Kernels on unit vectors from ``p = nalpha nbetaᵀ``: ``"binet"`` p², ``"linear"`` p,
    ``"gaussian_unoriented"`` exp((2p² - 2)/s²), ``"gaussian_oriented"`` exp((2p - 2)/s²)."""
    prs = nalpha @ nbeta.T
    known = ("binet", "linear", "gaussian_unoriented", "gaussian_oriented")
    return {"binet": lambda: prs**2, "linear": lambda: prs,
            "gaussian_unoriented": lambda: np.exp((-2.0 + 2.0 * prs * prs) / (s * s)),
            "gaussian_oriented": lambda: np.exp((-2.0 + 2.0 * prs) / (s * s)),
            }[_kernel_name(kernel, known)]()


def numpy_warm_up() -> None:
    """pykeops.numpy.utils's ``WarmUpGpu()``: the message, then (with a GPU) two small
    Gaussian convolutions in float64."""
    pyKeOps_Message("Warming up the Gpu (numpy bindings) !!!")
    if get_gpu_number() > 0:
        routine = _Genred("Exp(-oos2*SqDist(x,y))*b", ["x = Vi(1)", "y = Vj(1)", "b = Vj(1)",
                                                      "oos2 = Pm(1)"], reduction_op="Sum", axis=1)
        dum, dum2 = np.random.rand(10, 1), np.random.rand(10, 1)
        for _ in range(2):
            routine(dum, dum, dum2, np.array([1.0]))


def _np_complex_view(x, pairs):
    return x.view(pairs[str(x.dtype)]) if str(x.dtype) in pairs else None


class numpytools:  # noqa: N801  (pykeops's name)
    """pykeops's NumPy "tools": the array operations its generic code calls by name
    (``tools.zeros``, ``tools.contiguous`` ...), for NumPy arrays."""

    norm = staticmethod(np.linalg.norm)
    arraysum = staticmethod(np.sum)
    exp = staticmethod(np.exp)
    log = staticmethod(np.log)
    Genred = staticmethod(_Genred)
    KernelSolve = staticmethod(_KernelSolve)
    swap_axes = staticmethod(_swap_axes)
    arraytype = np.ndarray
    float_types = [float, np.float16, np.float32, np.float64]

    is_tensor = staticmethod(lambda x: isinstance(x, np.ndarray))
    copy = staticmethod(np.copy)
    eq = staticmethod(np.equal)
    transpose = staticmethod(lambda x: x.T)
    permute = staticmethod(lambda x, *axes: x.transpose(*axes))
    contiguous = staticmethod(np.ascontiguousarray)
    numpy = staticmethod(lambda x: x)
    tile = staticmethod(np.tile)
    solve = staticmethod(np.linalg.solve)
    size = staticmethod(lambda x: x.size)
    view = staticmethod(np.reshape)
    long = staticmethod(lambda x: x.astype("int64"))
    dtype = staticmethod(lambda x: x.dtype)
    dtypename = staticmethod(lambda dtype: dtype.name)
    rand = staticmethod(lambda m, n, dtype: np.random.rand(m, n).astype(dtype))
    randn = staticmethod(lambda m, n, dtype: np.random.randn(m, n).astype(dtype))
    zeros = staticmethod(lambda shape, dtype, device=None, requires_grad=None:
                         np.zeros(shape, dtype=dtype))
    empty = staticmethod(lambda shape, dtype, device=None, requires_grad=None:
                         np.empty(shape, dtype=dtype))
    eye = staticmethod(lambda n, dtype: np.eye(n, dtype=dtype))
    array = staticmethod(lambda x, dtype, device=None: np.array(x).astype(dtype))
    get_pointer = staticmethod(lambda x: x.__array_interface__["data"][0])
    device = staticmethod(lambda x: "cpu")
    device_type_index = staticmethod(lambda x: ("cpu", None))
    device_dict = staticmethod(lambda x: dict(cat="cpu"))

    @staticmethod
    def detect_complex(x) -> bool:
        """Whether ``x`` (a list, an array or a number) holds complex values."""
        if isinstance(x, list):
            return any(isinstance(v, complex) for v in x)
        if isinstance(x, np.ndarray):
            return bool(np.iscomplexobj(x))
        return isinstance(x, complex)

    @staticmethod
    def view_as_complex(x):
        """Pairs of floats as complex numbers (float32 -> complex64, float64 -> complex128)."""
        return _np_complex_view(x, {"float32": "complex64", "float64": "complex128"})

    @staticmethod
    def view_as_real(x):
        """Complex numbers as pairs of floats."""
        return _np_complex_view(x, {"complex64": "float32", "complex128": "float64"})
