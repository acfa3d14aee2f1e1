"""Random formulas (hypothesis): the compiled CPU kernel against the NumPy reference, and
torch gradients through the kernels against dense torch autograd.

Formulas are trees of depth <= 5 over i-, j- and parameter variables of small dimensions,
drawing from every op of ``codegen.ops.REGISTRY`` (see ``OPS``: each op's arity, how its
dimension constrains its operands, the domain its operands are brought into, and a bound
of its output). Values stay in safe domains: ``log(|a| + 1)``, ``asin(a / 5)`` with
``|a| <= 4``, and an operand whose bound exceeds 4 is first squashed (``tanh``, ``atan``,
``sin``, ``cos``, ``sigmoid``, ``erf``). Tolerances are relative to the magnitude of what is
reduced (``Σ_j |f_ij|`` for sums).

Every example compiles a kernel or a few (~0.5 s each): CI runs ~50 examples in all;
``LAZYTENSOR_HYPOTHESIS_EXAMPLES=2000`` runs thousands locally.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st
from lazytensor.codegen import arraymath, ops

from lazytensor import LazyTensor, Vi, Vj
from lazytensor.backends.reference import dense as reference

_LOCAL = os.environ.get("LAZYTENSOR_HYPOTHESIS_EXAMPLES")
_COMMON = {
    "deadline": None,
    "derandomize": False,
    "print_blob": True,
    "suppress_health_check": [
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
}
settings.register_profile("lazytensor-ci", max_examples=35, **_COMMON)
settings.register_profile("lazytensor-local", max_examples=int(_LOCAL or 35), **_COMMON)
PROFILE = settings.get_profile("lazytensor-local" if _LOCAL else "lazytensor-ci")
GRAD_PROFILE = settings(PROFILE, max_examples=max(1, PROFILE.max_examples // 3))

SQUASH = ("tanh", "atan", "sin", "cos", "sigmoid", "erf")
LIMIT = 4.0  # operands are squashed into [-4, 4] when their bound is larger


# ------------------------------------------------------------------ formula trees


@dataclass(frozen=True)
class Leaf:
    cat: str  # "i", "j", "p"
    dim: int
    k: int  # which of the variables of this category and dimension


@dataclass(frozen=True)
class IntConst:
    value: int


@dataclass(frozen=True)
class FloatParam:
    value: float


@dataclass(frozen=True)
class Apply:
    name: str
    args: tuple
    params: tuple = ()


def build(node, leaves) -> LazyTensor:
    """The LazyTensor of a tree, with ``leaves[(cat, dim, k)]`` for its variables."""
    if isinstance(node, Leaf):
        return leaves[(node.cat, node.dim, node.k)]
    if isinstance(node, (IntConst, FloatParam)):
        return LazyTensor(node.value)
    first, *rest = [build(a, leaves) for a in node.args]
    return first._op(node.name, *rest, params=node.params)


def show(node) -> str:
    if isinstance(node, Leaf):
        return f"{'VVP'['ijp'.index(node.cat)]}{node.cat}{node.k}[{node.dim}]"
    if isinstance(node, (IntConst, FloatParam)):
        return repr(node.value)
    params = ", ".join(map(repr, node.params))
    return f"{node.name}({', '.join(show(a) for a in node.args)}{'; ' + params if params else ''})"


def leaves_of(node, found=None) -> set:
    found = set() if found is None else found
    if isinstance(node, Leaf):
        found.add((node.cat, node.dim, node.k))
    elif isinstance(node, Apply):
        for a in node.args:
            leaves_of(a, found)
    return found


# ------------------------------------------------------------------ the op table

# Domains: the transformation applied to an operand before the op.
#   "any": squashed into [-4, 4];  "pos": |a| + 1 (>= 1);  "ge2": |a| + 2;
#   "unit": a / 5 (|.| <= 0.8);  "tan": a / 4 (|.| <= 1 < pi/2).


@dataclass(frozen=True)
class OpKind:
    shape: str  # how the output dimension constrains the operands (see _operand_dims)
    domains: tuple  # one per operand
    bound: object  # (operand bounds, params) -> bound of the output


def _b(f):
    return lambda bs, p: f(*bs)


_E = math.e
ELEMENTWISE_1 = {
    "neg": ("any", _b(lambda a: a)),
    "abs": ("any", _b(lambda a: a)),
    "relu": ("any", _b(lambda a: a)),
    "floor": ("any", _b(lambda a: a + 1)),
    "ceil": ("any", _b(lambda a: a + 1)),
    "round": ("any", _b(lambda a: a + 1)),
    "sign": ("any", _b(lambda a: 1)),
    "step": ("any", _b(lambda a: 1)),
    "exp": ("any", _b(lambda a: _E**a)),
    "expm1": ("any", _b(lambda a: _E**a)),
    "sinh": ("any", _b(lambda a: _E**a)),
    "cosh": ("any", _b(lambda a: _E**a)),
    "log": ("pos", _b(lambda a: math.log(a) + 1)),
    "log1p": ("pos", _b(lambda a: math.log(a + 1) + 1)),
    "sqrt": ("pos", _b(lambda a: math.sqrt(a))),
    "rsqrt": ("pos", _b(lambda a: 1)),
    "inv": ("pos", _b(lambda a: 1)),
    "xlogx": ("pos", _b(lambda a: a * math.log(a) + 1)),
    "sin": ("any", _b(lambda a: 1)),
    "cos": ("any", _b(lambda a: 1)),
    "tan": ("tan", _b(lambda a: 1.6)),
    "tanh": ("any", _b(lambda a: 1)),
    "asin": ("unit", _b(lambda a: 1.6)),
    "acos": ("unit", _b(lambda a: 3.2)),
    "atan": ("any", _b(lambda a: 1.6)),
    "asinh": ("any", _b(lambda a: a)),
    "acosh": ("ge2", _b(lambda a: a)),
    "atanh": ("unit", _b(lambda a: 1.2)),
    "erf": ("any", _b(lambda a: 1)),
    "erfc": ("any", _b(lambda a: 2)),
    "sigmoid": ("any", _b(lambda a: 1)),
    "softplus": ("any", _b(lambda a: a + 1)),
    "logsigmoid": ("any", _b(lambda a: a + 1)),
    "square": ("any", _b(lambda a: a * a)),
    "sinxdivx": ("any", _b(lambda a: 1)),
}
ELEMENTWISE_2 = {
    "add": (("any", "any"), _b(lambda a, b: a + b)),
    "sub": (("any", "any"), _b(lambda a, b: a + b)),
    "mul": (("any", "any"), _b(lambda a, b: a * b)),
    "div": (("any", "pos"), _b(lambda a, b: a)),
    "atan2": (("any", "any"), _b(lambda a, b: 3.2)),
    "min2": (("any", "any"), _b(max)),
    "max2": (("any", "any"), _b(max)),
    **{c: (("any", "any"), _b(lambda a, b: 1)) for c in ("eq", "ne", "lt", "gt", "le", "ge")},
}

OPS: dict[str, OpKind] = {
    **{n: OpKind("same", (d,), f) for n, (d, f) in ELEMENTWISE_1.items()},
    **{n: OpKind("broadcast", d, f) for n, (d, f) in ELEMENTWISE_2.items()},
    "clamp": OpKind("broadcast", ("any", "any", "any"), _b(lambda a, b, c: max(a, b, c))),
    "ifelse": OpKind("broadcast", ("any", "any", "any"), _b(lambda c, a, b: max(a, b))),
    "pow": OpKind("pow", ("any",), lambda bs, p: (bs[0] + 1) ** abs(p[0])),
    "sum": OpKind("to_scalar", ("any",), lambda bs, p: 4 * bs[0]),
    "vmin": OpKind("to_scalar", ("any",), _b(lambda a: a)),
    "vmax": OpKind("to_scalar", ("any",), _b(lambda a: a)),
    "vargmin": OpKind("to_scalar", ("any",), _b(lambda a: 4)),
    "vargmax": OpKind("to_scalar", ("any",), _b(lambda a: 4)),
    "expand": OpKind("expand", ("any",), _b(lambda a: a)),
    "slice": OpKind("slice", ("any",), _b(lambda a: a)),
    "pad": OpKind("pad", ("any",), _b(lambda a: a)),
    "gather": OpKind("gather", ("any",), _b(lambda a: a)),
    "scatter": OpKind("scatter", ("any",), lambda bs, p: len(p[0]) * bs[0]),
    "concat": OpKind("concat", ("any", "any"), _b(max)),
    "one_hot": OpKind("one_hot", ("any",), _b(lambda a: 1)),
    "matvec": OpKind("matvec", ("any", "any"), _b(lambda a, b: 4 * a * b)),
    "vecmat": OpKind("vecmat", ("any", "any"), _b(lambda a, b: 4 * a * b)),
    "tensorprod": OpKind("tensorprod", ("any", "any"), _b(lambda a, b: a * b)),
    "matmul": OpKind("matmul", ("any", "any"), lambda bs, p: p[0] * bs[0] * bs[1]),
    "softmax_weight": OpKind("softmax_weight", ("any", "any"), _b(lambda a, b: _E ** (a + b))),
    "powf": OpKind("broadcast", ("pos", "unit"),
                   _b(lambda a, b: math.exp(min(abs(b) * math.log(a), 30.0)))),
}

POW_EXPONENTS = (2.0, 3.0, 0.0, 1.0, 4.0, -1.0, -2.0, 0.5, -0.5, 1.5, 2.5)


def test_every_registered_op_is_drawn():
    builtin = {n for n, d in ops.REGISTRY.items() if not d.user}
    assert builtin - set(OPS) == set(), "teach OPS (test_property.py) the new ops"
    assert set(OPS) - set(ops.REGISTRY) == set()


# ------------------------------------------------------------------ strategies


def _guard(node, bound, domain):
    if domain == "pos":
        return Apply("add", (Apply("abs", (node,)), IntConst(1))), bound + 1
    if domain == "ge2":
        return Apply("add", (Apply("abs", (node,)), IntConst(2))), bound + 2
    if domain == "unit":
        return Apply("div", (node, IntConst(5))), bound / 5
    if domain == "tan":
        return Apply("div", (node, IntConst(4))), bound / 4
    return node, bound


@st.composite
def squashed(draw, dim, depth):
    node, bound = draw(expr(dim, depth))
    if bound > LIMIT:
        node, bound = Apply(draw(st.sampled_from(SQUASH)), (node,)), 1.6
    return node, bound


@st.composite
def leaf(draw, dim):
    kinds = ["i", "j", "p"] + (["int", "float"] if dim == 1 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "int":
        v = draw(st.integers(-3, 3))
        return IntConst(v), abs(v)
    if kind == "float":
        v = draw(st.floats(-2, 2, allow_nan=False, width=32))
        return FloatParam(float(v)), abs(v)
    return Leaf(kind, dim, draw(st.integers(0, 1))), 2.0


def _divisor_pairs(n):
    return [(a, n // a) for a in range(1, n + 1) if n % a == 0]


def _operand_dims(draw, kind: OpKind, dim: int):
    """(operand dimensions, params) for an op of this kind with output dimension ``dim``."""
    s = kind.shape
    if s == "same" or s == "pow":
        params = (draw(st.sampled_from(POW_EXPONENTS)),) if s == "pow" else ()
        return [dim], params
    if s in ("broadcast", "softmax_weight"):  # the latter: exp(a - b), with or without limit
        n = len(kind.domains)
        dims = [draw(st.sampled_from([1, dim])) for _ in range(n)]
        if dim > 1 and dim not in dims:
            dims[draw(st.integers(0, n - 1))] = dim
        return dims, (draw(st.booleans()),) if s == "softmax_weight" else ()
    if s == "to_scalar":
        return [draw(st.integers(1, 4))], ()
    if s == "expand":
        return [1], (dim,)
    if s == "one_hot":
        return [1], (dim,)
    if s == "slice":
        extra = draw(st.integers(0, 2))
        return [dim + extra], (draw(st.integers(0, extra)), dim)
    if s == "pad":
        d = draw(st.integers(1, dim))
        return [d], (draw(st.integers(0, dim - d)), dim)
    if s == "gather":
        d = draw(st.integers(1, 4))
        return [d], (tuple(draw(st.lists(st.integers(0, d - 1), min_size=dim, max_size=dim))),)
    if s == "scatter":
        d = draw(st.integers(1, 4))
        return [d], (tuple(draw(st.lists(st.integers(0, dim - 1), min_size=d, max_size=d))), dim)
    if s == "concat":
        d = draw(st.integers(1, dim - 1))
        return [d, dim - d], ()
    if s == "matvec":  # A (n*m) times x (m) -> n
        m = draw(st.integers(1, 3))
        return [dim * m, m], ()
    if s == "vecmat":  # x (n) times A (n*m) -> m
        n = draw(st.integers(1, 3))
        return [n, n * dim], ()
    if s == "tensorprod":
        a, b = draw(st.sampled_from(_divisor_pairs(dim)))
        return [a, b], ()
    if s == "matmul":  # A (n×k) @ B (k×m) -> n*m
        n, m = draw(st.sampled_from(_divisor_pairs(dim)))
        k = draw(st.integers(1, 3))
        return [n * k, k * m], (k,)
    raise AssertionError(s)


def _ops_for(dim):
    names = []
    for name, kind in OPS.items():
        if kind.shape == "to_scalar" and dim != 1:
            continue
        if kind.shape == "concat" and dim < 2:
            continue
        names.append(name)
    return sorted(names)


@st.composite
def expr(draw, dim, depth):
    """(tree, bound of |value|) with output dimension ``dim`` and depth <= ``depth``."""
    if depth == 0 or draw(st.integers(0, 4)) == 0:
        return draw(leaf(dim))
    return draw(expr_rooted(draw(st.sampled_from(_ops_for(dim))), dim, depth))


@st.composite
def expr_rooted(draw, name, dim, depth=2):
    """(tree, bound) of an ``name`` node of dimension ``dim`` over subtrees of depth < depth."""
    kind = OPS[name]
    dims, params = _operand_dims(draw, kind, dim)
    if kind.shape == "pow" and (params[0] < 0 or params[0] != int(params[0])):
        domains = ("pos",)
    else:
        domains = kind.domains
    args, bounds = [], []
    for d, domain in zip(dims, domains):
        node, bound = draw(squashed(d, depth - 1))
        node, bound = _guard(node, bound, domain)
        args.append(node)
        bounds.append(bound)
    return Apply(name, tuple(args), params), min(float(kind.bound(bounds, params)), 1e12)


REDUCTIONS = (
    "sum",
    "min",
    "max",
    "argmin",
    "argmax",
    "min_argmin",
    "max_argmax",
    "kmin",
    "argkmin",
    "kmin_argkmin",
    "logsumexp",
    "logsumexp_weight",
    "sumsoftmaxweight",
    "max_sumshiftexp",
)
SCALAR_ONLY = {"logsumexp", "logsumexp_weight", "sumsoftmaxweight", "max_sumshiftexp"}
DIFFERENTIABLE = {
    "sum",
    "min",
    "max",
    "min_argmin",
    "max_argmax",
    "kmin",
    "kmin_argkmin",
    "logsumexp",
    "logsumexp_weight",
    "sumsoftmaxweight",
}


@dataclass
class Problem:
    tree: object
    weight: object  # tree of the weight (weighted reductions) or None
    reduction: str
    axis: int
    K: int
    N: int
    M: int
    seed: int

    def sizes(self):
        """(N, M) as bound: a formula (with its weight) without j-variables has M = 1."""
        cats = {key[0] for key in leaves_of(self.tree)}
        if self.weight is not None:
            cats |= {key[0] for key in leaves_of(self.weight)}
        return (self.N if "i" in cats else 1), (self.M if "j" in cats else 1)

    def __repr__(self):
        w = f", weight={show(self.weight)}" if self.weight is not None else ""
        return (
            f"Problem({self.reduction}(axis={self.axis}, K={self.K}) of {show(self.tree)}{w}; "
            f"N={self.N}, M={self.M}, seed={self.seed})"
        )


@st.composite
def problems(draw, reductions=REDUCTIONS):
    reduction = draw(st.sampled_from(reductions))
    dim = 1 if reduction in SCALAR_ONLY else draw(st.integers(1, 4))
    tree, _ = draw(expr(dim, 5))
    weight = None
    if reduction in ("logsumexp_weight", "sumsoftmaxweight"):
        w, bound = draw(squashed(draw(st.integers(1, 3)), 2))
        weight = _guard(w, bound, "pos")[0] if reduction == "logsumexp_weight" else w
    N, M = draw(st.integers(1, 7)), draw(st.integers(1, 9))
    axis = draw(st.integers(0, 1))
    p = Problem(tree, weight, reduction, axis, 1, N, M, draw(st.integers(0, 2**32 - 1)))
    reduced = p.sizes()[axis]
    p.K = draw(st.integers(1, min(3, reduced)))
    return p


# ------------------------------------------------------------------ evaluation


def make_data(p: Problem, lib="numpy"):
    rng = np.random.default_rng(p.seed)
    keys = sorted(leaves_of(p.tree) | (leaves_of(p.weight) if p.weight is not None else set()))
    rows = {"i": p.N, "j": p.M}
    data = {}
    for cat, dim, k in keys:
        shape = (rows[cat], dim) if cat in rows else (dim,)
        data[(cat, dim, k)] = rng.uniform(-2, 2, shape)
    if lib == "torch":
        data = {key: torch.tensor(a, requires_grad=True) for key, a in data.items()}
    wrap = {"i": lambda a: Vi(a), "j": lambda a: Vj(a), "p": lambda a: LazyTensor(a, axis=2)}
    leaves = {key: wrap[key[0]](a) for key, a in data.items()}
    return data, leaves


def run(p: Problem, leaves, backend):
    F = build(p.tree, leaves)
    kw = {"dim": p.axis, "backend": backend}
    r = p.reduction
    if r in ("kmin", "argkmin", "kmin_argkmin"):
        return getattr(
            F, {"kmin": "Kmin", "argkmin": "argKmin", "kmin_argkmin": "Kmin_argKmin"}[r]
        )(p.K, **kw)
    if r == "logsumexp_weight":
        return F.logsumexp(weight=build(p.weight, leaves), **kw)
    if r == "sumsoftmaxweight":
        return F.sumsoftmaxweight(build(p.weight, leaves), **kw)
    return getattr(F, r)(**kw)


def dense_values(p: Problem, tree, leaves, xp):
    """The formula on every pair, (N, M, F) with the reduced index on axis 1 (swapped for axis 0)."""
    F = build(tree, leaves)
    env = {}
    for k, v in enumerate(F.variables):
        if v.is_scalar:
            env[k] = xp.asarray([v.data], dense_like(leaves, xp))[None, None, :]
        elif v.cat == "i":
            env[k] = v.data[:, None, :]
        elif v.cat == "j":
            env[k] = v.data[None, :, :]
        else:
            env[k] = v.data[None, None, :]
    if env:
        values = reference.evaluate(F.formula, env, xp)
    else:  # constants only
        values = reference.evaluate(F.formula, {})
        values = torch.from_numpy(values) if xp.name == "torch" else values
    N, M = p.sizes()
    values = (
        values.expand(N, M, -1)
        if xp.name == "torch"
        else np.broadcast_to(values, (N, M, values.shape[-1]))
    )
    if p.axis == 0:
        values = values.transpose(0, 1) if xp.name == "torch" else values.transpose(1, 0, 2)
    return values


def dense_like(leaves, xp):
    for lt in leaves.values():
        return lt.variables[0].data
    return torch.zeros(1, dtype=torch.float64) if xp.name == "torch" else np.zeros(1)


def _outputs(res):
    return list(res) if isinstance(res, tuple) else [res]


def _index_outputs(reduction):
    return {
        "argmin": [0],
        "argmax": [0],
        "min_argmin": [1],
        "max_argmax": [1],
        "argkmin": [0],
        "kmin_argkmin": [1],
    }.get(reduction, [])


def check_forward(p: Problem, got, want, values):
    """``got`` (kernel) against ``want`` (reference), tolerances relative to the magnitudes."""
    mag = np.abs(values)
    with np.errstate(all="ignore"):
        scale = 1 + (mag.sum(axis=1) if p.reduction == "sum" else mag.max(axis=1))  # (rows, F)
    scale = np.where(np.isfinite(scale), scale, 1.0)
    index_outs = _index_outputs(p.reduction)
    for k, (g, w) in enumerate(zip(_outputs(got), _outputs(want))):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (k, g.shape, w.shape, g.dtype, w.dtype)
        if k in index_outs:
            _check_indices(p, g, w, values, scale)
            continue
        s = scale.max(axis=-1, keepdims=True) if g.ndim == scale.ndim else scale.max()
        if p.reduction in ("kmin", "kmin_argkmin"):
            s = (
                scale.max(axis=-1)[:, None, None]
                if g.ndim == 3
                else scale.max(axis=-1, keepdims=True)
            )
        err = np.abs(g - w)
        bad = ~((err <= 1e-9 * s) | (np.isnan(g) & np.isnan(w)) | (g == w))
        assert not bad.any(), (
            f"output {k}: kernel {g[bad][:5]} vs reference {w[bad][:5]}, "
            f"scale {np.broadcast_to(s, g.shape)[bad][:5]}"
        )


def _check_indices(p, g, w, values, scale):
    """Indices equal, or pointing at values equal within tolerance (near-ties)."""
    F = values.shape[-1]
    gi = (
        g.reshape(g.shape[0], -1, F)
        if p.reduction in ("argkmin", "kmin_argkmin")
        else g[:, None, :]
    )
    wi = (
        w.reshape(w.shape[0], -1, F)
        if p.reduction in ("argkmin", "kmin_argkmin")
        else w[:, None, :]
    )
    rows, cols = np.nonzero((gi != wi).reshape(gi.shape[0], -1))
    for r, c in zip(rows, cols):
        kk, f = divmod(c, F)
        a, b = values[r, gi[r, kk, f], f], values[r, wi[r, kk, f], f]
        assert a == b or abs(a - b) <= 1e-9 * scale[r, f], (
            f"row {r}: kernel index {gi[r, kk, f]} ({a}) vs reference {wi[r, kk, f]} ({b})"
        )


@given(problems())
@PROFILE
def test_cpu_kernel_equals_reference(p):
    note(repr(p))
    assume(leaves_of(p.tree))  # a formula of constants only is an error (see test_errors.py)
    _, leaves = make_data(p)
    with np.errstate(all="ignore"):
        got = run(p, leaves, "cpu")
        want = run(p, leaves, "numpy")
        values = dense_values(p, p.tree, leaves, arraymath.numpy_namespace())
        if p.weight is not None:
            w = dense_values(p, p.weight, leaves, arraymath.numpy_namespace())
            values = np.concatenate([values, w], axis=-1).max(axis=-1, keepdims=True)
    check_forward(p, got, want, values)


# ------------------------------------------------------------------ gradients


def dense_reduction(p: Problem, values, weight):
    """Dense torch twin of the reduction over axis 1 of (rows, M, F) values."""
    r = p.reduction
    if r == "sum":
        return values.sum(1)
    if r in ("min", "min_argmin"):
        return values.min(1).values
    if r in ("max", "max_argmax"):
        return values.max(1).values
    if r in ("kmin", "kmin_argkmin"):
        s = torch.sort(values, dim=1, stable=True).values[:, : p.K, :]
        return s.reshape(s.shape[0], -1) if values.shape[-1] == 1 else s
    if r == "logsumexp":
        return torch.logsumexp(values, dim=1)
    m = values.max(1, keepdim=True).values.detach()
    e = torch.exp(values - m)
    if r == "logsumexp_weight":
        return m[:, 0] + torch.log((e * weight).sum(1))
    if r == "sumsoftmaxweight":
        return (e * weight).sum(1) / e.sum(1)
    raise AssertionError(r)


@given(problems(tuple(sorted(DIFFERENTIABLE))))
@GRAD_PROFILE
def test_torch_gradients_equal_dense_autograd(p):
    note(repr(p))
    assume(leaves_of(p.tree))
    data, leaves = make_data(p, "torch")
    tensors = list(data.values())
    with np.errstate(all="ignore"):
        out = _outputs(run(p, leaves, "cpu"))[0]
        xp = arraymath.torch_namespace()
        values = dense_values(p, p.tree, leaves, xp)
        weight = dense_values(p, p.weight, leaves, xp) if p.weight is not None else None
        dense = dense_reduction(p, values, weight)
    assert out.shape == dense.shape, (out.shape, dense.shape)
    g = torch.tensor(np.random.default_rng(p.seed + 1).uniform(-1, 1, tuple(out.shape)))
    grads = _grads((out * g).sum(), tensors)
    dense_grads = _grads((dense * g).sum(), tensors)
    for key, a, b in zip(data, grads, dense_grads):
        a = torch.zeros_like(data[key]) if a is None else a
        b = torch.zeros_like(data[key]) if b is None else b
        scale = 1 + b.abs().max()
        ok = ((a - b).abs() <= 1e-8 * scale) | (a.isnan() & b.isnan()) | (a == b)
        assert bool(ok.all()), f"d/d{key}: kernel {a[~ok][:5]} vs dense {b[~ok][:5]}"


def _grads(loss, tensors):
    """Gradients (None where unused); a loss that needs none (no path) gives all None."""
    if not loss.requires_grad or not tensors:
        return [None] * len(tensors)
    return torch.autograd.grad(loss, tensors, allow_unused=True)


@pytest.mark.parametrize("name", sorted(OPS))
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_op_table_entry_builds_valid_formulas(name, data):
    """Each entry of OPS (no compiling): drawn operand dimensions and params give an op of
    the requested dimension, whose reference values on guarded operands are finite and
    within the entry's bound."""
    kind = OPS[name]
    dim = (
        1
        if kind.shape == "to_scalar"
        else data.draw(st.integers(2 if kind.shape == "concat" else 1, 4))
    )
    assert name in _ops_for(dim)
    tree, bound = data.draw(expr_rooted(name, dim))
    leaves = {key: _leaf_lazy(key) for key in leaves_of(tree)}
    F = build(tree, leaves)
    assert F.formula.dim == dim
    if leaves:
        with np.errstate(all="ignore"):
            values = F.sum(dim=1, backend="numpy")
        assert np.isfinite(values).all(), show(tree)
        assert np.abs(values).max() <= 3 * bound + 1e-9, (show(tree), bound)


def _leaf_lazy(key):
    cat, dim, k = key
    a = np.random.default_rng(k).uniform(-2, 2, (3, dim) if cat in "ij" else (dim,))
    if cat == "j":
        a = a[:1]  # M = 1: the reference sum over j is the value itself
    return {"i": Vi, "j": Vj, "p": lambda x: LazyTensor(x, axis=2)}[cat](a)


def test_sinxdivx_gradient_at_zero():
    """Found by test_torch_gradients_equal_dense_autograd: sympy's derivative of sin(x)/x,
    cos(x)/x - sin(x)/x**2, is NaN at x = 0 (the limit is 0)."""
    x = torch.tensor([[0.0], [1.0]], dtype=torch.float64, requires_grad=True)
    y = torch.ones(3, 1, dtype=torch.float64)
    ((Vi(x) * Vj(y)).sinxdivx().sum(dim=1)).sum().backward()
    expected = 3 * (math.cos(1.0) - math.sin(1.0))
    torch.testing.assert_close(x.grad[:, 0], torch.tensor([0.0, expected], dtype=torch.float64))
