"""The mapping table: each NumPy, SciPy and torch function that takes LazyTensors, and the
rule it runs (see :mod:`lazytensor.interop.rules` for what the rules do).

``TABLE`` maps a rule name to ``(function with the library's signature, qualified names
of the functions that call it)``. Names that a given NumPy/torch version lacks are
skipped when the table is resolved (:func:`lazytensor.interop.protocols.mapped_functions`).

>>> TABLE["logsumexp"][1]
('torch.logsumexp', 'torch.special.logsumexp')
"""

from __future__ import annotations

import operator

from ..api.lazy import LazyTensor
from ..codegen import ops
from . import rules
from .rules import lazy_args


def _unary(fn):
    def rule(input):
        return fn(lazy_args(input)[0])

    return rule


def _method(name: str):
    return _unary(operator.methodcaller(name))


def _complex_part(name: str, real_value):
    """``np.real(z)``, ``np.conj(z)``, ...: the ComplexLazyTensor's own method; on a real
    LazyTensor ``real_value(x)`` (``x`` for the real part and the conjugate), or refused
    where it is None."""

    def rule(input):
        (x,) = lazy_args(input)
        if x.is_complex:
            part = getattr(x, name)
            return part() if callable(part) else part
        if real_value is None:
            raise rules.Unsupported(f"{name} of a real LazyTensor is not defined here; "
                                    "take it on a complex one (lazytensor.ComplexLazyTensor)")
        return real_value(x)

    return rule


def _binary(op: str):
    def rule(input, other):
        a, b = lazy_args(input, other)
        return rules.arithmetic(op, input, a, b)

    return rule


def _add(input, other, alpha=1):
    a, b = lazy_args(input, other)
    return rules.arithmetic("add", input, a, b if alpha == 1 else b * alpha)


def _sub(input, other, alpha=1):
    a, b = lazy_args(input, other)
    return rules.arithmetic("sub", input, a, b if alpha == 1 else b * alpha)


def _relu(input, inplace=False):
    if inplace:
        raise rules.Unsupported("inplace=True: a LazyTensor is immutable")
    return lazy_args(input)[0].relu()


def _softplus(input, beta=1.0, threshold=20.0):
    return rules.softplus(lazy_args(input)[0], beta, threshold)


def _np_round(a, decimals=0):
    return rules.round_half_even(lazy_args(a)[0], decimals)


def _torch_round(input, *, decimals=0):
    return rules.round_half_even(lazy_args(input)[0], decimals)


def _np_where(condition, x=None, y=None):
    return rules.where(condition, x, y)


def _torch_where(condition, input=None, other=None):
    return rules.where(condition, input, other)


def _np_clip(a, a_min=None, a_max=None, *, min=None, max=None):  # noqa: A002 (NumPy's names)
    return rules.clip(a, a_min if min is None else min, a_max if max is None else max)


def _torch_clamp(input, min=None, max=None):  # noqa: A002 (torch's names)
    return rules.clip(input, min, max)


def _np_dot(a, b):
    for k in (a, b):
        if isinstance(k, LazyTensor) and k.nbatchdims:
            raise rules.Unsupported("np.dot of a LazyTensor with batch dimensions (np.dot's "
                                    "N-D rule differs from matmul's); use np.matmul")
    return rules.matmul(a, b)


def _np_concatenate(arrays, axis=0):
    return LazyTensor.concatenate(tuple(lazy_args(*arrays)), axis)


def _torch_cat(tensors, dim=0):
    return LazyTensor.concatenate(tuple(lazy_args(*tensors)), dim)


def _torch_concatenate(tensors, axis=0):
    return _torch_cat(tensors, axis)


def _np_norm(x, ord=None, axis=None, keepdims=False):  # noqa: A002
    return rules.norm(x, ord, axis, keepdims)


def _torch_linalg_norm(A, ord=None, dim=None, keepdim=False):  # noqa: A002
    return rules.norm(A, ord, dim, keepdim)


def _torch_vector_norm(x, ord=2, dim=None, keepdim=False):  # noqa: A002
    return rules.norm(x, None if ord == 2 else ord, dim, keepdim, empty_means_all=True)


def _torch_norm(input, p="fro", dim=None, keepdim=False):
    return rules.norm(input, None if p in ("fro", 2) else p, dim, keepdim)


def _np_reduction(kind: str):
    def rule(a, axis=None, keepdims=False):
        if isinstance(axis, (tuple, list)) and not axis:
            return a  # NumPy: an empty tuple of axes reduces nothing
        return rules.reduce_axes(a, kind, rules.axis_set(a, axis), bool(keepdims))

    return rule


def _torch_reduction(kind: str):
    def rule(input, dim=None, keepdim=False):
        return rules.reduce_axes(input, kind, rules.axis_set(input, dim, True), keepdim)

    return rule


def _torch_extremum(kind: str):
    def rule(input, dim=None, keepdim=False):
        import torch

        if dim is None:
            return rules.reduce_axes(input, kind, rules.axis_set(input, None), False)
        if not isinstance(dim, int) or isinstance(dim, bool):  # torch.min(a, other)
            return (rules.minimum if kind == "min" else rules.maximum)(input, dim)
        pair = rules.value_and_index(input, kind, dim, keepdim)
        return getattr(torch.return_types, kind)(pair)

    return rule


def _np_arg(kind: str):
    def rule(a, axis=None, keepdims=False):
        return rules.arg_reduce(a, kind, axis, bool(keepdims))

    return rule


def _torch_arg(kind: str):
    def rule(input, dim=None, keepdim=False):
        return rules.arg_reduce(input, kind, dim, keepdim)

    return rule


def _torch_logsumexp(input, dim, keepdim=False):
    return rules.reduce_axes(input, "logsumexp", rules.axis_set(input, dim), keepdim)


def _torch_softmax(log: bool):
    def rule(input, dim=None, _stacklevel=3, dtype=None):
        return rules.softmax(input, dim, log)

    return rule


def _torch_topk(input, k, dim=-1, largest=True, sorted=True):  # noqa: A002 (torch's name)
    import torch

    return torch.return_types.topk(rules.topk(input, k, dim, largest))


def _t(*names):
    return tuple(names)


def _elementwise_rows() -> dict:
    """The rows of the elementwise ops whose records name NumPy/SciPy/torch functions
    (:attr:`lazytensor.codegen.ops.OpDef.interop`): one argument runs ``x.method()``, two
    ``x._op(name, y)`` (a real tensor's method too: ``t * K`` calls ``Tensor.mul(t, K)``)."""
    rows = {}
    for name, op in ops.REGISTRY.items():
        if op.interop:
            rule = _method(op.method) if op.arity == 1 else _binary(name)
            rows[name] = (rule, op.interop)
    return rows


# rule name -> (function with the library's signature, functions that call it)
TABLE: dict = {
    # elementwise ops: the functions their records name, x.method() or x._op(name, y)
    **_elementwise_rows(),
    "sinc": (_method("sinc"), _t("numpy.sinc", "torch.sinc", "torch.special.sinc")),
    "positive": (_unary(lambda x: x), _t("numpy.positive", "torch.positive")),
    "relu": (_relu, _t("torch.relu", "torch.nn.functional.relu")),
    "softplus": (_softplus, _t("torch.nn.functional.softplus")),
    "rint": (_unary(rules.round_half_even), _t("numpy.rint")),
    # complex parts (a real LazyTensor is its own real part and conjugate)
    "conj": (_complex_part("conj", lambda x: x), _t("numpy.conjugate",
                                                    "torch.conj", "torch.conj_physical")),
    "real": (_complex_part("real", lambda x: x), _t("numpy.real", "torch.real")),
    "imag": (_complex_part("imag", None), _t("numpy.imag", "torch.imag")),
    "angle": (_complex_part("angle", None), _t("numpy.angle", "torch.angle")),
    "np_round": (_np_round, _t("numpy.round", "numpy.around")),
    "torch_round": (_torch_round, _t("torch.round")),
    "add": (_add, _t("numpy.add", "torch.add", "torch.Tensor.add")),
    "sub": (_sub, _t("numpy.subtract", "torch.sub", "torch.subtract", "torch.Tensor.sub")),
    "div": (rules.divide, _t("numpy.divide", "torch.div", "torch.divide", "torch.true_divide",
                             "torch.Tensor.div", "torch.Tensor.true_divide")),
    "pow": (rules.power, _t("numpy.power", "torch.pow", "torch.Tensor.pow")),
    "maximum": (rules.maximum, _t("numpy.maximum", "torch.maximum", "torch.Tensor.maximum")),
    "minimum": (rules.minimum, _t("numpy.minimum", "torch.minimum", "torch.Tensor.minimum")),
    # selection
    "np_where": (_np_where, _t("numpy.where")),
    "torch_where": (_torch_where, _t("torch.where")),
    "np_clip": (_np_clip, _t("numpy.clip")),
    "torch_clamp": (_torch_clamp, _t("torch.clamp", "torch.clip")),
    # products, concatenation, norms
    "matmul": (rules.matmul, _t("numpy.matmul", "torch.matmul", "torch.Tensor.matmul")),
    "np_dot": (_np_dot, _t("numpy.dot")),
    "np_concatenate": (_np_concatenate, _t("numpy.concatenate")),
    "torch_cat": (_torch_cat, _t("torch.cat", "torch.concat")),
    "torch_concatenate": (_torch_concatenate, _t("torch.concatenate")),
    "np_norm": (_np_norm, _t("numpy.linalg.norm")),
    "torch_linalg_norm": (_torch_linalg_norm, _t("torch.linalg.norm")),
    "torch_vector_norm": (_torch_vector_norm, _t("torch.linalg.vector_norm")),
    "torch_norm": (_torch_norm, _t("torch.norm")),
    # reductions
    "np_sum": (_np_reduction("sum"), _t("numpy.sum")),
    "np_mean": (_np_reduction("mean"), _t("numpy.mean")),
    "np_min": (_np_reduction("min"), _t("numpy.min", "numpy.amin")),
    "np_max": (_np_reduction("max"), _t("numpy.max", "numpy.amax")),
    "np_argmin": (_np_arg("argmin"), _t("numpy.argmin")),
    "np_argmax": (_np_arg("argmax"), _t("numpy.argmax")),
    "torch_sum": (_torch_reduction("sum"), _t("torch.sum")),
    "torch_mean": (_torch_reduction("mean"), _t("torch.mean")),
    "torch_amin": (_torch_reduction("min"), _t("torch.amin")),
    "torch_amax": (_torch_reduction("max"), _t("torch.amax")),
    "torch_min": (_torch_extremum("min"), _t("torch.min")),
    "torch_max": (_torch_extremum("max"), _t("torch.max")),
    "torch_argmin": (_torch_arg("argmin"), _t("torch.argmin")),
    "torch_argmax": (_torch_arg("argmax"), _t("torch.argmax")),
    "logsumexp": (_torch_logsumexp, _t("torch.logsumexp", "torch.special.logsumexp")),
    "softmax": (_torch_softmax(False), _t("torch.softmax", "torch.nn.functional.softmax",
                                          "torch.special.softmax")),
    "log_softmax": (_torch_softmax(True), _t("torch.log_softmax",
                                             "torch.nn.functional.log_softmax",
                                             "torch.special.log_softmax")),
    "topk": (_torch_topk, _t("torch.topk")),
}
