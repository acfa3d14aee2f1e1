"""Genred formula strings: parsing (against dense NumPy float64 references and the equivalent
LazyTensor expressions), KeOps reduction names and axes, error messages, and a fuzz test.

Most checks run the dense reference backend (``backend="numpy"``) so that they compile
nothing; a few run the compiled CPU kernels, in NumPy and torch.
"""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lazytensor.codegen import ir
from lazytensor.codegen import parse as formula_parse

from lazytensor import (
    Genred,
    LazyTensor,
    Pm,
    Vi,
    Vj,
    generic_argkmin,
    generic_argmin,
    generic_logsumexp,
    generic_sum,
)
from lazytensor.numpy import Genred as NumpyGenred
from lazytensor.torch import Genred as TorchGenred
from lazytensor.torch import LazyTensor as TorchLazyTensor

N, M = 7, 5
ALIASES = ["x = Vi(3)", "y = Vj(3)", "b = Vj(2)", "s = Vi(1)", "p = Pm(3)", "c = Pm(1)"]


@pytest.fixture
def data(rng):
    return {
        "x": rng.uniform(-1, 1, (N, 3)), "y": rng.uniform(-1, 1, (M, 3)),
        "b": rng.uniform(-1, 1, (M, 2)), "s": rng.uniform(0, 1, (N, 1)),
        "p": rng.uniform(0.2, 1, 3), "c": rng.uniform(0.2, 1, 1),
    }  # fmt: skip


def dense(d):
    """The variables broadcast as (N, M, D) grids, for the NumPy references."""
    return {"x": d["x"][:, None], "y": d["y"][None], "b": d["b"][None], "s": d["s"][:, None],
            "p": d["p"][None, None], "c": d["c"][None, None]}


def _sq(a):
    return (a * a).sum(-1, keepdims=True)


# (formula, dense NumPy reference of the (N, M, D) values)
FORMULAS = [
    ("Exp(-SqDist(x,y)) * b", lambda e: np.exp(-_sq(e["x"] - e["y"])) * e["b"]),
    ("(x|y) + c", lambda e: (e["x"] * e["y"]).sum(-1, keepdims=True) + e["c"]),
    ("x - y * 2 - -p / c", lambda e: e["x"] - e["y"] * 2 - (-e["p"]) / e["c"]),
    ("Sqrt(SqNorm2(x - y) + IntCst(1))", lambda e: np.sqrt(_sq(e["x"] - e["y"]) + 1)),
    ("Pow(x - y, 3) * IntInv(2) + Pow(s, -2)", lambda e: (e["x"] - e["y"]) ** 3 / 2 + e["s"] ** -2.0),
    ("Powf(Abs(x) + 1, y)", lambda e: (np.abs(e["x"]) + 1) ** e["y"]),
    ("Rsqrt(Square(x) + 1.5e0) - Inv(Abs(y) + .5)",
     lambda e: 1 / np.sqrt(e["x"] ** 2 + 1.5) - 1 / (np.abs(e["y"]) + 0.5)),
    ("Log(Abs(x - y) + 1) * Sin(x) + Cos(y) * Tan(x*0.5)",
     lambda e: np.log(np.abs(e["x"] - e["y"]) + 1) * np.sin(e["x"]) + np.cos(e["y"]) * np.tan(e["x"] / 2)),
    ("Asin(x * 0.5) + Acos(y * 0.5) + Atan(x - y) + Atan2(x, y)",
     lambda e: np.arcsin(e["x"] / 2) + np.arccos(e["y"] / 2) + np.arctan(e["x"] - e["y"])
     + np.arctan2(e["x"], e["y"])),
    ("Sinh(x) - Cosh(y) + Tanh(x * y)",
     lambda e: np.sinh(e["x"]) - np.cosh(e["y"]) + np.tanh(e["x"] * e["y"])),
    ("Abs(x) * Sign(y) + Step(x - y) + ReLU(y)",
     lambda e: np.abs(e["x"]) * np.sign(e["y"]) + (e["x"] >= e["y"]) + np.maximum(e["y"], 0)),
    ("Clamp(x - y, -0.5, p) + ClampInt(x * 3, -1, 0)",
     lambda e: np.clip(e["x"] - e["y"], -0.5, e["p"]) + np.clip(e["x"] * 3, -1, 0)),
    ("IfElse(x - y, x, y * 2)", lambda e: np.where(e["x"] >= e["y"], e["x"], e["y"] * 2)),
    ("Mod(x * 3, 1.5, 0.25)", lambda e: np.mod(e["x"] * 3 - 0.25, 1.5) + 0.25),
    ("Round(x * 10, 1) + Floor(y * 3)", lambda e: np.round(e["x"] * 100) / 10 + np.floor(e["y"] * 3)),
    ("Norm2(x - y) * Normalize(x)",
     lambda e: np.sqrt(_sq(e["x"] - e["y"])) * e["x"] / np.sqrt(_sq(e["x"]))),
    ("WeightedSqNorm(p, x - y) + WeightedSqDist(c, x, y)",
     lambda e: (e["p"] * (e["x"] - e["y"]) ** 2).sum(-1, keepdims=True) + e["c"] * _sq(e["x"] - e["y"])),
    ("Sum(x * y) + Max(x) - Min(y) + ArgMax(x) + ArgMin(y)",
     lambda e: (e["x"] * e["y"]).sum(-1, keepdims=True) + e["x"].max(-1, keepdims=True)
     - e["y"].min(-1, keepdims=True) + e["x"].argmax(-1)[..., None] + e["y"].argmin(-1)[..., None]),
    ("Elem(x, 2) * Extract(y, 1, 2)", lambda e: e["x"][..., 2:3] * e["y"][..., 1:3]),
    ("Concat(x, Elem(b, 1))",
     lambda e: np.concatenate([np.broadcast_to(e["x"], (N, M, 3)),
                               np.broadcast_to(e["b"][..., 1:2], (N, M, 1))], -1)),
    ("OneHot(Floor(s * 4), 4) * Elem(y, 0)",
     lambda e: (np.floor(e["s"] * 4) == np.arange(4)) * e["y"][..., 0:1]),
    ("MatVecMult(TensorProd(x, y), p)",
     lambda e: e["x"] * (e["y"] * e["p"]).sum(-1, keepdims=True)),
    ("VecMatMult(y, TensorProd(x, p))", lambda e: (e["y"] * e["x"]).sum(-1, keepdims=True) * e["p"]),
    ("XLogX(Abs(x) + 0.1) + SinXDivX(y)",
     lambda e: (np.abs(e["x"]) + 0.1) * np.log(np.abs(e["x"]) + 0.1) + np.sin(e["y"]) / e["y"]),
    ("Grad(Exp(-SqDist(x, y)), x, s)",
     lambda e: -2 * (e["x"] - e["y"]) * np.exp(-_sq(e["x"] - e["y"])) * e["s"]),
    ("Var(0, 3, 0) * Vj(1, 3) + Pm(4, 3)", lambda e: e["x"] * e["y"] + e["p"]),
    ("Minus(x) + Add(x, y) + Subtract(x, y) + Mult(x, y) + Divide(x, Abs(y) + 1)",
     lambda e: -e["x"] + 2 * e["x"] + e["x"] * e["y"] + e["x"] / (np.abs(e["y"]) + 1)),
    ("Sigmoid(x) + Softplus(y) + Log1p(Abs(y)) + Expm1(x) + Sqrt(Abs(x))",
     lambda e: 1 / (1 + np.exp(-e["x"])) + np.log1p(np.exp(e["y"])) + np.log1p(np.abs(e["y"]))
     + np.expm1(e["x"]) + np.sqrt(np.abs(e["x"]))),
    ("(x | y) * (b | b) + SumT(c, 2)",
     lambda e: (e["x"] * e["y"]).sum(-1, keepdims=True) * _sq(e["b"]) + e["c"] * np.ones(2)),
]


def _args(d):
    return [d[k] for k in ("x", "y", "b", "s", "p", "c")]


@pytest.mark.parametrize("formula,reference", FORMULAS, ids=[f for f, _ in FORMULAS])
def test_formula_sum_both_axes_against_dense_numpy(formula, reference, data):
    values = reference(dense(data))
    values = np.broadcast_to(values, (N, M, values.shape[-1]))
    for axis, expected in ((1, values.sum(1)), (0, values.sum(0))):
        out = Genred(formula, ALIASES, reduction_op="Sum", axis=axis)(*_args(data), backend="numpy")
        np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)


def test_strings_build_the_same_ir_as_lazytensor_expressions(data):
    """Hash-consing: the same formula is the same node (and the same compiled kernel)."""
    x, y, b, s, p = Vi(data["x"]), Vj(data["y"]), Vj(data["b"]), Vi(data["s"]), Pm(data["p"])
    cases = [
        ("Exp(-SqDist(x, y)) * b", ["x = Vi(3)", "y = Vj(3)", "b = Vj(2)"],
         (-x.sqdist(y)).exp() * b),
        ("Sqrt(x) * Normalize(y)", ["x = Vi(3)", "y = Vj(3)"], x.sqrt() * y.normalize()),
        ("WeightedSqDist(p, x, y) + Pow(s, 3)", ["p = Pm(3)", "x = Vi(3)", "y = Vj(3)", "s = Vi(1)"],
         (x - y).weightedsqnorm(p) + s ** 3),
        ("Concat(Elem(x, 0), Extract(y, 1, 2)) | b", ["x = Vi(3)", "y = Vj(3)", "b = Vj(3)"],
         x[0].concat(y[1:3]) | Vj(data["y"] * 2)),
        ("Log(Abs(x) + 1) * IfElse(x - y, Step(x), ReLU(y)) / Elem(b, 0)",
         ["x = Vi(3)", "y = Vj(3)", "b = Vj(2)"],
         (abs(x) + 1).log() * (x - y).ifelse(x.step(), y.relu()) / b[0]),
    ]
    for text, aliases, lazy in cases:
        node, _ = formula_parse.parse(text, aliases)
        assert node is lazy.formula, (text, ir.to_text(node), ir.to_text(lazy.formula))


# ------------------------------------------------------------------------- reductions


def _dense_reduce(v, name, K=3, w=None):
    """Reference of a KeOps reduction over axis 1 of v (R, C, F)."""
    if name == "Sum":
        return v.sum(1)
    if name in ("Min", "Max"):
        return v.min(1) if name == "Min" else v.max(1)
    if name in ("ArgMin", "ArgMax"):
        return v.argmin(1) if name == "ArgMin" else v.argmax(1)
    if name in ("Min_ArgMin", "Max_ArgMax"):
        base = name.split("_")[0]
        return _dense_reduce(v, base), _dense_reduce(v, "Arg" + base)
    order = np.argsort(v[..., 0], axis=1)[:, :K]
    if name == "KMin":
        return np.take_along_axis(v[..., 0], order, 1)
    if name == "ArgKMin":
        return order
    if name == "KMin_ArgKMin":
        return np.take_along_axis(v[..., 0], order, 1), order
    m = v.max(1, keepdims=True)
    e = np.exp(v - m)
    if name == "LogSumExp" and w is None:
        return m[:, 0] + np.log(e.sum(1))
    if name == "LogSumExp":
        return m[:, 0] + np.log((e * w).sum(1))
    if name == "Max_SumShiftExp":
        return np.concatenate([m[:, 0], e.sum(1)], -1)
    if name == "SumSoftMaxWeight":
        return (e * w).sum(1) / e.sum(1)
    raise AssertionError(name)


REDUCTIONS = ["Sum", "Min", "Max", "ArgMin", "ArgMax", "Min_ArgMin", "Max_ArgMax", "KMin",
              "ArgKMin", "KMin_ArgKMin", "LogSumExp", "Max_SumShiftExp", "SumSoftMaxWeight",
              "LogSumExp+w"]
SCALAR = "SqDist(x, y) * s - Elem(y, 0)"


def _scalar_values(d):
    e = dense(d)
    return _sq(e["x"] - e["y"]) * e["s"] - e["y"][..., 0:1]


def _check(out, expected):
    if isinstance(expected, tuple):
        assert isinstance(out, tuple) and len(out) == len(expected)
        for o, x in zip(out, expected):
            _check(o, x)
        return
    out = out.numpy() if isinstance(out, torch.Tensor) else out
    if np.issubdtype(np.asarray(expected).dtype, np.integer):
        assert out.dtype == np.int64
        np.testing.assert_array_equal(out, expected)
    else:
        np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("axis", [0, 1])
def test_keops_reduction_names_and_axes(reduction, axis, data):
    """axis=1 reduces over j (the output is indexed by i), axis=0 over i, as pykeops."""
    name, formula2 = reduction, None
    if reduction in ("SumSoftMaxWeight", "LogSumExp+w"):
        name, formula2 = reduction.split("+")[0], "Exp(b)" if reduction == "LogSumExp+w" else "b"
    opt_arg = 3 if "KMin" in name else None
    red = Genred(SCALAR, ALIASES, reduction_op=name, axis=axis, opt_arg=opt_arg, formula2=formula2)
    out = red(*_args(data), backend="numpy")
    v = _scalar_values(data)
    w = np.broadcast_to(dense(data)["b"], (N, M, 2))
    w = np.exp(w) if reduction == "LogSumExp+w" else w
    if axis == 0:
        v, w = v.transpose(1, 0, 2), w.transpose(1, 0, 2)
    expected = _dense_reduce(np.broadcast_to(v, w.shape[:2] + (1,)), name, w=w if formula2 else None)
    if name == "LogSumExp" and formula2 is None or name in ("Min", "Max", "ArgMin", "ArgMax"):
        expected = expected.reshape(-1, 1)
    if name in ("Min_ArgMin", "Max_ArgMax"):
        expected = tuple(e.reshape(-1, 1) for e in expected)
    _check(out, expected)


def test_compiled_sum_numpy_and_torch(data):
    formula, ref = FORMULAS[0]
    values = np.broadcast_to(ref(dense(data)), (N, M, 2))
    args = [data["x"], data["y"], data["b"]]
    aliases = ALIASES[:3]
    out = NumpyGenred(formula, aliases, axis=1)(*args)
    np.testing.assert_allclose(out, values.sum(1), rtol=1e-12)
    out = TorchGenred(formula, aliases, axis=0)(*[torch.tensor(a) for a in args])
    assert isinstance(out, torch.Tensor) and out.shape == (M, 2)
    np.testing.assert_allclose(out.numpy(), values.sum(0), rtol=1e-12)


def test_compiled_argkmin_and_softmax_with_batch(rng):
    B = 2
    x, y, w = rng.normal(size=(B, 9, 2)), rng.normal(size=(B, 11, 2)), rng.normal(size=(B, 11, 1))
    nn = Genred("SqDist(x, y)", ["x = Vi(2)", "y = Vj(2)"], "ArgKMin", axis=0, opt_arg=4)
    d2 = ((x[:, :, None] - y[:, None]) ** 2).sum(-1)  # (B, 9, 11)
    np.testing.assert_array_equal(nn(x, y), np.argsort(d2, axis=1)[:, :4].transpose(0, 2, 1))
    sm = Genred("-SqDist(x, y)", ["x = Vi(2)", "y = Vj(2)", "w = Vj(1)"], "SumSoftMaxWeight",
                axis=1, formula2="w")
    e = np.exp(-d2 - (-d2).max(-1, keepdims=True))
    np.testing.assert_allclose(sm(x, y, w), (e @ w) / e.sum(-1, keepdims=True), rtol=1e-10)


def test_torch_gradient_through_genred(data):
    x, y, b = (torch.tensor(data[k], requires_grad=True) for k in ("x", "y", "b"))
    out = TorchGenred(FORMULAS[0][0], ALIASES[:3], axis=1)(x, y, b)
    g = torch.tensor(np.random.default_rng(0).normal(size=(N, 2)))
    grads = torch.autograd.grad(out, [x, y, b], g)
    xd, yd, bd = (t.detach().clone().requires_grad_() for t in (x, y, b))
    ref = (torch.exp(-((xd[:, None] - yd[None]) ** 2).sum(-1, keepdim=True)) * bd[None]).sum(1)
    for got, want in zip(grads, torch.autograd.grad(ref, [xd, yd, bd], g)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)


def test_generic_helpers_choose_axis_from_output(data):
    x, y = data["x"], data["y"]
    d = dense(data)
    v = np.broadcast_to((d["x"] * d["y"]).sum(-1, keepdims=True), (N, M, 1))
    f = generic_sum("(x | y)", "a = Vi(1)", "x = Vi(3)", "y = Vj(3)")
    np.testing.assert_allclose(f(x, y, backend="numpy"), v.sum(1))
    f = generic_sum("(x | y)", "a = Vj(1)", "x = Vi(3)", "y = Vj(3)")
    np.testing.assert_allclose(f(x, y, backend="numpy"), v.sum(0))
    f = generic_logsumexp("(x | y)", "a = Vi(1)", "x = Vi(3)", "y = Vj(3)")
    np.testing.assert_allclose(f(x, y, backend="numpy")[:, 0], np.log(np.exp(v[..., 0]).sum(1)))
    f = generic_argmin("(x | y)", "a = Vj(1)", "x = Vi(3)", "y = Vj(3)")
    np.testing.assert_array_equal(f(x, y, backend="numpy")[:, 0], v[..., 0].argmin(0))
    f = generic_argkmin("(x | y)", "a = Vi(2)", "x = Vi(3)", "y = Vj(3)")
    np.testing.assert_array_equal(f(x, y, backend="numpy"), np.argsort(v[..., 0], 1)[:, :2])
    with pytest.raises(ValueError, match="declares dimension 3"):
        generic_sum("(x | y)", "a = Vi(3)", "x = Vi(3)", "y = Vj(3)")


def test_alias_indices_explicit_implicit_and_inline(data):
    x, y = data["x"], data["y"]
    expected = np.broadcast_to(x[:, None] - y[None], (N, M, 3)).sum(1)
    # Explicit indices give the argument order.
    f = Genred("x - y", ["y = Vj(1, 3)", "x = Vi(0, 3)"], axis=1)
    np.testing.assert_allclose(f(x, y, backend="numpy"), expected)
    # KeOps's Var(index, dim, cat) in an alias and inline; Var(dim, cat) takes the position.
    f = Genred("x - Var(1, 3, 1)", ["x = Var(3, 0)"], axis=1)
    np.testing.assert_allclose(f(x, y, backend="numpy"), expected)
    with pytest.raises(ValueError, match="both have index 0"):
        Genred("x", ["x = Vi(3)", "y = Vj(0, 3)"])
    with pytest.raises(ValueError, match="no variable has index 1"):
        Genred("x + Vj(2, 3)", ["x = Vi(3)"])
    with pytest.raises(ValueError, match="already"):
        Genred("x + Vj(0, 3)", ["x = Vi(3)"])


def test_call_checks_arguments(data):
    f = Genred("x * c", ["x = Vi(3)", "c = Pm(1)"], axis=1)
    np.testing.assert_allclose(f(data["x"], 2.0, backend="numpy"), data["x"] * 2 * 1)
    with pytest.raises(TypeError, match="expected 2 arrays"):
        f(data["x"])
    with pytest.raises(ValueError, match=r"argument 0 \(x = Vi\(0, 3\)\)"):
        f(data["y"][:, :2], 2.0)
    with pytest.raises(ValueError, match="unknown reduction"):
        Genred("x", ["x = Vi(3)"], reduction_op="Median")
    with pytest.raises(ValueError, match="opt_arg"):
        Genred("x", ["x = Vi(3)"], reduction_op="ArgKMin")
    with pytest.raises(ValueError, match="formula2"):
        Genred("x", ["x = Vi(3)"], reduction_op="SumSoftMaxWeight")
    with pytest.raises(ValueError, match="axis"):
        Genred("x", ["x = Vi(3)"], axis=2)


def test_submodules_reexport_pykeops_names():
    assert TorchLazyTensor is LazyTensor and TorchGenred is Genred and NumpyGenred is Genred


# ------------------------------------------------------------------------- errors


BAD = [
    ("Exp(-SqDist(x,)) * b", 14, "expected a number"),
    ("Exp(x", 5, "expected ')'"),
    ("x +", 3, "end of the string"),
    ("Foo(x)", 0, "unknown function 'Foo'"),
    ("SqDist(x, z)", 10, "unknown name 'z'"),
    ("x @ y", 2, "unexpected character '@'"),
    ("Elem(x, 3)", 0, "out of range"),
    ("x + Concat(x, y)", 2, "incompatible vector dimensions"),
    ("Pow(x, 1.5)", 7, "expected an integer"),
    ("Exp(x, y)", 5, "Exp takes 1 argument"),
    ("x y", 2, "unexpected 'y'"),
    ("Exp", 0, "Exp is a function"),
    ("x(1)", 0, "is a variable, not a function"),
    ("1e+", 1, "malformed exponent"),
    ("Var(0, 4, 0)", 0, "already"),
    ("Var(5, 1, 3)", 3, "category must be 0"),
    ("Grad(x, x + y, x)", 10, "expected ','"),
    ("IntInv(0)", 0, "division by zero"),
    ("", 0, "empty formula"),
    ("__import__('os')", 11, "unexpected character"),
    ("Exp(x) ! 2", 7, "unexpected character '!'"),
]


@pytest.mark.parametrize("text,pos,message", BAD, ids=[b[0] or "empty" for b in BAD])
def test_malformed_formula_points_at_the_token(text, pos, message):
    with pytest.raises(ValueError) as info:
        Genred(text, ["x = Vi(3)", "y = Vj(3)", "b = Vj(1)"])
    lines = str(info.value).splitlines()
    assert message in lines[0]
    assert lines[-2] == "    " + text
    assert lines[-1] == "    " + " " * pos + "^"


@pytest.mark.parametrize("alias,pos", [("x = Vq(3)", 4), ("x Vi(3)", 2), ("x = Vi(3", 8),
                                       ("Exp = Vi(3)", 0), ("x = Vi(0)", 6), ("x = Vi(3) y", 10)])
def test_malformed_alias_points_at_the_token(alias, pos):
    with pytest.raises(ValueError) as info:
        Genred("x", [alias])
    assert str(info.value).splitlines()[-1] == "    " + " " * pos + "^"


# ------------------------------------------------------------------------- fuzzing

FUZZ_ALIASES = ["x = Vi(3)", "y = Vj(3)", "b = Vj(1)", "p = Pm(2)"]
_NAMES = sorted(formula_parse.FUNCTIONS) + ["Var", "Vi", "Vj", "Pm", "x", "y", "b", "p", "z"]
_TOKENS = _NAMES + ["0", "1", "2", "3", "-1", "1.5", ".5", "1e3", "1e400", "9" * 30, "(", ")",
                    ",", "+", "-", "*", "/", "|", "=", "@", "'", "**", "1e", "x2", "__class__"]


def _leaf():
    return st.sampled_from(["x", "y", "b", "p", "1", "2.5", "Var(0, 3, 0)", "Vj(4, 2)", "IntCst(3)"])


def _grow(children):
    ints = st.integers(-3, 5).map(str)
    arg = st.one_of(children, ints)
    call = st.tuples(st.sampled_from(_NAMES), st.lists(arg, min_size=0, max_size=4)).map(
        lambda t: f"{t[0]}({', '.join(t[1])})")
    binary = st.tuples(children, st.sampled_from("+-*/|"), children).map(
        lambda t: f"({t[0]} {t[1]} {t[2]})")
    return st.one_of(call, binary, children.map(lambda c: "-" + c))


FUZZ_STRINGS = st.one_of(
    st.lists(st.sampled_from(_TOKENS), max_size=20).map(" ".join),
    st.lists(st.sampled_from(_TOKENS), max_size=20).map("".join),
    st.recursive(_leaf(), _grow, max_leaves=12),
    st.text(max_size=30),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(FUZZ_STRINGS)
def test_fuzz_parse_succeeds_or_raises_value_error(text):
    try:
        node, variables = formula_parse.parse(text, FUZZ_ALIASES)
    except ValueError:
        return
    assert isinstance(node, ir.Node) and node.dim >= 1
    assert [v.index for v in variables] == list(range(len(variables)))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(_TOKENS + ["Vi", "Vj", "Pm", "=", "x"]), max_size=8).map(" ".join))
def test_fuzz_alias_parses_or_raises_value_error(text):
    try:
        formula_parse.parse_alias(text, 0)
    except ValueError:
        pass
