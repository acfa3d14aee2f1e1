"""Complex LazyTensors: complex values as pairs of real parts inside the formula.

A complex formula of dimension D is a real formula of dimension 2D laid out ``[re | im]``
(the D real parts, then the D imaginary parts), so every backend, the reference, the
cache and the gradients see real formulas only. Complex data (torch complex64/128, NumPy
complex arrays, Python complex numbers) enters as that layout (a copy of O(N·D) in the
caller's library, through which torch's autograd takes complex gradients as torch defines
them) and a Sum's output leaves it as complex arrays of the input's precision.

The operations are pykeops's: ``z.real``, ``z.imag``, ``z.conj()``, ``abs(z)``,
``z.angle()``, ``z.exp()``, ``+ - * /`` between complex and real LazyTensors, arrays and
numbers, ``z ** n`` (integer n ≥ 1), ``z.sum(-1)`` (the vector's components summed),
``z.sum(dim=0 | 1)`` and ``z @ v``; ``x.real2complex()``, ``x.imag2complex()`` and
``x.exp1j()`` make complex LazyTensors of real ones. Other operations on a complex
LazyTensor raise NotImplementedError (take ``.real``, ``.imag`` or ``abs`` first).

>>> import numpy as np
>>> from lazytensor import LazyTensor
>>> x = np.random.rand(4, 1, 2) + 1j * np.random.rand(4, 1, 2)
>>> y = np.random.rand(1, 5, 2) + 1j * np.random.rand(1, 5, 2)
>>> z = (LazyTensor(x) * LazyTensor(y).conj()).sum(-1).sum(dim=1)
>>> bool(np.allclose(z, (x * y.conj()).sum(-1).sum(1)[:, None])), z.dtype
(True, dtype('complex128'))
"""

from __future__ import annotations

import numbers

import numpy as np

from ..codegen import ir
from ..codegen.ops import apply
from ..core.binding import is_torch


def is_complex_operand(o) -> bool:
    """A Python complex number, a complex array or tensor, or a complex LazyTensor."""
    if isinstance(o, complex):
        return True
    if is_torch(o):
        return o.is_complex()
    if isinstance(o, np.ndarray):
        return np.iscomplexobj(o)
    return getattr(o, "is_complex", False) is True


def to_planar(x):
    """A complex array ``(..., D)`` as the real array ``(..., 2D)`` ``[re | im]`` (torch:
    differentiable; real data gets a zero imaginary part)."""
    if is_torch(x):
        import torch

        if not x.is_complex():
            return torch.cat([x, torch.zeros_like(x)], dim=-1)
        return torch.cat([x.real, x.imag], dim=-1)
    x = np.asarray(x)
    if not np.iscomplexobj(x):
        return np.concatenate([x, np.zeros_like(x)], axis=-1)
    return np.concatenate([x.real, x.imag], axis=-1)


def from_planar(a):
    """The complex array of a real ``(..., 2D)`` array laid out ``[re | im]``."""
    D = a.shape[-1] // 2
    if is_torch(a):
        import torch

        return torch.complex(a[..., :D], a[..., D:])
    out = np.empty(a.shape[:-1] + (D,), dtype=np.result_type(a.dtype, np.complex64))
    out.real, out.imag = a[..., :D], a[..., D:]
    return out


# ---------------------------------------------------------------------- IR of [re | im] pairs

def re(z: ir.Node) -> ir.Node:
    return apply("slice", z, params=(0, z.dim // 2))


def im(z: ir.Node) -> ir.Node:
    return apply("slice", z, params=(z.dim // 2, z.dim // 2))


def pair(real: ir.Node, imag: ir.Node) -> ir.Node:
    """``[real | imag]``, a dimension-1 part broadcast to the other's dimension."""
    D = max(real.dim, imag.dim)
    real, imag = (n if n.dim == D else apply("expand", n, params=(D,)) for n in (real, imag))
    return apply("concat", real, imag)


def _parts(node: ir.Node, is_complex: bool) -> tuple:
    """(re, im) of an operand; a real operand has no imaginary part (None)."""
    return (re(node), im(node)) if is_complex else (node, None)


def _add(a, b):
    return b if a is None else a if b is None else apply("add", a, b)


def _sub(a, b):
    if b is None:
        return a
    return apply("neg", b) if a is None else apply("sub", a, b)


def _mul(a, b):
    return None if a is None or b is None else apply("mul", a, b)


def _or_zero(a):
    return ir.const([0.0]) if a is None else a


def binary(name: str, a: ir.Node, a_complex: bool, b: ir.Node, b_complex: bool) -> ir.Node:
    """The [re | im] formula of ``a <name> b`` (add, sub, mul, div) for operands that are
    complex pairs or real formulas (at least one complex)."""
    ar, ai = _parts(a, a_complex)
    br, bi = _parts(b, b_complex)
    if name == "add":
        return pair(_add(ar, br), _or_zero(_add(ai, bi)))
    if name == "sub":
        return pair(_sub(ar, br), _or_zero(_sub(ai, bi)))
    if name == "mul":
        return pair(_sub(_mul(ar, br), _mul(ai, bi)), _or_zero(_add(_mul(ar, bi), _mul(ai, br))))
    if name == "div":
        if bi is None:
            return pair(apply("div", ar, br), apply("div", ai, br))
        den = apply("add", apply("square", br), apply("square", bi))
        num_re = _add(_mul(ar, br), _mul(ai, bi))
        num_im = _sub(_mul(ai, br), _mul(ar, bi))
        return pair(apply("div", num_re, den), apply("div", num_im, den))
    raise NotImplementedError(f"{name} of complex LazyTensors is not supported")


def exp(z: ir.Node) -> ir.Node:
    """``exp(re) (cos im + i sin im)``."""
    scale = apply("exp", re(z))
    return pair(apply("mul", scale, apply("cos", im(z))), apply("mul", scale, apply("sin", im(z))))


def exp1j(x: ir.Node) -> ir.Node:
    """``exp(i x)`` of a real formula."""
    return pair(apply("cos", x), apply("sin", x))


def modulus(z: ir.Node) -> ir.Node:
    return apply("sqrt", apply("add", apply("square", re(z)), apply("square", im(z))))


# what each unary op name becomes on a complex formula: (builder, result is complex)
UNARY = {
    "neg": (lambda z: apply("neg", z), True),
    "exp": (exp, True),
    "abs": (modulus, False),
    "sum": (lambda z: pair(apply("sum", re(z)), apply("sum", im(z))), True),
    "conj": (lambda z: pair(re(z), apply("neg", im(z))), True),
    "angle": (lambda z: apply("atan2", im(z), re(z)), False),
    "real": (re, False),
    "imag": (im, False),
    "square": (lambda z: binary("mul", z, True, z, True), True),
}


class ComplexMethods:
    """The methods of ``ComplexLazyTensor`` (mixed into a LazyTensor subclass, whose
    ``_real_type`` is the real LazyTensor class)."""

    is_complex = True
    _real_type: type

    def __init__(self, x=None, axis=None, *, _formula=None, _variables=None, label=""):
        if _formula is not None or getattr(x, "is_complex", None) is True:
            super().__init__(x, axis, _formula=_formula, _variables=_variables, label=label)
            return
        if isinstance(x, numbers.Number) and not isinstance(x, bool):
            z = complex(x)
            super().__init__(_formula=ir.const([z.real, z.imag]), _variables=[])
            return
        if isinstance(x, (list, tuple)):
            x = np.asarray(x)
        if getattr(x, "formula", None) is not None:  # a real LazyTensor
            super().__init__(_formula=pair(x.formula, ir.const([0.0])), _variables=x.variables)
            return
        super().__init__(to_planar(x), axis, label=label)

    # ------------------------------------------------------------------ structure

    @property
    def ndim(self) -> int:
        return self.formula.dim // 2

    @property
    def shape(self) -> tuple:
        s = self._real_type.shape.fget(self)  # (..., 2D): the real formula's dimension
        D = self.formula.dim // 2
        return s[:-1] if D == 1 else (*s[:-1], D)

    @property
    def dtype(self):
        dt = self._real_type.dtype.fget(self)
        if dt is None:
            return None
        if is_torch_dtype(dt):
            import torch

            return {torch.float32: torch.complex64, torch.float64: torch.complex128}.get(dt, dt)
        return np.result_type(dt, np.complex64)

    def __repr__(self) -> str:
        return (f"ComplexLazyTensor({ir.to_text(self.formula)} as [re | im], "
                f"{len(self.variables)} variables)")

    def _as(self, node: ir.Node, variables: list, complex_result: bool, ranges=None):
        cls = type(self) if complex_result else self._real_type
        out = cls._new(node, variables)
        if ranges is not None:
            out.ranges = ranges
        return out

    def _combine(self, builder, complex_result: bool, *others):
        """``builder(self's formula, others' formulas)`` with the variables merged (the real
        class's ``_build``), as a complex or real LazyTensor."""
        out = self._real_type._build(self, builder, *others)
        return self._as(out.formula, out.variables, complex_result, out.ranges)

    # ------------------------------------------------------------------ operations

    def _op(self, name, *others, params=()):
        if not others and not params and name in UNARY:
            build, complex_result = UNARY[name]
            return self._combine(build, complex_result)
        if len(others) == 1 and name in ("add", "sub", "mul", "div"):
            return binary_op(name, self, others[0])
        raise NotImplementedError(
            f"{name} is not defined on a complex LazyTensor (supported: + - * /, real, imag, "
            "conj, abs, angle, exp, sum); take .real, .imag or abs() first")

    def _build(self, builder, *others):
        raise NotImplementedError(
            f"{getattr(builder, '__name__', 'this operation')} is not defined on a complex "
            "LazyTensor (supported: + - * /, real, imag, conj, abs, angle, exp, sum); take "
            ".real, .imag or abs() first")

    def __add__(self, o): return self._op("add", o)
    def __radd__(self, o): return binary_op("add", o, self)
    def __sub__(self, o): return self._op("sub", o)
    def __rsub__(self, o): return binary_op("sub", o, self)
    def __mul__(self, o): return self._op("mul", o)
    def __rmul__(self, o): return binary_op("mul", o, self)
    def __truediv__(self, o): return self._op("div", o)
    def __rtruediv__(self, o): return binary_op("div", o, self)
    def __neg__(self): return self._op("neg")
    def __abs__(self): return self._op("abs")

    def __pow__(self, p):
        """``z ** n`` for an integer ``n ≥ 1`` (repeated products)."""
        if not isinstance(p, numbers.Integral) or isinstance(p, bool) or p < 1:
            raise NotImplementedError(f"complex LazyTensor ** {p!r}: only integer powers >= 1")
        out = self
        for _ in range(int(p) - 1):
            out = out * self
        return out

    @property
    def real(self):
        """The real part (a real LazyTensor)."""
        return self._op("real")

    @property
    def imag(self):
        """The imaginary part (a real LazyTensor)."""
        return self._op("imag")

    def conj(self):
        """The complex conjugate."""
        return self._op("conj")

    def angle(self):
        """The argument ``atan2(imag, real)`` (a real LazyTensor)."""
        return self._op("angle")

    def abs(self):
        """The modulus (a real LazyTensor)."""
        return self._op("abs")

    def exp(self):
        """``exp(z)``."""
        return self._op("exp")

    def real2complex(self):
        raise ValueError("real2complex cannot be applied to a complex LazyTensor")

    def imag2complex(self):
        raise ValueError("imag2complex cannot be applied to a complex LazyTensor")

    def exp1j(self):
        raise ValueError("exp1j cannot be applied to a complex LazyTensor")

    # ------------------------------------------------------------------ reductions

    def _reduce(self, reduction, dim, axis=None, backend="auto", opts=None, call=True, out=None,
                *args, **kw):
        if reduction != "sum":
            raise NotImplementedError(f"{reduction} of a complex LazyTensor: only sums are "
                                      "defined (reduce .real, .imag or abs() instead)")
        if out is not None:
            raise NotImplementedError("out= with a complex LazyTensor")
        result = self._real_type._reduce(self, reduction, dim, axis, backend, opts, call, None,
                                         *args, **kw)
        if not call:
            return lambda *arrays, **kws: from_planar(result(*arrays, **kws))
        return from_planar(result)

    def __matmul__(self, v, **kwargs):
        """``Σ_j z_ij v_j`` for a scalar complex formula and a (M,) or (M, E) array v."""
        if self.formula.dim != 2:
            raise ValueError(f"K @ v needs a scalar formula K, got complex dimension {self.ndim}")
        vector = getattr(v, "ndim", None) == 1
        vj = self._real_type(v[:, None] if vector else v, axis=1)
        out = (self * vj).sum(dim=1, **kwargs)
        return out[..., 0] if vector else out


def is_torch_dtype(dt) -> bool:
    return type(dt).__module__ == "torch"


def binary_op(name: str, a, b):
    """``a <name> b`` where one of the operands is complex (LazyTensors, arrays, numbers)."""
    lazy = a if getattr(a, "formula", None) is not None else b
    if getattr(a, "formula", None) is None:
        a = lazy._operand(a)
    if getattr(b, "formula", None) is None:
        b = lazy._operand(b)
    if a.is_complex:
        out = a._real_type._build(a, lambda x, y: binary(name, x, True, y, b.is_complex), b)
        complex_type = type(a)
    else:  # built from the complex operand (a real LazyTensor refuses complex operands)
        out = b._real_type._build(b, lambda y, x: binary(name, x, False, y, True), a)
        complex_type = type(b)
    result = complex_type._new(out.formula, out.variables)
    if out.ranges is not None:
        result.ranges = out.ranges
    return result


class RealToComplexMethods:
    """The methods of a real LazyTensor that make complex ones (``_complex_type``)."""

    is_complex = False
    _complex_type: type

    def _to_complex(self, builder):
        out = self._build(builder)
        result = self._complex_type._new(out.formula, out.variables)
        if out.ranges is not None:
            result.ranges = out.ranges
        return result

    def real2complex(self) -> ComplexMethods:
        """``x + 0i`` as a complex LazyTensor (same shape).

        >>> from lazytensor import Vi
        >>> Vi(np.ones((3, 2))).real2complex().is_complex
        True
        >>> Vi(np.array([[0.0], [1.0]])).real2complex().sum(dim=1).tolist()
        [[0j], [(1+0j)]]
        """
        return self._to_complex(lambda x: pair(x, ir.const([0.0])))

    def imag2complex(self) -> ComplexMethods:
        """``0 + x i`` as a complex LazyTensor (same shape).

        >>> from lazytensor import Vi
        >>> Vi(np.array([[0.0], [1.0]])).imag2complex().sum(dim=1).tolist()
        [[0j], [1j]]
        """
        return self._to_complex(lambda x: pair(ir.const([0.0]), x))

    def exp1j(self) -> ComplexMethods:
        """``exp(i x) = cos x + i sin x`` as a complex LazyTensor (same shape).

        >>> from lazytensor import Vi
        >>> Vi(np.array([[0.0], [1.0]])).exp1j().sum(dim=1).round(4).tolist()
        [[(1+0j)], [(0.5403+0.8415j)]]
        """
        return self._to_complex(exp1j)


__all__ = ["ComplexMethods", "RealToComplexMethods", "binary", "binary_op", "from_planar",
           "is_complex_operand", "to_planar"]
