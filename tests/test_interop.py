"""NumPy, SciPy and torch functions on LazyTensors (lazytensor.interop.protocols).

Every mapped function is called on lazy data and on the same data as a dense array of
its own library: the results must agree in shape and values, and with the same
computation written with LazyTensor's methods. CASES names every function by hand, so a
function added to the table without a case fails ``test_every_mapped_function_has_a_case``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest
import torch

from lazytensor import LazyTensor, Vi, Vj
from lazytensor.interop import protocols as interop

N, M, E, B = 7, 5, 2, 2
SHAPES = {"scalar": (1, ()), "vector": (3, ()), "batch": (1, (B,))}
# x_i * y_j + offset: x and y uniform in [lo, hi]
DOMAINS = {"real": (-1.7, 1.7, 0.0), "positive": (0.1, 2.0, 0.0), "unit": (-0.95, 0.95, 0.0),
           "above1": (0.1, 2.0, 1.05)}


@dataclass
class Data:
    """What the cases use, lazy (LazyTensors) or dense (arrays of one library)."""

    lib: str
    D: int
    nb: int
    K: object  # x_i * y_j + offset
    K2: object  # a second formula, in [0.5, 2.5]
    row: object  # an i-indexed array: (*b, N, 1, D) lazy, (*b, N, 1[, D]) dense
    mask: object  # a boolean i-indexed array
    V: np.ndarray  # (*b, M, E)
    Vt: np.ndarray  # (*b, E, N)
    leaves: list = field(default_factory=list)


def _raw(rng, domain: str, shape: str) -> dict:
    D, batch = SHAPES[shape]
    lo, hi, _ = DOMAINS[domain]
    return {
        "x": rng.uniform(lo, hi, (*batch, N, D)), "y": rng.uniform(lo, hi, (*batch, M, D)),
        "x2": rng.uniform(0.5, 1.5, (*batch, N, D)), "y2": rng.uniform(0.5, 1.5, (*batch, M, D)),
        "r": rng.uniform(-1.0, 1.0, (*batch, N, D)), "m": rng.random((*batch, N, 1)) < 0.5,
        "V": rng.standard_normal((*batch, M, E)), "Vt": rng.standard_normal((*batch, E, N)),
    }


def _build(raw: dict, domain: str, lib: str, dtype: str, lazy: bool, grad: bool = False,
           wrap: bool = False) -> Data:
    """The data of a case; ``wrap``: the i-indexed arrays as LazyTensors too (torch functions
    take no NumPy arrays, but take NumPy-backed LazyTensors)."""
    def conv(a, requires_grad=False):
        if a.dtype == np.bool_:
            return torch.from_numpy(a) if lib == "torch" else a
        a = a.astype(dtype)
        if lib == "torch":
            return torch.tensor(a, requires_grad=requires_grad)
        return a

    arrays = {k: conv(v, grad and k in ("x", "y")) for k, v in raw.items()}
    D, nb = raw["x"].shape[-1], raw["x"].ndim - 2
    offset = DOMAINS[domain][2]

    def i_(a):
        return a[..., :, None, :]

    def j_(a):
        return a[..., None, :, :]

    if lazy:
        K = LazyTensor(i_(arrays["x"])) * LazyTensor(j_(arrays["y"]))
        K = K + offset if offset else K
        K2 = LazyTensor(i_(arrays["x2"])) * LazyTensor(j_(arrays["y2"])) + 0.25
        row, mask = i_(arrays["r"]), i_(arrays["m"])
        if wrap:
            row, mask = LazyTensor(row), LazyTensor(mask.astype(dtype))
    else:
        def sq(a):
            return a[..., 0] if D == 1 else a

        K = sq(i_(arrays["x"]) * j_(arrays["y"]) + offset)
        K2 = sq(i_(arrays["x2"]) * j_(arrays["y2"]) + 0.25)
        row, mask = sq(i_(arrays["r"])), sq(i_(arrays["m"])) if D == 1 else i_(arrays["m"])
    return Data(lib, D, nb, K, K2, row, mask, arrays["V"], arrays["Vt"],
                [arrays["x"], arrays["y"]])


def sq(d: Data, r):
    """A method's reduction in NumPy's shape: (N, 1) -> (N,) for a scalar formula."""
    return r[..., 0] if d.D == 1 else r


def swap(v):
    return v.transpose(-1, -2) if isinstance(v, torch.Tensor) else np.swapaxes(v, -1, -2)


@dataclass
class Case:
    calls: Callable  # (f, d) -> list of results
    method: Callable = None  # d -> the first results, written with LazyTensor's methods
    domain: str = "real"
    shapes: tuple = ("scalar", "vector", "batch")
    libs: tuple = ("numpy", "torch")
    grad: bool = True  # torch functions: gradients compared with dense torch
    lazy: bool = False  # every result stays a LazyTensor


CASES: dict[str, Case] = {}


def _unary(names, method, domain="real", grad=True, extra=None):
    m = operator.methodcaller(method) if isinstance(method, str) else method
    for name in names:
        CASES[name] = Case(lambda f, d: [f(d.K), *(extra(f, d) if extra else [])],
                           lambda d: [m(d.K)], domain, grad=grad, lazy=True)


for _names, _method, _domain in [
    (("numpy.exp", "torch.exp"), "exp", "real"),
    (("numpy.log", "torch.log"), "log", "positive"),
    (("numpy.sqrt", "torch.sqrt"), "sqrt", "positive"),
    (("torch.rsqrt",), "rsqrt", "positive"),
    (("numpy.absolute", "numpy.fabs", "torch.abs", "torch.absolute"), "abs", "real"),
    (("numpy.sin", "torch.sin"), "sin", "real"),
    (("numpy.cos", "torch.cos"), "cos", "real"),
    (("numpy.tan", "torch.tan"), "tan", "unit"),
    (("numpy.arcsin", "torch.asin", "torch.arcsin"), "asin", "unit"),
    (("numpy.arccos", "torch.acos", "torch.arccos"), "acos", "unit"),
    (("numpy.arctan", "torch.atan", "torch.arctan"), "atan", "real"),
    (("numpy.sinh", "torch.sinh"), "sinh", "real"),
    (("numpy.cosh", "torch.cosh"), "cosh", "real"),
    (("numpy.tanh", "torch.tanh"), "tanh", "real"),
    (("numpy.arcsinh", "torch.asinh", "torch.arcsinh"), "asinh", "real"),
    (("numpy.arccosh", "torch.acosh", "torch.arccosh"), "acosh", "above1"),
    (("numpy.arctanh", "torch.atanh", "torch.arctanh"), "atanh", "unit"),
    (("numpy.log1p", "torch.log1p", "torch.special.log1p"), "log1p", "positive"),
    (("numpy.expm1", "torch.expm1", "torch.special.expm1"), "expm1", "real"),
    (("numpy.square", "torch.square"), "square", "real"),
    (("numpy.reciprocal", "torch.reciprocal"), "inv", "positive"),
    (("scipy.special.erf", "torch.erf", "torch.special.erf"), "erf", "real"),
    (("scipy.special.erfc", "torch.erfc", "torch.special.erfc"), "erfc", "real"),
    (("scipy.special.expit", "torch.sigmoid", "torch.special.expit"), "sigmoid", "real"),
    (("scipy.special.log_expit", "torch.nn.functional.logsigmoid"), "logsigmoid", "real"),
    (("numpy.sinc", "torch.sinc", "torch.special.sinc"), "sinc", "real"),
    (("numpy.negative", "torch.neg", "torch.negative"), operator.neg, "real"),
    (("numpy.positive", "torch.positive"), lambda K: K, "real"),
    (("torch.relu", "torch.nn.functional.relu"), "relu", "real"),
]:
    _unary(_names, _method, _domain)
for _names, _method in [(("numpy.sign", "torch.sign"), "sign"), (("numpy.floor", "torch.floor"), "floor"),
                        (("numpy.ceil", "torch.ceil"), "ceil"), (("numpy.rint",), "round")]:
    _unary(_names, _method, grad=False)
# complex parts: a real LazyTensor is its own conjugate and real part; imag and angle
# are taken of K * 1j (complex, lazy and dense alike)
_unary(("numpy.conjugate", "torch.conj", "torch.conj_physical", "numpy.real",
        "torch.real"), lambda K: K)
for _name, _part in (("numpy.imag", "imag"), ("torch.imag", "imag"), ("numpy.angle", "angle"),
                     ("torch.angle", "angle")):
    CASES[_name] = Case(lambda f, d: [f(d.K * 1j)], grad=False, lazy=True,
                        method=lambda d, part=_part: [
                            getattr(d.K * 1j, part)() if part == "angle" else (d.K * 1j).imag])
_unary(("numpy.round", "numpy.around"), "round", grad=False, extra=lambda f, d: [f(d.K, 1), f(d.K, -1)])
_unary(("torch.round",), "round", grad=False, extra=lambda f, d: [f(d.K, decimals=1)])
_unary(("torch.nn.functional.softplus",), "softplus",
       extra=lambda f, d: [f(d.K, beta=2.0), f(d.K, beta=2.0, threshold=1.0)])


def _binary(names, pyop, grad=True, domain="real", scalar=0.75, torch_scalar=True):
    for name in names:
        if name.startswith("torch.Tensor."):  # t.add(K): a real tensor first
            CASES[name] = Case(lambda f, d: [f(d.row, d.K)],
                               lambda d: [pyop(LazyTensor(d.row), d.K)], domain,
                               libs=("torch",), grad=grad, lazy=True)
            continue
        # torch.add(0.5, t), torch.maximum(t, 0.5) are not torch's
        numpy = name.startswith("numpy")
        CASES[name] = Case(lambda f, d, n=numpy, t=torch_scalar: [
                               f(d.K, d.K2), f(d.row, d.K), *([f(d.K, scalar)] if n or t else []),
                               *([f(scalar, d.K2)] if n else [])],
                           lambda d: [pyop(d.K, d.K2)], domain, grad=grad, lazy=True)


_binary(("numpy.add", "torch.add", "torch.Tensor.add"), operator.add)
_binary(("numpy.subtract", "torch.sub", "torch.subtract", "torch.Tensor.sub"), operator.sub)
_binary(("numpy.multiply", "torch.mul", "torch.multiply", "torch.Tensor.mul"), operator.mul)
_binary(("numpy.divide", "torch.div", "torch.divide", "torch.true_divide", "torch.Tensor.div",
         "torch.Tensor.true_divide"), operator.truediv, domain="positive")
_binary(("numpy.power", "torch.pow", "torch.Tensor.pow"), operator.pow, domain="positive")
_binary(("numpy.arctan2", "torch.atan2", "torch.arctan2", "torch.Tensor.atan2"),
        lambda a, b: a.atan2(b), torch_scalar=False)
_binary(("numpy.maximum", "torch.maximum", "torch.Tensor.maximum"),
        lambda a, b: (a - b).ifelse(a, b), scalar=0.5, torch_scalar=False)
_binary(("numpy.minimum", "torch.minimum", "torch.Tensor.minimum"),
        lambda a, b: (b - a).ifelse(a, b), scalar=0.5, torch_scalar=False)
for _names, _pyop in [
    (("numpy.less", "torch.lt", "torch.less", "torch.Tensor.lt"), operator.lt),
    (("numpy.less_equal", "torch.le", "torch.less_equal", "torch.Tensor.le"), operator.le),
    (("numpy.greater", "torch.gt", "torch.greater", "torch.Tensor.gt"), operator.gt),
    (("numpy.greater_equal", "torch.ge", "torch.greater_equal", "torch.Tensor.ge"), operator.ge),
    (("numpy.equal", "torch.eq", "torch.Tensor.eq"), operator.eq),
    (("numpy.not_equal", "torch.ne", "torch.not_equal", "torch.Tensor.ne"), operator.ne),
]:
    _binary(_names, _pyop, grad=False, scalar=0.3)
for _name in ("numpy.equal", "numpy.not_equal", "torch.eq", "torch.ne", "torch.not_equal"):
    CASES[_name].calls = (lambda c: lambda f, d: [*c(f, d), f(d.K, d.K)])(CASES[_name].calls)
CASES["torch.add"].calls = lambda f, d: [f(d.K, d.K2), f(d.row, d.K), f(d.K, d.K2, alpha=2.0)]
CASES["torch.sub"].calls = lambda f, d: [f(d.K, d.K2), f(d.row, d.K), f(d.K, d.K2, alpha=0.5)]
CASES["torch.div"].calls = lambda f, d: [f(d.K, d.K2), f(d.K, d.K2, rounding_mode="floor"),
                                         f(-d.K, d.K2, rounding_mode="trunc")]
CASES["torch.Tensor.pow"] = Case(lambda f, d: [f(d.row.abs() + 0.1, d.K)],
                                 lambda d: [LazyTensor(d.row.abs() + 0.1) ** d.K],
                                 libs=("torch",), lazy=True)
CASES["numpy.power"].calls = CASES["torch.pow"].calls = lambda f, d: [
    f(d.K, d.K2), f(d.K, 2), f(d.K, 0.5), f(d.K, 3), f(2.0, d.K)]

# selection
CASES["numpy.where"] = Case(
    lambda f, d: [f(d.K < 0.3, d.K, d.K2), f(d.mask, d.K, 0), f(d.K > 0, 1.0, d.K2)],
    lambda d: [(d.K - 0.3).ifelse(d.K2, d.K)], lazy=True)
CASES["torch.where"] = CASES["numpy.where"]
CASES["numpy.clip"] = Case(
    lambda f, d: [f(d.K, -0.5, 0.8), f(d.K, None, 0.8), f(d.K, d.row, d.K2), f(d.K, 0.8, -0.5)],
    lambda d: [d.K.clamp(-0.5, 0.8)], lazy=True)
CASES["torch.clamp"] = CASES["torch.clip"] = Case(
    lambda f, d: [f(d.K, -0.5, 0.8), f(d.K, min=0.0), f(d.K, max=0.3), f(d.K, d.row, d.K2)],
    lambda d: [d.K.clamp(-0.5, 0.8)], lazy=True)


# products, concatenation, norms
def _matmul(f, d):
    out = [f(d.K, d.V), f(d.Vt, d.K)]
    return out + ([f(d.K, d.V[:, 0]), f(d.Vt[0], d.K)] if d.nb == 0 else [])


CASES["numpy.matmul"] = Case(
    _matmul, lambda d: [d.K @ d.V, swap(d.K.T @ swap(d.Vt))], shapes=("scalar", "batch"))
CASES["torch.matmul"] = Case(
    _matmul, lambda d: [d.K @ d.V, swap(d.K.T @ swap(d.Vt))], shapes=("scalar", "batch"),
    libs=("torch",))
CASES["torch.Tensor.matmul"] = Case(lambda f, d: [f(d.Vt, d.K)],
                                    lambda d: [swap(d.K.T @ swap(d.Vt))],
                                    shapes=("scalar", "batch"), libs=("torch",))
CASES["numpy.dot"] = Case(_matmul, lambda d: [d.K @ d.V], shapes=("scalar",))
CASES["numpy.concatenate"] = Case(lambda f, d: [f([d.K, d.K2], axis=-1), f((d.K, d.K2, d.K), 2)],
                                  lambda d: [d.K.concat(d.K2)], shapes=("vector",), lazy=True)
CASES["torch.cat"] = CASES["torch.concat"] = Case(
    lambda f, d: [f([d.K, d.K2], dim=-1), f([d.K, d.K2], -1)],
    lambda d: [d.K.concat(d.K2)], shapes=("vector",), lazy=True)
CASES["torch.concatenate"] = Case(lambda f, d: [f([d.K, d.K2], axis=-1)],
                                  lambda d: [d.K.concat(d.K2)], shapes=("vector",), lazy=True)


def _norm_method(d):
    return [d.K.norm2() if d.D > 1 else (d.K * d.K).sum(dim=d.nb + 1)[..., 0] ** 0.5]


CASES["numpy.linalg.norm"] = Case(
    lambda f, d: [f(d.K, axis=-1), f(d.K), f(d.K, axis=d.nb + 1, keepdims=True),
                  f(d.K, axis=(d.nb, d.nb + 1)), f(d.K, 2, d.nb)], _norm_method)
CASES["torch.linalg.norm"] = Case(
    lambda f, d: [f(d.K, dim=-1), f(d.K), f(d.K, dim=(d.nb, d.nb + 1)), f(d.K, 2, d.nb)],
    _norm_method)
CASES["torch.linalg.vector_norm"] = Case(
    lambda f, d: [f(d.K, dim=-1), f(d.K), f(d.K, 2, (d.nb, d.nb + 1))], _norm_method)
CASES["torch.norm"] = Case(lambda f, d: [f(d.K, dim=-1), f(d.K), f(d.K, 2, d.nb)], _norm_method)


# reductions
def _reduction_calls(axis_kw: str, keep_kw: str):
    def calls(f, d):
        j, i = d.nb + 1, d.nb
        out = [f(d.K, **{axis_kw: j}), f(d.K, **{axis_kw: i}), f(d.K), f(d.K, **{axis_kw: -1}),
               f(d.K, **{axis_kw: (i, j)}), f(d.K, **{axis_kw: j, keep_kw: True})]
        if d.D > 1:
            out.append(f(d.K, **{axis_kw: (j, -1)}))
        if d.nb:
            out.append(f(d.K, **{axis_kw: (0, j)}))
        return out

    return calls


def _reduction_method(method):
    return lambda d: [sq(d, getattr(d.K, method)(dim=d.nb + 1)), sq(d, getattr(d.K, method)(dim=d.nb))]


for _names, _method, _keep in [
    (("numpy.sum",), "sum", "keepdims"), (("numpy.min", "numpy.amin"), "min", "keepdims"),
    (("numpy.max", "numpy.amax"), "max", "keepdims"), (("torch.sum",), "sum", "keepdim"),
    (("torch.amin",), "min", "keepdim"), (("torch.amax",), "max", "keepdim"),
]:
    for _name in _names:
        CASES[_name] = Case(_reduction_calls("axis" if _keep == "keepdims" else "dim", _keep),
                            _reduction_method(_method))
CASES["numpy.mean"] = Case(_reduction_calls("axis", "keepdims"),
                           lambda d: [sq(d, d.K.sum(dim=d.nb + 1)) / M])
CASES["torch.mean"] = Case(_reduction_calls("dim", "keepdim"),
                           lambda d: [sq(d, d.K.sum(dim=d.nb + 1)) / M])
for _kind in ("argmin", "argmax"):
    CASES[f"numpy.{_kind}"] = Case(
        lambda f, d: [f(d.K, axis=d.nb + 1), f(d.K, axis=d.nb), f(d.K, axis=-1),
                      f(d.K, axis=d.nb, keepdims=True)], _reduction_method(_kind), grad=False)
    CASES[f"torch.{_kind}"] = Case(
        lambda f, d: [f(d.K, dim=d.nb + 1), f(d.K, dim=d.nb), f(d.K, dim=-1),
                      f(d.K, d.nb + 1, True)], _reduction_method(_kind), grad=False)
for _kind in ("min", "max"):
    CASES[f"torch.{_kind}"] = Case(
        lambda f, d: [f(d.K, dim=d.nb + 1), f(d.K, d.nb), f(d.K), f(d.K, d.K2),
                      f(d.K, dim=d.nb + 1, keepdim=True)],
        (lambda k: lambda d: [tuple(sq(d, r) for r in getattr(d.K, f"{k}_arg{k}")(dim=d.nb + 1))])(_kind))
CASES["torch.logsumexp"] = CASES["torch.special.logsumexp"] = Case(
    lambda f, d: [f(d.K, d.nb + 1), f(d.K, dim=d.nb), f(d.K, dim=(d.nb, d.nb + 1)),
                  f(d.K, dim=d.nb + 1, keepdim=True), *([f(d.K, dim=-1)] if d.D == 1 else [])],
    _reduction_method("logsumexp"), shapes=("scalar", "batch"))


def _softmax_calls(f, d):
    out = [f(d.K, dim=d.nb), f(d.K, dim=d.nb + 1)]
    if d.D == 1:
        out.append(f(d.K, dim=d.nb + 1) @ d.V)
    if d.D == 1 and d.nb == 0:
        out.append(f(d.K, dim=-1) @ d.V[:, 0])
    return out


def _log_softmax_calls(f, d):
    return [f(d.K, dim=d.nb), f(d.K, dim=d.nb + 1)]


for _name in ("torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax"):
    CASES[_name] = Case(_softmax_calls, lambda d: [
        (d.K - LazyTensor(d.K.logsumexp(dim=d.nb)[..., None, :, :])).exp()],
        shapes=("scalar", "batch"))
for _name in ("torch.log_softmax", "torch.nn.functional.log_softmax", "torch.special.log_softmax"):
    CASES[_name] = Case(_log_softmax_calls, lambda d: [
        d.K - LazyTensor(d.K.logsumexp(dim=d.nb)[..., None, :, :])], shapes=("scalar", "batch"))
CASES["torch.topk"] = Case(
    lambda f, d: [f(d.K, 3, dim=d.nb + 1, largest=False), f(d.K, 2, d.nb), f(d.K, 3, d.nb + 1),
                  *([f(d.K, 2, largest=False)] if d.D == 1 else [])],
    lambda d: [tuple(d.K.Kmin_argKmin(3, dim=d.nb + 1))])


# ---------------------------------------------------------------------- the checks


def test_every_mapped_function_has_a_case():
    mapped = set(interop.mapped_functions())
    assert not mapped - set(CASES), f"mapped functions without a test case: {sorted(mapped - set(CASES))}"
    assert not set(CASES) - mapped, f"cases of functions that are not mapped: {sorted(set(CASES) - mapped)}"


def _np(r):
    if isinstance(r, LazyTensor):
        r = r.dense()
    if isinstance(r, tuple):
        return tuple(_np(a) for a in r)
    if isinstance(r, torch.Tensor):
        r = r.detach().numpy()
    r = np.asarray(r)
    return r.astype(np.float64) if r.dtype == np.bool_ else r


def _close(got, want, dtype, what):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), what
        for g, w in zip(got, want):
            _close(g, w, dtype, what)
        return
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    if np.issubdtype(want.dtype, np.integer):
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    rtol, atol = (2e-4, 2e-5) if dtype == "float32" else (1e-9, 1e-12)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


def _params():
    for name, case in sorted(CASES.items()):
        for lib in case.libs:
            for shape in case.shapes:
                for dtype in ("float32", "float64"):
                    yield pytest.param(name, lib, shape, dtype, id=f"{name}-{lib}-{shape}-{dtype}")


@pytest.mark.parametrize("name, lib, shape, dtype", list(_params()))
def test_mapped_function_matches_dense_and_methods(name, lib, shape, dtype, rng):
    case, f = CASES[name], interop.resolve(name)
    raw = _raw(rng, case.domain, shape)
    own = "numpy" if name.split(".")[0] in ("numpy", "scipy") else "torch"
    lazy = _build(raw, case.domain, lib, dtype, lazy=True, wrap=(own, lib) == ("torch", "numpy"))
    got = case.calls(f, lazy)
    want = case.calls(f, _build(raw, case.domain, own, dtype, lazy=False))
    assert len(got) == len(want) > 0
    for k, (g, w) in enumerate(zip(got, want)):
        if case.lazy:
            assert isinstance(g, LazyTensor), f"{name} call {k} did not stay lazy"
        if isinstance(g, LazyTensor) and np.issubdtype(_np(w).dtype, np.floating):
            assert str(g.dtype).endswith(dtype)
        _close(_np(g), _np(w), dtype, f"{name} call {k}")
    if case.method is not None:
        for k, (g, m) in enumerate(zip(got, case.method(lazy))):
            _close(_np(g), _np(m), dtype, f"{name} call {k} against the methods")


def _grad_params():
    for name, case in sorted(CASES.items()):
        if name.startswith("torch") and case.grad:
            for shape in case.shapes:
                yield pytest.param(name, shape, id=f"{name}-{shape}")


def _totals(got, want):
    """Scalars to differentiate: lazy results reduced over j by a kernel, dense ones by torch."""
    totals = [0, 0]
    for g, w in zip(got, want):
        g, w = (g[0], w[0]) if isinstance(g, tuple) else (g, w)
        if isinstance(g, LazyTensor):
            j = g.nbatchdims + 1
            g, w = g.sum(dim=j, backend="numpy"), w.sum(dim=j)
        if g.dtype.is_floating_point:
            weights = torch.linspace(0.5, 1.5, g.numel(), dtype=torch.float64)
            totals = [t + (r.reshape(-1) * weights).sum() for t, r in zip(totals, (g, w))]
    return totals


@pytest.mark.parametrize("name, shape", list(_grad_params()))
def test_gradients_flow_through_torch_functions(name, shape, rng):
    case, f = CASES[name], interop.resolve(name)
    raw = _raw(rng, case.domain, shape)
    lazy = _build(raw, case.domain, "torch", "float64", lazy=True, grad=True)
    dense = _build(raw, case.domain, "torch", "float64", lazy=False, grad=True)
    total_lazy, total_dense = _totals(case.calls(f, lazy), case.calls(f, dense))
    got = torch.autograd.grad(total_lazy, lazy.leaves)
    want = torch.autograd.grad(total_dense, dense.leaves)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-8, atol=1e-10)


# ---------------------------------------------------------------------- in use


def test_the_functions_the_issue_lists_are_mapped():
    wanted = """numpy.exp numpy.log numpy.sqrt numpy.absolute numpy.sin numpy.cos numpy.tan numpy.tanh
    numpy.arctan numpy.arctan2 numpy.sinh numpy.cosh numpy.log1p numpy.expm1 numpy.square
    numpy.negative numpy.sign numpy.add numpy.subtract numpy.multiply numpy.divide numpy.power
    numpy.maximum numpy.minimum numpy.floor numpy.ceil numpy.round numpy.less numpy.greater
    numpy.equal numpy.sum numpy.min numpy.max numpy.argmin numpy.argmax numpy.matmul numpy.dot
    numpy.where numpy.clip numpy.concatenate numpy.linalg.norm torch.exp torch.sum
    torch.logsumexp torch.softmax torch.topk torch.argmin torch.min torch.max torch.where
    torch.clamp torch.matmul torch.nn.functional.relu torch.nn.functional.softplus""".split()
    assert not set(wanted) - set(interop.mapped_functions())


def test_issue_examples_run_kernels_and_match_dense(rng):
    x, y = rng.random((300, 3)).astype(np.float32), rng.random((400, 3)).astype(np.float32)
    b = rng.standard_normal((400, 2)).astype(np.float32)
    d = Vi(x).sqdist(Vj(y))
    dd = ((x[:, None].astype(np.float64) - y[None]) ** 2).sum(-1)
    K = np.where(d < 0.5, np.exp(-d), 0)
    np.testing.assert_allclose(K @ b, np.where(dd < 0.5, np.exp(-dd), 0) @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.sum(np.maximum(np.exp(-d), 0.5), axis=1),
                               np.maximum(np.exp(-dd), 0.5).sum(1), rtol=1e-5)
    xt, yt, bt = (torch.tensor(a, requires_grad=True) for a in (x, y, b))
    dt = Vi(xt).sqdist(Vj(yt))
    dense = ((xt[:, None] - yt[None]) ** 2).sum(-1)
    out = torch.logsumexp(-dt, dim=1) + (torch.softmax(-dt, dim=1) @ bt).sum(1)
    want = torch.logsumexp(-dense, dim=1) + (torch.softmax(-dense, dim=1) @ bt).sum(1)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    got = torch.autograd.grad(out.sum(), [xt, yt, bt])
    ref = torch.autograd.grad(want.sum(), [xt, yt, bt])
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)
    values, indices = torch.topk(dt, 5, dim=1, largest=False)
    assert torch.equal(indices, dt.argKmin(5, dim=1))
    torch.testing.assert_close(values, dt.Kmin(5, dim=1))


def test_softmax_times_values_is_one_sumsoftmaxweight_reduction(rng, monkeypatch):
    from lazytensor.engine import plans as engine

    calls = []
    reduce = engine.reduce
    monkeypatch.setattr(engine, "reduce", lambda f, v, red, *a, **k: calls.append(red) or
                        reduce(f, v, red, *a, **k))
    q, k, v = (torch.tensor(rng.standard_normal(s)) for s in ((6, 4), (9, 4), (9, 3)))
    S = torch.softmax(Vi(q) | Vj(k), dim=1)
    out = S @ v
    assert calls == ["sumsoftmaxweight"]
    torch.testing.assert_close(out, torch.softmax(q @ k.T, dim=1) @ v)
    assert torch.softmax(Vi(q) | Vj(k), dim=-1).dense().shape == (6, 9)  # explicit form


def test_real_tensor_and_array_operators_keep_their_meaning(rng):
    x, y = torch.tensor(rng.random((5, 2))), torch.tensor(rng.random((4, 2)))
    K = Vi(x).sqdist(Vj(y))
    t = torch.tensor(rng.random((5, 1, 1)))
    for op, reflected in [(operator.add, "__radd__"), (operator.sub, "__rsub__"),
                          (operator.mul, "__rmul__"), (operator.truediv, "__rtruediv__"),
                          (operator.pow, "__rpow__")]:
        got, want = op(t, K), getattr(K, reflected)(t)
        assert got.formula.key == want.formula.key
        assert [(v.cat, v.shape) for v in got.variables] == [(v.cat, v.shape) for v in want.variables]
        assert all(np.array_equal(v.data, w.data) for v, w in zip(got.variables, want.variables))
        a = t.numpy()
        assert op(a, K.t().t()).formula.key == getattr(K, reflected)(a).formula.key
    np.testing.assert_array_equal((t < K).dense(), (K > t).dense())
    s = torch.ones(5, 1, 1, dtype=torch.float64)
    s += K  # Tensor.add_ refuses, Python falls back to s = s + K
    assert isinstance(s, LazyTensor)
    v = torch.tensor(rng.random(5))
    torch.testing.assert_close(v @ K, K.T @ v)  # Tensor.matmul: new, the transposed product


def test_reductions_never_dispatch_through_torch_function(rng, monkeypatch):
    calls = []
    real = interop.torch_function
    monkeypatch.setattr(interop, "torch_function", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    x = torch.tensor(rng.random((30, 3)), requires_grad=True)
    y = torch.tensor(rng.random((20, 3)))
    K = (-Vi(x).sqdist(Vj(y))).exp()
    out = (K @ torch.ones(20, 2, dtype=torch.float64)).sum() + K.logsumexp(dim=1).sum()
    out = out + K.argKmin(3, dim=0).sum() + K.min(dim=0).sum()
    out.backward()
    assert calls == [] and x.grad is not None
    torch.exp(K)
    assert calls == [torch.exp]


def test_round_goes_half_to_even_as_numpy_and_torch():
    x = np.array([[0.5], [1.5], [2.5], [-0.5], [-2.5], [3.5], [0.25], [np.inf]])
    y = np.array([[0.0], [1.0], [-2.0]])
    K, dense = Vi(x) - Vj(y), x - y.T
    np.testing.assert_array_equal(np.round(K).dense(), np.round(dense))
    np.testing.assert_array_equal(np.rint(K).dense(), np.rint(dense))
    np.testing.assert_array_equal(np.round(K, 1).dense(), np.round(dense, 1))
    Kt = Vi(torch.tensor(x)) - Vj(torch.tensor(y))
    torch.testing.assert_close(torch.round(Kt).dense(), torch.round(torch.tensor(dense)))


def test_concatenating_scalar_formulas_stacks_them_on_a_vector_axis(rng):
    x, y = rng.random((5, 2)), rng.random((4, 2))
    A, B = Vi(x).sqdist(Vj(y)), (Vi(x) | Vj(y))
    C = np.concatenate([A, B], axis=-1)
    assert C.shape == (5, 4, 2)
    np.testing.assert_allclose(C.dense(), np.stack([A.dense(), B.dense()], -1))
    np.testing.assert_allclose(np.sum(C, axis=1), C.sum(dim=1))  # (N, D): no squeeze


def test_numpy_functions_keep_numpy_shapes_where_the_methods_keep_pykeops(rng):
    K = Vi(rng.random((5, 2))).sqdist(Vj(rng.random((4, 2))))
    assert np.sum(K, axis=1).shape == (5,) and K.sum(dim=1).shape == (5, 1)
    assert np.sum(K, axis=-1).shape == (5,)  # the j axis of an (N, M) array
    assert np.sum(K, axis=1, keepdims=True).shape == (5, 1)
    assert np.argmin(K, axis=0).shape == (4,) and np.argmin(K, axis=0).dtype == np.int64
