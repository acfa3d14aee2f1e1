"""``LazyTensor``: symbolic formulas over i- and j-indexed arrays, as in pykeops.

>>> import numpy as np
>>> from lazytensor import LazyTensor
>>> x = np.random.rand(1000, 3); y = np.random.rand(2000, 3); b = np.random.rand(2000, 1)
>>> x_i, y_j = LazyTensor(x[:, None, :]), LazyTensor(y[None, :, :])
>>> K = (-((x_i - y_j) ** 2).sum(-1)).exp()        # symbolic (1000, 2000) kernel
>>> (K @ b).shape                                   # a reduction triggers evaluation
(1000, 1)
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import numbers
import re
import sys
from typing import Any, Sequence

import numpy as np

from .. import fastsum
from ..codegen import compositions, ir, ops, reductions
from ..core import half
from ..core.binding import Variable, array_dtype, bind, check_dense, copy_into, is_torch
from ..core.options import integer_option, integer_value, split_reduction_keywords
from ..distributed import context as distributed_context
from ..engine import plans as engine
from ..errors import ArgumentTypeError
from ..scale.cluster import swap_axes
from . import complex_methods, materialize, symbolic
from . import solve as linear_solve
from .complex_methods import ComplexMethods, RealToComplexMethods, is_complex_operand
from .keops_methods import KeOpsMethods
from .typehints import Array, Reduced


def _interop():
    """:mod:`lazytensor.interop.protocols`, loaded by name on first use: it sits above this module (its
    rules build LazyTensors and subclass it), so this module names it instead of importing
    it, and the import graph keeps one direction. (Found in ``sys.modules`` once loaded:
    torch dynamo traces a dict lookup, not ``importlib``.)"""
    module = sys.modules.get(_INTEROP)
    return module if module is not None else importlib.import_module("..interop.protocols",
                                                                     __package__)


_INTEROP = importlib.util.resolve_name("..interop.protocols", __package__)



def _canonical(x, axis):
    """(data in canonical form, category, dim, batch dims) from a user array."""
    nd = x.ndim
    if axis is not None:
        if isinstance(axis, bool) or axis not in (0, 1, 2):
            raise ValueError(f"axis must be 0 (i), 1 (j) or 2 (parameter), got {axis!r}")
        if axis == 2:
            if nd != 1:
                raise ValueError(f"a parameter (axis=2) must be 1D, got shape {tuple(x.shape)}")
            return x, "p"
        if nd == 1:
            x = x[:, None]
        if x.ndim != 2:
            raise ValueError(
                f"LazyTensor(x, axis={axis}) expects a 2D array (rows, dim), got shape {tuple(x.shape)}"
            )
        return x, "i" if axis == 0 else "j"
    if nd == 0:
        return x.reshape(1), "p"
    if nd == 1:
        return x, "p"
    if nd == 2:
        raise ValueError(
            f"LazyTensor got a 2D array of shape {tuple(x.shape)}: say which index it follows with "
            "LazyTensor(x, axis=0) (i) or axis=1 (j), or reshape it to (N, 1, D) / (1, M, D)"
        )
    # squeeze, not x[..., 0, :]: its gradient is a view, where a select's gradient
    # fills an array of zeros and copies into it (two passes over the input per backward)
    a, b = x.shape[-3], x.shape[-2]
    if b == 1:
        if a == 1:
            return x.squeeze(-2).squeeze(-2), "p"
        return x.squeeze(-2), "i"
    if a == 1:
        return x.squeeze(-3), "j"
    raise ValueError(
        f"LazyTensor got shape {tuple(x.shape)}: the last three dimensions must be (N, 1, D) for an "
        "i-variable, (1, M, D) for a j-variable or (1, 1, D) for a parameter"
    )


_ARGUMENT_NAMES = {0: "Vi's x", 1: "Vj's x", 2: "Pm's x"}  # by axis, for the errors
_matmul_formulas: dict = {}  # (K's formula, v's variable index, v's dim) -> K * v_j


def _as_array(x, what: str = "LazyTensor's x"):
    if is_torch(x) or isinstance(x, np.ndarray):
        check_dense(x, what)
        return x
    if isinstance(x, (list, tuple)):
        try:
            return np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise ArgumentTypeError(f"LazyTensor cannot convert a {type(x).__name__} to a float64 array: {e}") from None
    raise ArgumentTypeError(f"LazyTensor cannot wrap an object of type {type(x).__name__}")


class LazyTensor(KeOpsMethods, RealToComplexMethods):
    """A symbolic array of shape ``(*batch, N, M, D)`` defined by a formula.

    Build leaves from arrays (``LazyTensor(x[:, None, :])``, ``Vi(x)``, ``Vj(y)``, ``Pm(p)``),
    combine them with arithmetic and math methods, and reduce with ``.sum(dim)``,
    ``.min(dim)``, ``.argKmin(K, dim)``, ``.logsumexp(dim)``, ``@`` ...
    Complex data makes a :class:`ComplexLazyTensor`.

    ``x`` of shape ``(N, 1, D)`` is indexed by i, ``(1, M, D)`` by j, ``(D,)`` or
    ``(1, 1, D)`` is a parameter (leading batch dimensions allowed); a 2D ``(N, D)`` array
    needs ``axis=0`` (i) or ``axis=1`` (j); a float is a scalar parameter; a tuple of three
    integers ``(index, dim, cat)`` a symbolic variable (:mod:`lazytensor.api.symbolic`).

    >>> x = LazyTensor(np.array([[0.0], [1.0], [3.0]])[:, None, :])   # (3, 1, 1): i
    >>> y = LazyTensor(np.array([[0.0], [2.0]]), axis=1)               # (1, 2, 1): j
    >>> D = ((x - y) ** 2).sum(-1)
    >>> D.shape
    (3, 2)
    >>> D.sum(dim=1).tolist()
    [[4.0], [2.0], [10.0]]
    """

    __array_priority__ = 1000  # numpy_array * LazyTensor -> LazyTensor.__rmul__
    ranges = None  # block-sparsity (see lazytensor.scale.ranges), kept through operations

    def __new__(cls, x=None, *args, **kwargs):
        if cls is LazyTensor and x is not None and is_complex_operand(x):
            cls = ComplexLazyTensor
        return object.__new__(cls)

    def __init__(self, x: LazyTensor | Array | float | Sequence[float] | None = None,
                 axis: int | None = None, *, _formula: ir.Node | None = None,
                 _variables: Sequence[Variable] | None = None, label: str = ""):
        if _formula is not None:
            self.formula, self.variables = _formula, list(_variables)
            return
        if isinstance(x, LazyTensor):
            self.formula, self.variables = x.formula, list(x.variables)
            return
        if isinstance(x, numbers.Number) and not isinstance(x, bool):
            if isinstance(x, numbers.Integral):
                self.formula, self.variables = ir.const(float(x)), []
            else:
                self.formula = ir.var(0, 1, "p")
                self.variables = [Variable(float(x), "p", 1, label)]
            return
        if isinstance(x, tuple) and len(x) == 3 and all(_is_int(v) for v in x):
            # (index, dim, cat): a symbolic variable, bound at call time (lazytensor.api.symbolic)
            v = symbolic.leaf(*x, call=f"LazyTensor({x})")
            self.formula, self.variables = ir.var(0, v.dim, v.cat), [v]
            return
        data, cat = _canonical(_as_array(x, _ARGUMENT_NAMES.get(axis, "LazyTensor's x")), axis)
        dim = int(data.shape[-1])
        if dim < 1:
            raise ValueError(f"LazyTensor got shape {tuple(x.shape)}: the vector dimension is 0")
        if data.is_complex() if is_torch(data) else np.iscomplexobj(data):
            raise ArgumentTypeError(f"LazyTensor got complex data (shape {tuple(x.shape)}, dtype "
                            f"{array_dtype(data)}); expected float32 or float64")
        io_dtype = half.half_dtype(data)
        if io_dtype:  # computed in float32, returned in this dtype (lazytensor.core.half)
            data = half.to_compute(data)
        self.formula = ir.var(0, dim, cat)
        self.variables = [Variable(data, cat, dim, label, io_dtype)]

    # ------------------------------------------------------------------ structure

    @classmethod
    def _new(cls, formula, variables):
        return cls(_formula=formula, _variables=variables)

    @property
    def ndim(self) -> int:
        """The vector dimension D, as pykeops's ``LazyTensor.ndim`` (not the number of axes:
        that is :meth:`dim`, as in torch).

        >>> Vi(np.zeros((4, 3))).ndim, Vi(np.zeros((4, 3))).sqnorm2().ndim
        (3, 1)
        """
        return self.formula.dim

    def dim(self) -> int:
        """The number of axes of ``(*batch, N, M, D)``: ``nbatchdims + 3``, as pykeops.

        >>> Vi(np.zeros((4, 3))).dim(), LazyTensor(np.zeros((2, 4, 1, 3))).dim()
        (3, 4)
        """
        return self.nbatchdims + 3

    @property
    def nbatchdims(self) -> int:
        """The number of batch dimensions (leading axes before ``N, M, D``).

        >>> Vi(np.zeros((4, 3))).nbatchdims, LazyTensor(np.zeros((5, 4, 1, 3))).nbatchdims
        (0, 1)
        """
        nb = 0  # (on every reduction: kept cheap, no shape tuples)
        for v in self.variables:
            if not v.is_scalar:
                nb = max(nb, v.data.ndim - (1 if v.cat == "p" else 2))
        return nb

    @property
    def batchdims(self) -> tuple:
        """The batch dimensions ``batch`` of ``(*batch, N, M, D)`` (broadcast across variables).

        >>> (LazyTensor(np.zeros((5, 4, 1, 3))) - LazyTensor(np.zeros((1, 1, 2, 3)))).batchdims
        (5,)
        """
        return bind(self.variables).batch if self.variables else ()

    @property
    def ni(self) -> int:
        """N, the number of i-indices (1 without i-variable).

        >>> K = Vi(np.zeros((4, 3))) - Vj(np.zeros((2, 3)))
        >>> K.ni, K.nj
        (4, 2)
        """
        return bind(self.variables).N

    @property
    def nj(self) -> int:
        """M, the number of j-indices (1 without j-variable).

        >>> Vi(np.zeros((4, 3))).nj, Vj(np.zeros((2, 3))).nj
        (1, 2)
        """
        return bind(self.variables).M

    @property
    def shape(self) -> tuple:
        """``(*batch, N, M, D)``; ``(*batch, N, M)`` for a scalar formula, as pykeops (and as
        ``scipy.sparse.linalg.aslinearoperator`` needs).

        >>> x, y = Vi(np.zeros((4, 3))), Vj(np.zeros((2, 3)))
        >>> (x - y).shape, x.sqdist(y).shape
        ((4, 2, 3), (4, 2))
        """
        sig = bind(self.variables)
        D = self.formula.dim
        return (*sig.batch, sig.N, sig.M) if D == 1 else (*sig.batch, sig.N, sig.M, D)

    @property
    def dtype(self) -> Any:
        """The dtype of the wrapped arrays (NumPy or torch); None for a formula of constants.

        >>> Vi(np.zeros((4, 3), dtype=np.float32)).exp().dtype
        dtype('float32')
        """
        for v in self.variables:
            if not v.is_scalar:
                return half.dtype_object(v.data, v.io_dtype) if v.io_dtype else v.data.dtype
        return None

    def __str__(self) -> str:
        """As pykeops: "KeOps LazyTensor", the formula in pykeops's notation, the shape.

        >>> print(Vi(np.zeros((4, 3))).sqdist(Vj(np.zeros((2, 3)))))
        KeOps LazyTensor
            formula: Sum(Square((Var(0,3,0) - Var(1,3,1))))
            shape: (4, 2)
        """
        return symbolic.describe(self)

    __repr__ = __str__

    # ------------------------------------------------------------------ NumPy and torch
    # np.exp(K), np.sum(K, axis=1), torch.logsumexp(K, dim=1), t + K ... (lazytensor.interop.protocols).
    # No implicit dense copy: np.asarray(K), and torch.as_tensor(K) through len(K), refuse.

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _interop().array_ufunc(ufunc, method, inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return _interop().array_function(func, types, args, kwargs)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _interop().torch_function(func, types, args, kwargs)

    def __array__(self, dtype=None, copy=None):
        materialize.refuse_implicit(self, "np.asarray(K) / np.array(K)")

    def __len__(self):
        materialize.refuse_implicit(self, "len(K) / torch.as_tensor(K) / torch.tensor(K)")

    def __bool__(self) -> bool:  # truthy as any object (Python would ask __len__ otherwise)
        return True

    def dense(self, max_bytes: int = materialize.DEFAULT_MAX_BYTES) -> Array:
        """The dense array of shape ``K.shape`` (chunked; differentiable for torch data), for
        small problems and debugging; refuses above ``max_bytes`` (default 256 MiB).

        >>> x = np.random.rand(4, 2)
        >>> Vi(x).sqdist(Vj(x)).dense().shape
        (4, 4)
        """
        return materialize.dense(self, max_bytes)

    def _merged(self, other: LazyTensor):
        """Variables of both operands (shared ones once) and ``other``'s formula renumbered."""
        variables = list(self.variables)
        mapping = {}
        for k, v in enumerate(other.variables):
            for n, w in enumerate(variables):  # noqa: B007  (n is read after the loop)
                # The same Variable object (a shared scalar parameter too) is one variable:
                # otherwise f * f doubles f's scalars and repeated sharing grows exponentially.
                if w is v or (w.data is v.data and w.cat == v.cat and not v.is_scalar):
                    break
            else:
                n = len(variables)
                variables.append(v)
            if n != k:
                mapping[ir.var(k, v.dim, v.cat)] = ir.var(n, v.dim, v.cat)
        if other.formula.op == "var":  # a leaf (K @ b, x * y): no need to walk it
            formula = mapping.get(other.formula, other.formula)
        else:
            formula = ir.substitute(other.formula, mapping) if mapping else other.formula
        return variables, formula

    def _op(self, name, *others, params=()):
        """``name(self, *others)`` for a registered op (numbers and arrays become
        parameters, as in pykeops)."""
        if others and any(is_complex_operand(o) for o in others):
            if name in ("add", "sub", "mul", "div") and len(others) == 1:
                return complex_methods.binary_op(name, self, others[0])
            raise NotImplementedError(f"{name} of a real and a complex LazyTensor is not defined")
        return self._build(lambda *nodes: ops.apply(name, *nodes, params=params), *others)

    def _build(self, builder, *others):
        """The LazyTensor of ``builder(self's formula, others' formulas)`` (a function of IR
        nodes, such as the compositions of :mod:`lazytensor.codegen.compositions`), with
        the operands' variables merged."""
        operands = [o if isinstance(o, LazyTensor) else self._operand(o) for o in others]
        if not self.is_complex and any(o.is_complex for o in operands):
            raise NotImplementedError("this operation is not defined between real and complex "
                                      "LazyTensors (+ - * / are; take .real, .imag or abs())")
        variables, nodes = list(self.variables), [self.formula]
        acc = LazyTensor._new(self.formula, variables)
        for o in operands:
            variables, node = acc._merged(o)
            nodes.append(node)
            acc = LazyTensor._new(self.formula, variables)
        try:
            node = builder(*nodes)
        except ValueError as e:  # name the operands' variables, not just their dimensions
            described = "; ".join(_describe_operand(o) for o in (self, *operands))
            raise ValueError(f"{e}; operands: {described}") from None
        out = LazyTensor._new(node, variables)
        ranges = self.ranges
        for o in operands:
            ranges = ranges if o.ranges is None else o.ranges
        if ranges is not None:
            out.ranges = ranges
        return out

    def _rop(self, name, other):
        operand = self._operand(other)
        if operand.is_complex or self.is_complex:
            return operand._op(name, self)
        # self's variables first, as pykeops numbers them (its callfun's order, print(K))
        return self._build(lambda a, b: ops.apply(name, b, a), operand)

    def _operand(self, o) -> LazyTensor:
        """A LazyTensor for a non-LazyTensor operand of ``self``.

        A list of numbers is a parameter, as in pykeops, where lists have no dtype of their
        own: it takes the dtype (and library and device) of ``self``'s arrays, so that
        ``x_i * [1., 2., 3.]`` works for float32 ``x``. Arrays keep their dtype (a float64
        array with float32 data is an error, as in pykeops).
        """
        if isinstance(o, (list, tuple)):
            o = _as_array(o)
            for v in self.variables:
                if not v.is_scalar:
                    if is_torch(v.data):
                        import torch

                        o = torch.as_tensor(o, dtype=v.data.dtype, device=v.data.device)
                    else:
                        o = o.astype(v.data.dtype)
                    break
        return LazyTensor(o)

    # ------------------------------------------------------------------ arithmetic

    def __add__(self, o): return self._op("add", o)
    def __radd__(self, o): return self._rop("add", o)
    def __sub__(self, o): return self._op("sub", o)
    def __rsub__(self, o): return self._rop("sub", o)
    def __mul__(self, o): return self._op("mul", o)
    def __rmul__(self, o): return self._rop("mul", o)
    def __truediv__(self, o): return self._op("div", o)
    def __rtruediv__(self, o): return self._rop("div", o)
    def __neg__(self): return self._op("neg")
    def __abs__(self): return self._op("abs")
    def __lt__(self, o): return self._op("lt", o)
    def __le__(self, o): return self._op("le", o)
    def __gt__(self, o): return self._op("gt", o)
    def __ge__(self, o): return self._op("ge", o)
    def __eq__(self, o): return self._op("eq", o)
    def __ne__(self, o): return self._op("ne", o)
    __hash__ = object.__hash__

    def __pow__(self, p):
        """``x ** p``: static int/float exponents (0.5 -> sqrt, -0.5 -> rsqrt, which is 0 at 0
        as in pykeops), or a formula (:meth:`powf`)."""
        if isinstance(p, numbers.Number) and not isinstance(p, bool):
            return self._build(lambda f: compositions.power(f, p))
        return self.powf(p)

    def __rpow__(self, base):
        return self._operand(base)._build(compositions.powf, self)

    def powf(self, p: LazyTensor | Array | float) -> LazyTensor:
        """``self ** p`` for a formula exponent, as C ``pow``: for a negative base and an
        integer-valued exponent, the signed power (NaN for other exponents).

        >>> x, p = np.array([[-2.0], [3.0]]), np.array([[3.0]])
        >>> Vi(x).powf(Vj(p)).sum(1)[:, 0].tolist()
        [-8.0, 27.0]
        """
        return self._build(compositions.powf, p)

    def __or__(self, o):
        """Dot product over the vector dimension: ``(x | y) = Σ_k x_k y_k``."""
        return self._build(compositions.dot, o)

    def __ror__(self, o):
        return LazyTensor(o) | self

    def __matmul__(self, v, **kwargs):
        """``K @ v``: ``Σ_j K_ij v_j`` for a scalar formula K and an (M, E) array v.

        A 1D ``v`` of shape (M,) gives a result of shape (N,), as in pykeops; options of
        :meth:`sum` pass through ``K.__matmul__(v, sum_scheme=..., backend=...)``.

        >>> x, y = np.random.rand(5, 3), np.random.rand(4, 3)
        >>> K = (-Vi(x).sqdist(Vj(y))).exp()
        >>> (K @ np.ones((4, 2))).shape, (K @ np.ones(4)).shape
        ((5, 2), (5,))
        """
        if self.formula.dim != 1:
            raise ValueError(f"K @ v needs a scalar formula K, got dimension {self.formula.dim}")
        if isinstance(v, LazyTensor):
            raise ArgumentTypeError("K @ v takes an array v of shape (M, E), not a LazyTensor")
        v = _as_array(v)
        if v.ndim == 0:
            raise ValueError("K @ v needs v of shape (M,) or (M, E) (or (*batch, M, E)), got a 0D array")
        # (M, E) and (M,) are j-variables as they are (no views to make and undo)
        vj = LazyTensor(v, axis=1) if v.ndim <= 2 else LazyTensor(v[..., None, :, :])
        if any(w.data is vj.variables[0].data for w in self.variables):
            prod = self * vj  # v is one of K's variables: merge them
        else:  # the usual case, on every iteration of a solver: K * v_j from a cache
            n, E = len(self.variables), vj.formula.dim
            key = (self.formula, n, E)
            # (not while torch compiles: dynamo would guard on the cache's contents)
            formula = None if engine.torch_compiling() else _matmul_formulas.get(key)
            if formula is None:
                formula = ops.apply("mul", self.formula, ir.var(n, E, "j"))
                if not engine.torch_compiling():
                    if len(_matmul_formulas) > 1024:
                        _matmul_formulas.clear()
                    _matmul_formulas[key] = formula
            prod = LazyTensor._new(formula, self.variables + vj.variables)
            if self.ranges is not None:
                prod.ranges = self.ranges
        # a batched v adds batch dimensions: reduce over j of the product
        out = prod.sum(dim=prod.nbatchdims + 1, **kwargs)
        return out[..., 0] if v.ndim == 1 else out  # as pykeops: a vector v gives a vector

    def __getitem__(self, key):
        """``x[k]`` (one component), ``x[a:b]`` (a slice) of the vector dimension.

        As pykeops, ``x[:, :, k]`` (full slices before the last index) means ``x[k]``;
        ``x[..., k]`` too.
        """
        D = self.formula.dim
        if isinstance(key, tuple) and len(key) >= 2 and key[0] is Ellipsis:
            key = (slice(None), *key[1:]) if len(key) > 2 else key[1:]
        if isinstance(key, tuple) and len(key) >= 1 and key[:-1] == (slice(None),) * (len(key) - 1):
            key = key[-1]
        if hasattr(key, "shape") and tuple(key.shape) == ():
            key = integer_option(key, "index", "LazyTensor[...]")  # a 0-d integer array
        if isinstance(key, numbers.Integral):
            k = int(key) + (D if key < 0 else 0)
            if not 0 <= k < D:
                raise IndexError(f"index {key} out of range for vector dimension {D}")
            return self._op("slice", params=(k, 1))
        if isinstance(key, slice):
            start, stop, step = key.indices(D)
            if step != 1 or stop <= start:
                raise IndexError(f"unsupported slice {key} of vector dimension {D}")
            return self._op("slice", params=(start, stop - start))
        raise IndexError(f"LazyTensor indices are ints or slices of the vector dimension, got {key!r}")

    def elem(self, k: int) -> LazyTensor:
        """Component ``k`` of the vector: ``self[k]``, of dimension 1 (pykeops's ``Elem``).

        >>> x = Vi(np.array([[1.0, 3.0, 2.0]]))
        >>> x.elem(1).dense().tolist()
        [[3.0]]
        """
        return self[k]

    def extract(self, start: int, length: int) -> LazyTensor:
        """Components ``start`` to ``start + length`` of the vector: ``self[start:start +
        length]``, of dimension ``length`` (pykeops's ``Extract``).

        >>> x = Vi(np.array([[1.0, 3.0, 2.0]]))
        >>> x.extract(1, 2).dense().tolist()
        [[[3.0, 2.0]]]
        """
        return self._op("slice", params=(_integer_param(start), _integer_param(length)))

    def concat(self, other: LazyTensor | Array | float) -> LazyTensor:
        return self._op("concat", other)

    @staticmethod
    def concatenate(lazytensors: Sequence[LazyTensor], axis: int = -1) -> LazyTensor:
        """Concatenation of a tuple of LazyTensors along the vector dimension (pykeops's
        ``LazyTensor.concatenate((x, y, z), -1)``): dimensions D1, D2 ... give their sum.

        >>> x, y = Vi(np.array([[1.0, 3.0, 2.0]])), Vj(np.array([[7.0]]))
        >>> LazyTensor.concatenate((x, y, x[0])).dense().tolist()
        [[[1.0, 3.0, 2.0, 7.0, 1.0]]]
        """
        if not isinstance(lazytensors, (tuple, list)) or not lazytensors:
            raise ValueError("LazyTensor.concatenate takes a non-empty tuple of LazyTensors, got "
                             f"{type(lazytensors).__name__}")
        first = lazytensors[0]
        if not isinstance(first, LazyTensor):
            raise TypeError(f"LazyTensor.concatenate: the first item must be a LazyTensor, got "
                            f"{type(first).__name__}")
        if not first._vector_dim(axis):
            raise ValueError(f"LazyTensor.concatenate: only along the vector dimension (axis=-1 or "
                             f"{first.nbatchdims + 2}), got axis={axis!r}")
        out = first
        for other in lazytensors[1:]:
            out = out.concat(other)
        return out

    @staticmethod
    def cat(lazytensors: Sequence[LazyTensor], dim: int) -> LazyTensor:
        """torch-style alias of :meth:`concatenate`.

        >>> x, y = Vi(np.array([[1.0, 3.0, 2.0]])), Vj(np.array([[7.0]]))
        >>> LazyTensor.cat((x, y), dim=-1).ndim
        4
        """
        return LazyTensor.concatenate(lazytensors, dim)

    def t(self) -> LazyTensor:
        """Exchange the roles of i and j (the transposed kernel): ``(N, M, D)`` becomes
        ``(M, N, D)``.

        >>> D = Vi(np.array([[0.0], [1.0], [3.0]])).sqdist(Vj(np.array([[0.0], [2.0]])))
        >>> D.t().dense().tolist()
        [[0.0, 1.0, 9.0], [4.0, 1.0, 1.0]]
        """
        variables = [Variable(v.data, ir.swap_cat(v.cat), v.dim, v.label) for v in self.variables]
        out = LazyTensor._new(ir.swap_ij(self.formula), variables)
        if self.ranges is not None:  # the i and j halves of the ranges trade places too
            out.ranges = swap_axes(self.ranges)
        return out

    @property
    def T(self) -> LazyTensor:
        """The transposed kernel, :meth:`t`.

        >>> (Vi(np.zeros((3, 1))) - Vj(np.zeros((2, 1)))).T.shape
        (2, 3)
        """
        return self.t()

    # ------------------------------------------------------------------ maths

    def exp(self) -> LazyTensor: return self._op("exp")
    def log(self) -> LazyTensor: return self._op("log")
    def sqrt(self) -> LazyTensor: return self._op("sqrt")
    def rsqrt(self) -> LazyTensor: return self._op("rsqrt")
    def abs(self) -> LazyTensor: return self._op("abs")
    def sin(self) -> LazyTensor: return self._op("sin")
    def cos(self) -> LazyTensor: return self._op("cos")
    def tan(self) -> LazyTensor: return self._op("tan")
    def asin(self) -> LazyTensor: return self._op("asin")
    def acos(self) -> LazyTensor: return self._op("acos")
    def atan(self) -> LazyTensor: return self._op("atan")
    def sinh(self) -> LazyTensor: return self._op("sinh")
    def cosh(self) -> LazyTensor: return self._op("cosh")
    def tanh(self) -> LazyTensor: return self._op("tanh")
    def asinh(self) -> LazyTensor: return self._op("asinh")
    def acosh(self) -> LazyTensor: return self._op("acosh")
    def atanh(self) -> LazyTensor: return self._op("atanh")
    def erf(self) -> LazyTensor: return self._op("erf")
    def erfc(self) -> LazyTensor: return self._op("erfc")
    def log1p(self) -> LazyTensor: return self._op("log1p")
    def expm1(self) -> LazyTensor: return self._op("expm1")
    def sigmoid(self) -> LazyTensor: return self._op("sigmoid")
    def softplus(self) -> LazyTensor: return self._op("softplus")
    def logsigmoid(self) -> LazyTensor: return self._op("logsigmoid")
    def square(self) -> LazyTensor: return self._op("square")
    def sign(self) -> LazyTensor: return self._op("sign")
    def step(self) -> LazyTensor: return self._op("step")
    def relu(self) -> LazyTensor: return self._op("relu")
    def inv(self) -> LazyTensor: return self._op("inv")
    def floor(self) -> LazyTensor: return self._op("floor")
    def ceil(self) -> LazyTensor: return self._op("ceil")
    def xlogx(self) -> LazyTensor: return self._op("xlogx")
    def sinxdivx(self) -> LazyTensor: return self._op("sinxdivx")

    def sinc(self) -> LazyTensor:
        """``sin(πx) / (πx)`` (1 at 0), componentwise, as pykeops.

        >>> Vi(np.array([[0.0], [0.5]])).sinc().dense().round(4).tolist()
        [[1.0], [0.6366]]
        """
        return (self * np.pi).sinxdivx()
    def atan2(self, other: LazyTensor | Array | float) -> LazyTensor:
        return self._op("atan2", other)

    def round(self, d: int = 0) -> LazyTensor:
        """Round half away from zero, to ``d`` decimals, componentwise.

        >>> Vi(np.array([[1.234], [-2.25]])).round(1).dense().tolist()
        [[1.2], [-2.3]]
        """
        return self._build(lambda f: compositions.round_to(f, d))

    def power(self, p: LazyTensor | Array | float) -> LazyTensor:
        """``self ** p``, componentwise (see ``__pow__`` and :meth:`powf`).

        >>> Vi(np.array([[-2.0], [3.0]])).power(2).dense().tolist()
        [[4.0], [9.0]]
        """
        return self ** p

    def clamp(self, a: LazyTensor | Array | float, b: LazyTensor | Array | float) -> LazyTensor:
        """``min(max(self, a), b)``, componentwise; ``a`` and ``b`` are numbers or formulas.

        >>> Vi(np.array([[-2.0], [3.0]])).clamp(-1, 1).dense().tolist()
        [[-1.0], [1.0]]
        """
        return self._op("clamp", a, b)

    def clampint(self, a: int, b: int) -> LazyTensor:
        """:meth:`clamp` to integer bounds (pykeops's ``ClampInt``).

        >>> Vi(np.array([[-2.0], [3.0]])).clampint(0, 2).dense().tolist()
        [[0.0], [2.0]]
        """
        bounds = []
        for name, v in (("a", a), ("b", b)):
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not float(v).is_integer():
                raise ArgumentTypeError(f"clampint: bound {name}={v!r} must be an integer "
                                        "(use clamp for other bounds)")
            bounds.append(int(v))
        return self._op("clamp", *bounds)

    def ifelse(self, a: LazyTensor | Array | float, b: LazyTensor | Array | float) -> LazyTensor:
        """``a`` where ``self >= 0``, else ``b``, componentwise (as pykeops).

        >>> Vi(np.array([[-2.0], [3.0]])).ifelse(1.0, 0.0).dense().tolist()
        [[0.0], [1.0]]
        """
        return self._op("ifelse", a, b)

    def mod(self, modulus: LazyTensor | Array | float,
            offset: LazyTensor | Array | float = 0) -> LazyTensor:
        """``self - modulus * floor((self - offset) / modulus)``, in ``[offset, offset + modulus)``.

        >>> x = Vi(np.array([[-1.0], [5.0]]))
        >>> x.mod(3).dense().tolist(), x.mod(2, -1).dense().tolist()
        ([[2.0], [2.0]], [[-1.0], [-1.0]])
        """
        return self._build(compositions.mod, modulus, offset)

    def one_hot(self, D: int) -> LazyTensor:
        """The one-hot vector of dimension ``D`` at the rounded value of a scalar formula
        (all zeros outside ``[0, D)``).

        >>> Vi(np.array([[0.0], [2.0]])).one_hot(3).dense().tolist()
        [[[1.0, 0.0, 0.0]], [[0.0, 0.0, 1.0]]]
        """
        return self._op("one_hot", params=(_integer_param(D),))

    def sqnorm2(self) -> LazyTensor:
        """The squared Euclidean norm ``Σ_k x_k²`` of the vector: dimension D gives 1.

        >>> Vi(np.array([[3.0, 4.0], [0.0, 2.0]])).sqnorm2().dense().tolist()
        [[25.0], [4.0]]
        """
        return self._build(compositions.sqnorm2)

    def norm2(self) -> LazyTensor:
        """The Euclidean norm ``sqrt(Σ_k x_k²)`` of the vector: dimension D gives 1.

        >>> Vi(np.array([[3.0, 4.0], [0.0, 2.0]])).norm2().dense().tolist()
        [[5.0], [2.0]]
        """
        return self._build(compositions.norm2)

    def norm(self, dim: int = -1) -> LazyTensor:
        """:meth:`norm2`, over the vector dimension (``dim=-1``, the only one allowed).

        >>> Vi(np.array([[3.0, 4.0], [0.0, 2.0]])).norm(dim=-1).dense().tolist()
        [[5.0], [2.0]]
        """
        if dim not in (-1, self.nbatchdims + 2):
            raise ValueError("norm is taken over the vector dimension (dim=-1)")
        return self.norm2()

    def normalize(self) -> LazyTensor:
        """The vector divided by its Euclidean norm (same dimension D).

        >>> Vi(np.array([[3.0, 4.0], [0.0, 2.0]])).normalize().dense().round(4).tolist()
        [[[0.6, 0.8]], [[0.0, 1.0]]]
        """
        return self._build(compositions.normalize)

    def sqdist(self, other: LazyTensor | Array | float) -> LazyTensor:
        """The squared distance ``Σ_k (x_k - y_k)²``: two vectors of dimension D give 1.

        >>> x = Vi(np.array([[3.0, 4.0], [0.0, 2.0]]))
        >>> y = Vj(np.array([[0.0, 0.0], [1.0, 1.0]]))
        >>> x.sqdist(y).dense().tolist()
        [[25.0, 13.0], [4.0, 2.0]]
        """
        return self._build(compositions.sqdist, other)

    def weightedsqnorm(self, s: LazyTensor | Array | float) -> LazyTensor:
        """``Σ s_k x_k²`` (s of dim 1 or D) or ``xᵀ S x`` (s of dim D², row-major), of
        dimension 1.

        >>> x = Vi(np.array([[3.0, 4.0], [0.0, 2.0]]))
        >>> x.weightedsqnorm(Pm(np.array([1.0, 2.0]))).dense().tolist()
        [[41.0], [8.0]]
        >>> x.weightedsqnorm(Pm(np.array([2.0, 1.0, 1.0, 2.0]))).dense().tolist()
        [[74.0], [8.0]]
        """
        s = s if isinstance(s, LazyTensor) else LazyTensor(s)
        return s._build(compositions.weightedsqnorm, self)

    def weightedsqdist(self, other: LazyTensor | Array | float,
                       s: LazyTensor | Array | float) -> LazyTensor:
        """:meth:`weightedsqnorm` of ``self - other``: dimension 1.

        >>> x = Vi(np.array([[3.0, 4.0], [0.0, 2.0]]))
        >>> y = Vj(np.array([[0.0, 0.0], [1.0, 1.0]]))
        >>> x.weightedsqdist(y, Pm(np.array([1.0, 2.0]))).dense().tolist()
        [[41.0, 22.0], [8.0, 3.0]]
        """
        s = s if isinstance(s, LazyTensor) else LazyTensor(s)
        return s._build(compositions.weightedsqdist, self, other)

    def matvecmult(self, v: LazyTensor | Array | float) -> LazyTensor:
        return self._op("matvec", v)

    def vecmatmult(self, v: LazyTensor | Array | float) -> LazyTensor:
        return self._op("vecmat", v)

    def tensorprod(self, v: LazyTensor | Array | float) -> LazyTensor:
        return self._op("tensorprod", v)

    def keops_kron(self, other: LazyTensor | Array | float, dimfself: Sequence[int],
                   dimfother: Sequence[int]) -> LazyTensor:
        """Kronecker product of two tensors stored row-major in the vector dimension.

        ``dimfself`` and ``dimfother`` are their shapes (same number of axes); the result
        has shape ``(d0*e0, d1*e1, ...)``, flattened row-major, as ``numpy.kron``.

        >>> a, b = np.random.rand(4, 6), np.random.rand(5, 4)
        >>> k = Vi(a).keops_kron(Vj(b), (2, 3), (2, 2)).sum(1)
        >>> np.allclose(k[0], sum(np.kron(a[0].reshape(2, 3), c.reshape(2, 2)).ravel() for c in b))
        True
        """
        return self._build(lambda a, b: compositions.kron(a, b, dimfself, dimfother), other)

    def keops_tensordot(self, other: LazyTensor | Array | float, dimfa: Sequence[int],
                        dimfb: Sequence[int], contfa: Sequence[int], contfb: Sequence[int],
                        *args: Sequence[int]) -> LazyTensor:
        """``numpy.tensordot`` of two tensors stored row-major in the vector dimension.

        ``dimfa``/``dimfb`` are their shapes, ``contfa``/``contfb`` the axes contracted
        together; the result holds the free axes of ``self`` then those of ``other``, moved
        by the optional permutation as in pykeops (axis ``k`` goes to ``perm[k]``).

        >>> a, b = np.random.rand(3, 6), np.random.rand(1, 12)
        >>> t = Vi(a).keops_tensordot(Vj(b), (2, 3), (3, 4), (1,), (0,), (1, 0)).sum(1)
        >>> np.allclose(t[0], (a[0].reshape(2, 3) @ b[0].reshape(3, 4)).T.ravel())
        True
        """
        if len(args) > 1:
            raise ValueError(f"keops_tensordot takes one permutation after contfb, got {args!r}")
        return self._build(
            lambda a, b: compositions.tensordot(a, b, dimfa, dimfb, contfa, contfb, *args), other)

    def difference_matrix(self, other: LazyTensor | Array | float) -> LazyTensor:
        """``(x_k - y_l)`` for all k, l: an (D1*D2)-vector (row-major).

        >>> x, y = Vi(np.array([[1.0, 2.0]])), Vj(np.array([[0.0, 1.0, 2.0]]))
        >>> x.difference_matrix(y).dense().tolist()
        [[[1.0, 0.0, -1.0, 2.0, 1.0, 0.0]]]
        """
        D1 = self.formula.dim
        D2 = (other if isinstance(other, LazyTensor) else LazyTensor(other)).formula.dim
        ones1 = LazyTensor(np.ones(D1))
        ones2 = LazyTensor(np.ones(D2))
        return self.tensorprod(ones2) - ones1.tensorprod(other)

    # ------------------------------------------------------------------ reductions

    def _axis(self, dim, axis, name):
        if axis is not None:
            if dim is not None and dim != axis:
                raise ValueError(f"{name}: got both dim={dim} and axis={axis}")
            dim = axis
        if dim is None:
            raise ValueError(f"{name}: say which index to reduce, dim=0 (i) or dim=1 (j)")
        nb = self.nbatchdims
        dim = integer_option(dim, "dim", name)
        if dim < 0:
            dim += nb + 3
        if dim == nb:
            return 0
        if dim == nb + 1:
            return 1
        raise ValueError(
            f"{name}: cannot reduce over dim={dim} of a LazyTensor with shape "
            f"(*batch{nb}, N, M, D); use dim={nb} (over i) or dim={nb + 1} (over j)"
        )

    def _vector_dim(self, dim) -> bool:
        """``dim`` is the vector dimension (-1, or nbatchdims + 2): a symbolic, not a reduction."""
        return integer_value(dim) in (-1, self.nbatchdims + 2)

    def _reduce(self, reduction, dim, axis=None, backend="auto", opts=None, call=True, out=None,
                grad_mode=None, ranges=None, group=None, tol=None, **unknown):
        if unknown:
            raise TypeError(f"{reduction}() got an unexpected keyword argument {next(iter(unknown))!r}")
        axis_ = self._axis(dim, axis, reduction)
        opts = dict(opts or {})
        ranges = self.ranges if ranges is None else ranges
        tol = fastsum.resolve_tol(tol, reduction, ranges, group)  # None: exact (lazytensor.fastsum)
        io_dtype = half.output_dtype(self.variables)
        call = call and not symbolic.has_slots(self.variables)  # symbolic: a function of arrays
        if call and engine.torch_compiling():  # torch.compile/export: the torch.library op
            if ranges is not None or group is not None:
                raise NotImplementedError(f"{reduction}: block-sparse ranges and distributed "
                                          "reductions are not supported under torch.compile "
                                          "or torch.export")
            result = engine.torch_library().traced_reduce(
                self.formula, self.variables, reduction, axis_, opts, backend)
            if io_dtype:
                result = half.cast_outputs(result, io_dtype)
            return result if out is None else copy_into(out, result)
        sharding = distributed_context.active(group)
        if sharding is not None:  # over the ranks of a process group (lazytensor.distributed)
            if ranges is not None:
                raise NotImplementedError(f"{reduction}: block-sparse ranges in a distributed "
                                          "reduction are not supported")
            from ..distributed import api as distributed_api

            def run_reduction(*args):
                return distributed_api.reduce(*args, sharding=sharding)
        elif ranges is None:
            run_reduction = engine.reduce if tol is None else fastsum.reducer(tol)
        else:
            from ..scale import ranges as ranges_mod

            def run_reduction(*args):
                return ranges_mod.reduce(*args, ranges)
        if not call:
            return symbolic.DeferredReduction(self, reduction, axis_, opts, backend, grad_mode,
                                              run_reduction)
        result = run_reduction(self.formula, self.variables, reduction, axis_, opts, backend,
                               grad_mode)
        if io_dtype:
            result = half.cast_outputs(result, io_dtype)
        if out is not None:
            return copy_into(out, result)
        return result

    # The reduction methods (sum, min, argKmin, logsumexp, ... and their pykeops aliases) are
    # made from the reduction records below the class (_reduction_method); they all come here.
    def _reduction_call(self, red, args: dict):
        """One call of ``red``'s method, with its bound arguments ``args``."""
        dim, axis, backend, kw = args["dim"], args["axis"], args["backend"], dict(args["kw"])
        kw.update({k: args[k] for k, default in _CALL_DEFAULTS if args[k] is not default})
        if red.vector_op and (self._vector_dim(dim if axis is None else axis)
                              or _no_dim(dim, axis, backend, kw)):
            return self._op(red.vector_op)  # no dim and no option: pykeops's default, dim=-1
        name, target, weight = red.name, self, args.get("weight")
        if red.weighted_variant:  # logsumexp(weight=...) (pykeops: other=...)
            if args["other"] is not None:
                if weight is not None:
                    raise ValueError(f"{red.method}: give the weight once, as weight= or as other=")
                weight = args["other"]
            if weight is not None:
                name = reductions.get(red.weighted_variant).name
        if weight is not None:
            target = self._with_weight(weight, red.method)
        extra = {"K": args["K"]} if red.needs_k else None
        backend, opts, kw = split_reduction_keywords(name, backend, kw, extra)
        return target._reduce(name, dim, axis, backend, opts, **kw)

    def _with_weight(self, weight, name):
        """``concat(self, weight)``; the reductions read component 0 as the scalar formula."""
        if self.formula.dim != 1:
            raise ValueError(f"{name} with a weight needs a scalar formula, got dimension "
                             f"{self.formula.dim} (reduce it first, e.g. with .sum(-1))")
        return self.concat(weight)

    def _index_dim(self, dim, axis, name):
        """``dim`` (or ``axis``) checked to be an i or j axis, for the explicit reductions."""
        self._axis(dim, axis, name)
        return dim if axis is None else axis

    def grad(self, v: LazyTensor, gradin: LazyTensor | Array) -> LazyTensor:
        """Symbolic ``(∂self/∂v)ᵀ gradin`` as a LazyTensor (as pykeops ``.grad``).

        ``v`` is a LazyTensor leaf of this formula; ``gradin`` an i-indexed array (or
        LazyTensor) of this formula's dimension. The result has v's dimension; its sum over
        j is the gradient of ``(self.sum(dim=1) * gradin).sum()`` in an i-variable v.

        >>> x, y = Vi(np.array([[0.0], [1.0]])), Vj(np.array([[0.0], [1.0], [2.0]]))
        >>> ((x - y) ** 2).grad(x, np.ones((2, 1))).sum(dim=1).tolist()   # Σ_j 2 (x_i - y_j)
        [[-6.0], [0.0]]
        """
        from ..codegen import diff

        if len(v.variables) != 1 or v.formula.op != "var":
            raise ValueError("grad: v must be a LazyTensor wrapping one variable")
        if isinstance(gradin, LazyTensor):
            g = gradin
        else:  # an (N, E) array: i-indexed, like the reduction's output
            g = LazyTensor(gradin, axis=0) if getattr(gradin, "ndim", 0) == 2 else LazyTensor(gradin)
        variables, _ = self._merged(v)
        acc = LazyTensor._new(self.formula, variables)
        variables, g_node = acc._merged(g)
        target = variables.index(next(w for w in variables if w.data is v.variables[0].data
                                      and w.cat == v.variables[0].cat))
        x = ir.var(target, v.formula.dim, v.formula.cat)
        cot = diff.vjp(self.formula, [x], g_node)[x]
        return LazyTensor._new(cot, variables)

    # ------------------------------------------------------------------ linear algebra

    def solve(self, b: Array, alpha: float = 0.0, eps: float = 1e-6, **kwargs: Any) -> Array:
        """``x`` with ``(alpha I + K) x = b`` by conjugate gradient (K symmetric positive).

        >>> x = np.random.rand(100, 2)
        >>> K = (-Vi(x).sqdist(Vj(x))).exp()
        >>> K.solve(np.random.rand(100, 1), alpha=0.1).shape
        (100, 1)

        See :func:`lazytensor.api.solve.solve` (``maxiter``, ``var``, ``backend``); differentiable.
        """
        return linear_solve.solve(self, b, alpha=alpha, eps=eps, **kwargs)

    # scipy.sparse.linalg.aslinearoperator(K) reads shape, dtype, matvec, rmatvec, rmatmat.
    def matvec(self, v: Array) -> Array:
        """``K @ v`` for a NumPy vector, cast to K's dtype (the LinearOperator protocol):
        ``(M,)`` gives ``(N,)``.

        >>> x = np.array([[0.0], [1.0], [3.0]])
        >>> K = (-Vi(x).sqdist(Vj(x))).exp()
        >>> K.matvec(np.ones(3)).round(4).tolist()
        [1.368, 1.3862, 1.0184]
        """
        return self @ _cast_like(v, self.dtype)

    def rmatvec(self, v: Array) -> Array:
        """``Kᵀ @ v`` (the LinearOperator protocol): ``(N,)`` gives ``(M,)``.

        >>> x = np.array([[0.0], [1.0], [3.0]])
        >>> K = (-Vi(x).sqdist(Vj(x))).exp()
        >>> K.rmatvec(np.ones(3)).round(4).tolist()
        [1.368, 1.3862, 1.0184]
        """
        return self.T @ _cast_like(v, self.dtype)

    def matmat(self, v: Array) -> Array:
        """``K @ v`` for a NumPy matrix (the LinearOperator protocol): ``(M, E)`` gives
        ``(N, E)``.

        >>> x = np.array([[0.0], [1.0], [3.0]])
        >>> (-Vi(x).sqdist(Vj(x))).exp().matmat(np.ones((3, 2))).shape
        (3, 2)
        """
        return self @ _cast_like(v, self.dtype)

    def rmatmat(self, v: Array) -> Array:
        """``Kᵀ @ v`` for a NumPy matrix (the LinearOperator protocol): ``(N, E)`` gives
        ``(M, E)``.

        >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
        >>> (-Vi(x).sqdist(Vj(y))).exp().rmatmat(np.ones((3, 4))).shape
        (2, 4)
        """
        return self.T @ _cast_like(v, self.dtype)


def _cast_like(v, dtype):
    if is_torch(v) or dtype is None or not isinstance(dtype, np.dtype):
        return v
    return np.ascontiguousarray(v, dtype=dtype)


def _no_dim(dim, axis, backend, kw) -> bool:
    """No ``dim``/``axis`` and no reduction option: pykeops's default ``dim=-1`` (the vector).

    With options but no dim the call is meant as a reduction: it goes on to the error that
    asks for dim=0 or dim=1.
    """
    return dim is None and axis is None and backend == "auto" and not kw


def _describe_operand(lt: LazyTensor) -> str:
    """``Vi(0,3) of dimension 3 (i-variable (shape (10, 3), dtype float64))`` for messages."""
    text = f"{ir.to_text(lt.formula, limit=60)} of dimension {lt.formula.dim}"
    arrays = [v.describe() for v in lt.variables if not v.is_scalar]
    return f"{text} ({', '.join(arrays)})" if arrays else text


def _integer_param(value):
    """An op's integer parameter as a Python int when it is an integer by the rule of
    :func:`~lazytensor.core.options.integer_option` (NumPy integers, 0-d integer arrays);
    anything else is left to the op's own check, which names the op and the parameter."""
    as_int = integer_value(value)
    return value if as_int is None else as_int


def _symbolic_leaf(v: Variable) -> LazyTensor:
    return LazyTensor._new(ir.var(0, v.dim, v.cat), [v])


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def Vi(x: Array | Sequence[Sequence[float]], label: str = "") -> LazyTensor:
    """An i-indexed variable from a 2D array (N, D) (or 1D (N,)): a LazyTensor of shape
    ``(N, 1, D)``. ``Vi(index, dim)`` is a symbolic one, the call's argument ``index``
    (:mod:`lazytensor.api.symbolic`).

    >>> x = Vi(np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]))
    >>> x.shape, x.ndim
    ((3, 1, 2), 2)
    """
    if _is_int(x) and _is_int(label):  # Vi(index, dim): symbolic (lazytensor.api.symbolic)
        return _symbolic_leaf(symbolic.leaf(x, label, "i", f"Vi({x}, {label})"))
    return LazyTensor(x, axis=0, label=label)


def Vj(x: Array | Sequence[Sequence[float]], label: str = "") -> LazyTensor:
    """A j-indexed variable from a 2D array (M, D) (or 1D (M,)): a LazyTensor of shape
    ``(1, M, D)``. ``Vj(index, dim)`` is a symbolic one (:mod:`lazytensor.api.symbolic`).

    >>> y = Vj(np.array([0.0, 2.0]))
    >>> y.shape, (Vi(np.zeros((3, 1))) - y).shape
    ((1, 2), (3, 2))
    """
    if _is_int(x) and _is_int(label):  # Vj(index, dim): symbolic (lazytensor.api.symbolic)
        return _symbolic_leaf(symbolic.leaf(x, label, "j", f"Vj({x}, {label})"))
    return LazyTensor(x, axis=1, label=label)


def Pm(x: Array | Sequence[float] | float, label: str = "") -> LazyTensor:
    """A parameter from a number or a 1D array (D,): the same for every i and j.
    ``Pm(index, dim)`` is a symbolic one (:mod:`lazytensor.api.symbolic`).

    >>> x = Vi(np.array([[1.0, 2.0], [3.0, 4.0]]))
    >>> (x * Pm(np.array([10.0, 0.0]))).sum(-1).dense().tolist()
    [[10.0], [30.0]]
    >>> (x.sqnorm2() * Pm(0.5)).dense().tolist()
    [[2.5], [12.5]]
    """
    if _is_int(x) and _is_int(label):  # Pm(index, dim): symbolic (lazytensor.api.symbolic)
        return _symbolic_leaf(symbolic.leaf(x, label, "p", f"Pm({x}, {label})"))
    if isinstance(x, numbers.Number):
        return LazyTensor(float(x), label=label)
    x = _as_array(x, "Pm's x")
    if x.ndim == 0:
        x = x.reshape(1)
    return LazyTensor(x, axis=2, label=label)


class ComplexLazyTensor(ComplexMethods, LazyTensor):
    """A complex-valued LazyTensor, as pykeops's (see :mod:`lazytensor.api.complex_methods`):
    ``LazyTensor`` of complex data, complex numbers and operations that give complex
    values make one.

    >>> z = LazyTensor(np.exp(1j * np.random.rand(1, 5, 1)))
    >>> bool(np.abs((abs(z) - 1).sum(dim=1)).max() < 1e-12)
    True
    """

    _real_type = LazyTensor


LazyTensor._complex_type = ComplexLazyTensor


# The keywords every reduction method names in its signature, with their defaults; one left
# at its default counts as not given (``sum()`` is then the vector's sum, as in pykeops).
_CALL_DEFAULTS = (("call", True), ("out", None), ("grad_mode", None), ("ranges", None))


def _reduction_signature(red) -> inspect.Signature:
    """``(self, [K | weight], dim, axis, [weight], backend, [other], call, out, grad_mode,
    ranges, **kw)``: K for the K-min family, a weight first for a weighted reduction, as a
    keyword for one with a weighted variant (``logsumexp(weight=)``, ``other=`` in pykeops)."""
    P, kw_only = inspect.Parameter, inspect.Parameter.POSITIONAL_OR_KEYWORD
    opt = "LazyTensor | Array | float | None"
    params = [P("self", kw_only)]
    if red.needs_k:
        params.append(P("K", kw_only, annotation="int"))
    if red.weighted:
        params.append(P("weight", kw_only, annotation="LazyTensor | Array | float"))
    params += [P("dim", kw_only, default=None, annotation="int | None"),
               P("axis", kw_only, default=None, annotation="int | None")]
    if red.weighted_variant:
        params.append(P("weight", kw_only, default=None, annotation=opt))
    params.append(P("backend", kw_only, default="auto", annotation="str"))
    if red.weighted_variant:
        params.append(P("other", kw_only, default=None, annotation=opt))
    params += [P("call", kw_only, default=True, annotation="bool"),
               P("out", kw_only, default=None, annotation="Array | None"),
               P("grad_mode", kw_only, default=None, annotation="str | None"),
               P("ranges", kw_only, default=None, annotation="Any"),
               P("kw", P.VAR_KEYWORD, annotation="Any")]
    returns = "LazyTensor | Reduced" if red.vector_op else "Reduced"
    return inspect.Signature(params, return_annotation=returns)


_RECORDS: dict = {}  # reduction name -> (record, method signature), for the methods below


def _reduction_method(red):
    """The LazyTensor method of the reduction record ``red``: its name, signature and
    docstring from the record."""
    name, sig = red.name, _reduction_signature(red)
    _RECORDS[name] = red, sig

    def method(self, *args, **kwargs):
        # record and signature read from a module global, not the closure: torch.compile
        # traces this method on LazyTensors it made itself and wraps only objects it can name
        red, sig = _RECORDS[name]
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        return self._reduction_call(red, bound.arguments)

    method.__name__ = method.__qualname__ = red.method
    method.__doc__, method.__signature__ = red.method_doc, sig
    return method


def _explicit_method(red):
    """``<method>_reduction`` of a reduction whose method has a vector form (pykeops's
    ``sum_reduction``, ...): always a reduction, ``dim=-1`` an error."""
    name = f"{red.method}_reduction"

    def method(self, dim: int | None = None, axis: int | None = None, **kw: Any) -> Reduced:
        return getattr(self, red.method)(self._index_dim(dim, axis, name), **kw)

    # the result shown by the method's example, D.<method>(dim=1).tolist()
    example = re.search(rf">>> D\.{red.method}\(dim=1\)\.tolist\(\)\n\s*(.*)",
                        red.method_doc)
    method.__name__ = method.__qualname__ = name
    method.__doc__ = f""":meth:`{red.method}` over i (dim=0) or j (dim=1) (pykeops's name); always a
    reduction: ``dim=-1`` is an error, not the vector's {red.method}.

    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
    >>> D = Vi(x).sqdist(Vj(y))     # (3, 2): [[0, 4], [1, 1], [9, 1]]
    >>> D.{name}(dim=1).tolist()
    {example.group(1)}
    """
    return method


for _red in reductions.all_reductions():
    if _red.method:
        setattr(LazyTensor, _red.method, _reduction_method(_red))
        setattr(LazyTensor, f"{_red.method}_reduction",
                _explicit_method(_red) if _red.vector_op else getattr(LazyTensor, _red.method))

if "torch" in sys.modules:  # the torch.library op, registered before torch traces a reduction
    engine.torch_library()
