"""Binding arrays to formula variables: shapes, dtypes, devices and batch dimensions.

Each variable is stored in canonical form: an i-variable ``(*batch, N, D)``, a
j-variable ``(*batch, M, D)``, a parameter ``(*batch, D)`` (or a Python number).
:func:`bind` checks a set of variables against each other and returns a
:class:`Signature`: library, dtype, device, broadcast batch shape, N and M. Every error
names the variable, its shape and what was expected.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field

import numpy as np

from ..errors import ArgumentTypeError

CAT_NAMES = {"i": "i-variable", "j": "j-variable", "p": "parameter"}


def is_torch(x) -> bool:
    """True for torch tensors, without importing torch for NumPy users."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def check_dense(x, what: str) -> None:
    """Refuse arrays whose values are not all there to read as one block: a sparse torch
    tensor (COO, CSR, ... layouts) and a NumPy masked array (its mask would be dropped).
    ``what`` names the argument in the message (a TypeError).

    >>> check_dense(np.ma.masked_array([1.0, 2.0], mask=[0, 1]), "Vi's x")
    Traceback (most recent call last):
    ...
    lazytensor.errors.ArgumentTypeError: Vi's x: a masked NumPy array (shape (2,)) would lose its mask; expected a plain array: convert it with .filled(value) (or take its .data)
    """
    if is_torch(x):
        layout = x.layout
        if layout is not sys.modules["torch"].strided:
            raise ArgumentTypeError(
                f"{what}: a sparse torch tensor (layout {layout}, shape {tuple(x.shape)}); "
                "expected a dense (strided) tensor: convert it with .to_dense()")
    elif isinstance(x, np.ma.MaskedArray):
        raise ArgumentTypeError(
            f"{what}: a masked NumPy array (shape {x.shape}) would lose its mask; expected a "
            "plain array: convert it with .filled(value) (or take its .data)")


def array_dtype(x) -> str:
    if is_torch(x):
        return str(x.dtype).replace("torch.", "")
    return str(np.asarray(x).dtype) if not isinstance(x, np.ndarray) else str(x.dtype)


@dataclass(frozen=True)
class Slot:
    """The data of a symbolic variable (pykeops's ``Vi(index, dim)``): argument ``index``
    of the call, bound when the reduction is called (:mod:`lazytensor.api.symbolic`).

    >>> Variable(Slot(0), "i", 3).describe()
    'i-variable (symbolic: argument 0 of the call, dimension 3)'
    """

    index: int


@dataclass(eq=False)
class Variable:
    """One bound variable: data in canonical form, category, vector dimension."""

    data: object  # numpy array, torch tensor, Python float (a scalar parameter), or Slot
    cat: str
    dim: int
    label: str = ""
    io_dtype: str = ""  # "float16"/"bfloat16": half data held as float32 (lazytensor.core.half)
    # no array of its own: a Python number, or a Slot (whose array comes at call time, so
    # that shapes, dtypes and batch dimensions skip it as they skip numbers)
    is_scalar: bool = field(init=False, repr=False)  # (read on every call)

    def __post_init__(self):
        self.is_scalar = isinstance(self.data, (int, float, Slot))

    @property
    def shape(self) -> tuple:
        return () if self.is_scalar else tuple(self.data.shape)

    @property
    def batch(self) -> tuple:
        if self.is_scalar:
            return ()
        return self.shape[:-2] if self.cat in ("i", "j") else self.shape[:-1]

    @property
    def rows(self) -> int | None:
        return self.shape[-2] if self.cat in ("i", "j") and not self.is_scalar else None

    def describe(self, k: int | None = None) -> str:
        where = f"argument {k} " if k is not None else ""
        name = f" '{self.label}'" if self.label else ""
        if isinstance(self.data, Slot):
            return (f"{where}{CAT_NAMES[self.cat]}{name} (symbolic: argument {self.data.index} "
                    f"of the call, dimension {self.dim})")
        if self.is_scalar:
            return f"{where}{CAT_NAMES[self.cat]}{name} (Python scalar {self.data!r})"
        return (f"{where}{CAT_NAMES[self.cat]}{name} (shape {self.shape}, "
                f"dtype {self.io_dtype or array_dtype(self.data)}{_device_text(self.data)})")


def _device_text(x) -> str:
    return f", device {x.device}" if is_torch(x) else ""


@dataclass
class Signature:
    """What a reduction call is bound to."""

    library: str  # "numpy" or "torch"
    dtype: str  # "float32" or "float64"
    device: str  # "cpu" or "cuda:k"
    batch: tuple
    N: int
    M: int
    variables: list = field(default_factory=list)

    @property
    def B(self) -> int:
        return math.prod(self.batch)


SUPPORTED_DTYPES = ("float32", "float64")


def bind(variables: list[Variable]) -> Signature:
    """Check the variables against each other; raise ValueError/TypeError naming the culprit."""
    arrays = [(k, v) for k, v in enumerate(variables) if not v.is_scalar]
    libs = {("torch" if is_torch(v.data) else "numpy") for _, v in arrays}
    if len(libs) > 1:
        desc = "; ".join(v.describe(k) for k, v in arrays)
        raise ArgumentTypeError(f"cannot mix NumPy arrays and torch tensors in one formula: {desc}")
    library = libs.pop() if libs else "numpy"

    dtypes = {}
    for k, v in arrays:
        dt = array_dtype(v.data)
        if dt not in SUPPORTED_DTYPES:
            raise ArgumentTypeError(
                f"{v.describe(k)}: unsupported dtype {dt}; expected float32 or float64 "
                "(convert integer data with .astype(np.float32) / .float())"
            )
        dtypes[k] = dt
    if len(set(dtypes.values())) > 1:
        desc = "; ".join(variables[k].describe(k) for k in dtypes)
        raise ArgumentTypeError(f"mixed dtypes in one formula ({desc}); convert all to one dtype")
    dtype = next(iter(dtypes.values()), "float64")

    devices = {str(v.data.device) for _, v in arrays if is_torch(v.data)}
    if len(devices) > 1:
        desc = "; ".join(v.describe(k) for k, v in arrays)
        raise ValueError(f"variables on different devices: {desc}")
    device = devices.pop() if devices else "cpu"

    nbd = max([0, *(len(v.batch) for _, v in arrays)])
    batch = []
    for axis in range(nbd):
        size = 1
        for k, v in arrays:
            b = (1,) * (nbd - len(v.batch)) + v.batch
            if b[axis] != 1:
                if size not in (1, b[axis]):
                    raise ValueError(
                        f"{v.describe(k)}: batch dimension {axis} has size {b[axis]}, but "
                        f"another variable has {size}; batch dimensions must be equal or 1"
                    )
                size = b[axis]
        batch.append(size)

    def rows(cat, name):
        n = None
        first = None
        for k, v in arrays:
            if v.cat != cat:
                continue
            if n is None:
                n, first = v.rows, k
            elif v.rows != n:
                raise ValueError(
                    f"{v.describe(k)} has {v.rows} {name}, but {variables[first].describe(first)} "
                    f"has {n}; all {CAT_NAMES[cat]}s must have the same number of {name}"
                )
        return n

    N = rows("i", "rows")
    M = rows("j", "rows")
    return Signature(library, dtype, device, tuple(batch), 1 if N is None else N,
                     1 if M is None else M, list(variables))


def copy_into(out, result):
    """Copy a reduction's ``result`` into the user's ``out`` array and return ``out``: of
    the same library, shape, dtype and device as the result, else a clear error (never a
    broadcast or a cast).

    >>> import numpy as np
    >>> copy_into(np.zeros((2, 1)), np.ones((2, 1))).tolist()
    [[1.0], [1.0]]
    >>> copy_into(np.zeros((2, 3)), np.ones((2, 1)))
    Traceback (most recent call last):
    ...
    ValueError: out: expected an array of shape (2, 1), dtype float64 (the result's), got shape (2, 3), dtype float64
    """
    if isinstance(result, tuple):
        raise TypeError(f"out: this reduction has {len(result)} outputs; out= takes one "
                        "array, so call it without out= and copy the outputs yourself")
    kind = "a tensor" if is_torch(result) else "an array"
    if is_torch(out) != is_torch(result):
        raise TypeError(f"out: expected a {'torch tensor' if is_torch(result) else 'NumPy array'}"
                        f" (as the inputs), got {type(out).__name__}")
    want = (tuple(result.shape), array_dtype(result), _device_text(result))
    got = (tuple(out.shape), array_dtype(out), _device_text(out))
    if want != got:
        raise ValueError(f"out: expected {kind} of shape {want[0]}, dtype {want[1]}{want[2]} "
                         f"(the result's), got shape {got[0]}, dtype {got[1]}{got[2]}")
    if is_torch(out):
        out.copy_(result)
    else:
        np.copyto(out, result)
    return out
