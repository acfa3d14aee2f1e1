"""Radial kernel sums in the IR: is a formula ``φ(|x_i − y_j|²) · w_j``?

:func:`analyze` reads a formula (of a reduction over j) and either proves it has the form

    F(x_i, y_j, p) = φ(|x_i − y_j|²) · w_j

with ``x`` one i-variable and ``y`` one j-variable of the same dimension D, ``φ`` a scalar
function of ``t = |x_i − y_j|²`` and the parameters (every scalar factor free of i and j
folded in), and ``w_j`` a function of j-variables and parameters only (the weights,
dimension E), or says why not: an i-dependent factor, a formula that depends on x and y
other than through their difference, a difference seen other than through its length
(not radial), a branch (``step``, ``ifelse``, ``abs`` ...), vector structure in the
kernel. The distances are recognized as the IR spells them: ``sum(mul(d, d))`` (``sqdist``,
``sqnorm2``), ``sum(square(d))`` (``((x - y) ** 2).sum(-1)``), their square roots
(``norm2``), for D = 1 ``square(d)`` and ``abs(d)``, with ``d = x − y`` or ``y − x``, possibly
scaled by a scalar free of i and j (``(x - y) / h``).

The profile ``φ`` is IR in the placeholder :data:`T` (a variable no formula uses) and the
parameters: :func:`profile_values` evaluates it, :func:`smooth_at_zero` decides whether
``φ(|z|²)`` is analytic at ``z = 0`` from the ops the formula is made of (an op applied
where it is singular, ``sqrt(t)`` at ``t = 0`` say, is not), :func:`gaussian` recognizes
``A exp(c + α t)`` (``α < 0``) and :func:`gaussian_fourier` gives its Fourier transform.

>>> from lazytensor.codegen import ops
>>> x, y, b = ir.var(0, 3, "i"), ir.var(1, 3, "j"), ir.var(2, 2, "j")
>>> s = ops.apply("sum", ops.apply("square", ops.apply("sub", x, y)))
>>> rs = analyze(ops.apply("mul", ops.apply("exp", ops.apply("neg", s)), b))
>>> (rs.D, rs.E, ir.to_text(rs.profile), rs.weight is b)
(3, 2, 'exp(neg(Vi(-1,1)))', True)
>>> analyze(ops.apply("exp", ops.apply("sum", ops.apply("mul", x, y)))).reason
'the formula depends on x_i and y_j other than through x_i - y_j (not translation-invariant)'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import ir, ops
from .diff import jvp
from .evaluate import evaluate

T = ir.var(-1, 1, "i")  # the placeholder t = |x_i - y_j|² in a profile
MAX_D = 3

# ops a profile may be made of: analytic wherever their arguments are in their domain
SMOOTH_OPS = frozenset("""var const add sub mul div neg exp log sqrt rsqrt pow powf square inv
    sin cos tan sinh cosh tanh asin acos atan asinh acosh atanh erf erfc log1p expm1 sigmoid
    softplus logsigmoid xlogx sinxdivx""".split())


@dataclass(frozen=True)
class RadialSum:
    """``Σ_j φ(|x_i − y_j|²) w_j``: ``x``/``y`` the variables (dimension ``D``), ``profile``
    the IR of φ in :data:`T` and parameters, ``weight`` the IR of ``w_j`` (None: 1), ``E``
    the formula's dimension, ``sqdist`` the IR of ``|x − y|²``."""

    x: ir.Node
    y: ir.Node
    profile: ir.Node
    weight: ir.Node | None
    E: int
    sqdist: ir.Node

    @property
    def D(self) -> int:
        return self.x.dim

    reason = ""


@dataclass(frozen=True)
class NotRadial:
    """Why a formula is not a radial kernel sum (``reason``, one phrase)."""

    reason: str


def analyze(formula: ir.Node) -> RadialSum | NotRadial:
    """The :class:`RadialSum` that ``formula`` is (over j), or :class:`NotRadial`."""
    factors = _factors(formula)
    kernel, weight, scale = [], [], []
    for node, den in factors:
        cats = {v.cat for v in ir.variables(node)}
        if "i" in cats and "j" in cats:
            kernel.append((node, den))
        elif "i" in cats:
            return NotRadial("a factor depends on i only (an i-dependent weight); take it out "
                             "of the sum")
        elif "j" in cats:
            if den:
                return NotRadial("a j-variable divides the formula (write the weight as a "
                                 "product)")
            weight.append(node)
        elif node.dim == 1:
            scale.append((node, den))
        else:
            weight.append(_power(node, den))
    if not kernel:
        return NotRadial("no factor depends on both i and j (the sum is a product of sums)")
    k = _product([_power(n, d) for n, d in kernel + scale])
    if k.dim != 1:
        return NotRadial(f"the kernel part has dimension {k.dim}: a vector-valued kernel")
    found = _radial_profile(k)
    if isinstance(found, NotRadial):
        return found
    x, y, profile, sq = found
    if x.dim > MAX_D:
        return NotRadial(f"D = {x.dim}: the fast methods cover D <= {MAX_D}")
    bad = sorted({n.op for n in ir.topo_order(profile)} - SMOOTH_OPS)
    if bad:
        return NotRadial(f"the kernel has a branch or non-smooth op ({', '.join(bad)})")
    w = _product(weight) if weight else None
    if w is not None and w.dim not in (1, formula.dim):
        return NotRadial(f"weights of dimension {w.dim} for a formula of dimension {formula.dim}")
    return RadialSum(x, y, profile, w, formula.dim, sq)


def _factors(node: ir.Node, den: bool = False) -> list:
    """``[(factor, is_denominator)]`` of a product: ``mul`` splits, ``neg`` gives -1,
    ``div`` by a node free of i and j gives a denominator (one depending on them stays a
    factor: ``1 / (1 + s)`` is a kernel)."""
    if node.op == "mul":
        return _factors(node.args[0], den) + _factors(node.args[1], den)
    if node.op == "neg":
        return [(ir.const(-1.0), False)] + _factors(node.args[0], den)
    if node.op == "div" and not _depends_ij(node.args[1]):
        return _factors(node.args[0], den) + _factors(node.args[1], not den)
    return [(node, den)]


def _depends_ij(node: ir.Node) -> bool:
    return any(v.cat in ("i", "j") for v in ir.variables(node))


def _power(node: ir.Node, den: bool) -> ir.Node:
    return ops.apply("div", ir.const(1.0), node) if den else node


def _product(nodes: list) -> ir.Node:
    out = nodes[0]
    for n in nodes[1:]:
        out = ops.apply("mul", out, n)
    return out


def _radial_profile(k: ir.Node):
    """``(x, y, φ, |x − y|²)`` for a scalar kernel ``k``, or :class:`NotRadial`."""
    ivars = [v for v in ir.variables(k) if v.cat == "i"]
    jvars = [v for v in ir.variables(k) if v.cat == "j"]
    if len(ivars) != 1 or len(jvars) != 1 or ivars[0].dim != jvars[0].dim:
        return NotRadial("the kernel must depend on one i-variable and one j-variable of the "
                         "same dimension")
    x, y = ivars[0], jvars[0]
    diffs = {ops.apply("sub", x, y), ops.apply("sub", y, x)}
    sq = ops.apply("sum", ops.apply("mul", ops.apply("sub", x, y), ops.apply("sub", x, y)))
    # (hash-consed: the formula's own node when it was written with sqdist or sqnorm2)
    mapping = {}
    for node in ir.topo_order(k):
        t = _as_t(node, diffs, x.dim)
        if t is not None:
            mapping[node] = t
    profile = ir.substitute(k, mapping) if mapping else k
    left = {v for v in ir.variables(profile) if v.cat in ("i", "j") and v is not T}
    if left:
        z = ir.var(-2, x.dim, "i")
        seen = ir.substitute(k, {d: z for d in diffs})
        if any(v is x or v is y for v in ir.variables(seen)):
            return NotRadial("the formula depends on x_i and y_j other than through x_i - y_j "
                             "(not translation-invariant)")
        return NotRadial("the kernel depends on x_i - y_j other than through |x_i - y_j| "
                         "(not radial)")
    return x, y, profile, sq


def _scaled_difference(u: ir.Node, diffs: set):
    """``c`` (IR, or None for 1) when ``u`` is ``d``, ``d * c``, ``c * d`` or ``d / c`` for a
    difference ``d`` and a scalar ``c`` free of i and j; else False."""
    if u in diffs:
        return None
    if u.op in ("mul", "div") and len(u.args) == 2:
        a, b = u.args
        if a in diffs and b.dim == 1 and not _depends_ij(b):
            return b if u.op == "mul" else ops.apply("div", ir.const(1.0), b)
        if u.op == "mul" and b in diffs and a.dim == 1 and not _depends_ij(a):
            return a
    return False


def _as_t(node: ir.Node, diffs: set, D: int):
    """The expression in :data:`T` of a node that is ``|c d|²`` (or ``|c d|`` for D = 1)."""
    inner = None
    if node.op == "sum" and node.args[0].dim == D:
        inner = node.args[0]
    elif D == 1 and node.op in ("mul", "square", "abs"):
        inner = node
    if inner is None:
        return None
    if inner.op == "mul" and inner.args[0] is inner.args[1]:
        u = inner.args[0]
    elif inner.op in ("square", "abs") and (inner is node or inner.op == "square"):
        u = inner.args[0]
    else:
        return None
    c = _scaled_difference(u, diffs)
    if c is False:
        return None
    t = T if c is None else ops.apply("mul", T, ops.apply("square", c))
    return ops.apply("sqrt", t) if inner.op == "abs" else t


# ------------------------------------------------------------------ the profile's numbers


def profile_values(profile: ir.Node, t, params: dict) -> np.ndarray:
    """``φ(t)`` on a float64 array ``t``, the parameters ``params`` (index -> (dim,) array).

    >>> phi = ops.apply("exp", ops.apply("neg", T))
    >>> profile_values(phi, np.array([0.0, 1.0]), {}).round(4).tolist()
    [1.0, 0.3679]
    """
    t = np.asarray(t, dtype=np.float64)
    env = {k: np.asarray(v, dtype=np.float64).reshape(1, -1) for k, v in params.items()}
    env[T.index] = t.reshape(-1, 1)
    with np.errstate(all="ignore"):
        out = evaluate(profile, env, like=env[T.index])
    return np.broadcast_to(out, (t.size, 1)).reshape(t.shape).astype(np.float64)


def derivative(profile: ir.Node) -> ir.Node:
    """``dφ/dt`` as IR (in :data:`T` and the parameters)."""
    return jvp(profile, {T: ir.const(1.0)})


# (op, argument) singular where the check holds, at the argument's value
_SINGULAR = {
    "sqrt": lambda a: a <= 0, "rsqrt": lambda a: a <= 0, "log": lambda a: a <= 0,
    "inv": lambda a: a == 0, "log1p": lambda a: a <= -1, "xlogx": lambda a: a <= 0,
    "asin": lambda a: abs(a) >= 1, "acos": lambda a: abs(a) >= 1,
    "atanh": lambda a: abs(a) >= 1, "acosh": lambda a: a <= 1, "powf": lambda a: a <= 0,
    "sinxdivx": lambda a: False,
}


def smooth_at_zero(profile: ir.Node, params: dict) -> bool:
    """Whether ``φ(|z|²)`` is analytic at ``z = 0``: every op of the profile that depends
    on t is applied at t = 0 where it is analytic (``sqrt(t)``, ``1 / t``, ``t ** 0.5`` and
    ``log(t)`` are not; ``1 / (1 + t)``, ``sqrt(1 + t)`` are).

    >>> smooth_at_zero(ops.apply("exp", ops.apply("neg", T)), {})
    True
    >>> smooth_at_zero(ops.apply("exp", ops.apply("neg", ops.apply("sqrt", T))), {})
    False
    """
    env = {k: np.asarray(v, dtype=np.float64).reshape(1, -1) for k, v in params.items()}
    env[T.index] = np.zeros((1, 1))
    deps = _t_dependent(profile)
    for node in ir.topo_order(profile):
        if id(node) not in deps or node.op in ("var", "const"):
            continue
        args = [float(np.asarray(_at(a, env)).reshape(-1)[0]) for a in node.args]
        if not all(math.isfinite(a) for a in args):
            return False
        if node.op in _SINGULAR and _SINGULAR[node.op](args[0]):
            return False
        if node.op == "div" and args[1] == 0:
            return False
        if node.op == "pow":
            p = node.params[0]
            if args[0] <= 0 and not (float(p).is_integer() and p >= 0):
                return False
    return True


def _at(node, env):
    with np.errstate(all="ignore"):
        return evaluate(node, env, like=env[T.index])


def _t_dependent(profile: ir.Node) -> set:
    dep: set = set()
    for node in ir.topo_order(profile):
        if node is T or any(id(a) in dep for a in node.args):
            dep.add(id(node))
    return dep


def gaussian(profile: ir.Node, params: dict):
    """``(A, α)`` when ``φ(t) = A exp(α t)`` with ``α < 0`` (a Gaussian), else None:
    factors free of t around one ``exp`` of an expression linear in t.

    >>> gaussian(ops.apply("mul", ir.const(2.0), ops.apply("exp", ops.apply("neg", T))), {})
    (2.0, -1.0)
    """
    deps = _t_dependent(profile)
    node, outer = profile, []
    while node.op in ("mul", "div", "neg"):
        if node.op == "neg":
            outer.append(ir.const(-1.0))
            node = node.args[0]
            continue
        a, b = node.args
        if node.op == "mul" and id(a) not in deps:
            outer.append(a)
            node = b
        elif id(b) not in deps:
            outer.append(b if node.op == "mul" else ops.apply("div", ir.const(1.0), b))
            node = a
        else:
            return None
    if node.op != "exp" or not _linear(node.args[0], deps):
        return None
    env = {k: np.asarray(v, dtype=np.float64).reshape(1, -1) for k, v in params.items()}
    u = [float(np.asarray(_at(node.args[0], {**env, T.index: np.full((1, 1), v)})).ravel()[0])
         for v in (0.0, 1.0)]
    env[T.index] = np.zeros((1, 1))
    amplitude = math.exp(u[0]) * math.prod(float(np.asarray(_at(f, env)).ravel()[0])
                                           for f in outer)
    alpha = u[1] - u[0]
    if not (alpha < 0 and math.isfinite(amplitude) and math.isfinite(alpha)):
        return None
    return amplitude, alpha


def _linear(node: ir.Node, deps: set) -> bool:
    """``node`` is affine in t: t itself, free of t, or sums, negations and products /
    quotients by terms free of t of affine expressions."""
    if id(node) not in deps or node is T:
        return True
    if node.op in ("add", "sub"):
        return all(_linear(a, deps) for a in node.args)
    if node.op == "neg":
        return _linear(node.args[0], deps)
    if node.op == "mul":
        a, b = node.args
        return (id(a) not in deps and _linear(b, deps)) or (id(b) not in deps and _linear(a, deps))
    if node.op == "div":
        return id(node.args[1]) not in deps and _linear(node.args[0], deps)
    return False


def gaussian_fourier(amplitude: float, alpha: float, omega_sq, D: int):
    """``∫ A exp(α |z|²) exp(-i ω·z) dz = A (π / -α)^(D/2) exp(|ω|² / (4 α))`` at ``|ω|²``.

    >>> round(float(gaussian_fourier(1.0, -1.0, 0.0, 1)), 6) == round(math.sqrt(math.pi), 6)
    True
    """
    return amplitude * (math.pi / -alpha) ** (D / 2) * np.exp(np.asarray(omega_sq) / (4 * alpha))


# ------------------------------------------------------------------ gradient forms


@dataclass(frozen=True)
class RadialGradient:
    """``Σ_j (x_i − y_j) ψ(|x_i − y_j|²) ⟨u_i, w_j⟩``: the form of the gradient of a radial
    sum in its targets (pykeops's ``K.grad(x, g).sum(dim=1)``, with ``ψ = 2φ'``, ``u = g``
    and ``w`` the weights). ``profile`` is ψ in :data:`T`, ``u`` and ``weight`` the IR of
    the i- and j-factors (dimension ``E``), the result has x's dimension."""

    x: ir.Node
    y: ir.Node
    profile: ir.Node
    u: ir.Node
    weight: ir.Node
    E: int

    @property
    def D(self) -> int:
        return self.x.dim


def _signed_terms(node: ir.Node, sign: float = 1.0) -> list:
    if node.op == "add":
        return _signed_terms(node.args[0], sign) + _signed_terms(node.args[1], sign)
    if node.op == "sub" and _depends_ij(node) and not _is_difference(node):
        return _signed_terms(node.args[0], sign) + _signed_terms(node.args[1], -sign)
    if node.op == "neg":
        return _signed_terms(node.args[0], -sign)
    return [(node, sign)]


def _is_difference(node: ir.Node) -> bool:
    return (node.op == "sub" and all(a.op == "var" for a in node.args)
            and {a.cat for a in node.args} == {"i", "j"} and node.args[0].dim == node.args[1].dim)


def analyze_gradient(formula: ir.Node) -> RadialGradient | NotRadial:
    """The :class:`RadialGradient` that ``formula`` is (over j), or :class:`NotRadial`.

    >>> from lazytensor.codegen import diff
    >>> x, y, b, g = ir.var(0, 2, "i"), ir.var(1, 2, "j"), ir.var(2, 1, "j"), ir.var(3, 1, "i")
    >>> s = ops.apply("sum", ops.apply("mul", ops.apply("sub", x, y), ops.apply("sub", x, y)))
    >>> F = ops.apply("mul", ops.apply("exp", ops.apply("neg", s)), b)
    >>> rg = analyze_gradient(diff.vjp(F, [x], g)[x])
    >>> (rg.D, rg.E, rg.u is g, rg.weight is b)
    (2, 1, True, True)
    >>> profile_values(rg.profile, np.array([1.0]), {}).round(6).tolist()   # -2 exp(-t)
    [-0.735759]
    """
    D = formula.dim
    pair, psis = None, []
    for node, sign in _signed_terms(formula):
        found = _gradient_term(node, D)
        if isinstance(found, NotRadial):
            return found
        (x, y, u, w), psi, s = found
        if pair is None:
            pair = (x, y, u, w)
        elif pair != (x, y, u, w):
            return NotRadial("the terms of the gradient form differ in their points or weights")
        psis.append((psi, sign * s))
    x, y, u, w = pair
    if x.dim > MAX_D:
        return NotRadial(f"D = {x.dim}: the fast methods cover D <= {MAX_D}")
    # equal terms (the product rule's two halves of d(x-y)·(x-y)) are one, counted
    counted: dict = {}
    for p, c in psis:
        counted[p] = counted.get(p, 0.0) + c
    psi = None
    for p, c in counted.items():
        term = p if c == 1 else ops.apply("mul", ir.const(c), p)
        psi = term if psi is None else ops.apply("add", psi, term)
    bad = sorted({n.op for n in ir.topo_order(psi)} - SMOOTH_OPS)
    if bad:
        return NotRadial(f"the kernel has a branch or non-smooth op ({', '.join(bad)})")
    return RadialGradient(x, y, psi, u, w, u.dim)


def _gradient_term(node: ir.Node, D: int):
    """``((x, y, u, w), ψ_t, sign)`` of one term ``(±(x − y)) · c``."""
    fs = []
    for f, den in _factors(node):
        if f.op == "expand" and not den:
            fs += _factors(f.args[0])
        else:
            fs.append((f, den))
    diffs = [(f, den) for f, den in fs if _is_difference(f) and f.dim == D]
    if len(diffs) != 1 or diffs[0][1]:
        return NotRadial("not of the form (x_i - y_j) ψ(|x_i - y_j|²) <u_i, w_j>")
    d = diffs[0][0]
    x, y = (d.args[0], d.args[1]) if d.args[0].cat == "i" else (d.args[1], d.args[0])
    sign = 1.0 if d.args[0].cat == "i" else -1.0
    radial_part, u, w, bilinear = [], [], [], None
    for f, den in fs:
        if f is d:
            continue
        vs = set(ir.variables(f))
        cats = {v.cat for v in vs}
        if x in vs or y in vs:
            radial_part.append(_power(f, den))
        elif "i" in cats and "j" in cats:
            if bilinear is not None or den or f.op != "sum" or f.args[0].op != "mul":
                return NotRadial("the weights of the gradient form are not <u_i, w_j>")
            a, b = f.args[0].args
            a, b = (a, b) if {v.cat for v in ir.variables(a)} <= {"i", "p"} else (b, a)
            if not ({v.cat for v in ir.variables(a)} <= {"i", "p"}
                    and {v.cat for v in ir.variables(b)} <= {"j", "p"}):
                return NotRadial("the weights of the gradient form are not <u_i, w_j>")
            bilinear = (a, b)
        elif "i" in cats:
            u.append(_power(f, den))
        elif "j" in cats:
            w.append(_power(f, den))
        else:
            radial_part.append(_power(f, den))
    if bilinear is not None:
        if u or w:
            return NotRadial("the weights of the gradient form are not <u_i, w_j>")
        u_node, w_node = bilinear
    elif u and w:
        u_node, w_node = _product(u), _product(w)
        if u_node.dim != 1 or w_node.dim != 1:
            return NotRadial("the weights of the gradient form are not <u_i, w_j>")
    else:
        return NotRadial("the gradient form needs an i-factor and a j-factor")
    if not radial_part:
        return NotRadial("no kernel in the gradient form")
    found = _radial_profile(_product(radial_part)) if any(
        x in set(ir.variables(f)) for f in radial_part) else None
    if found is None:
        return NotRadial("no kernel in the gradient form")
    if isinstance(found, NotRadial):
        return found
    if found[0] is not x or found[1] is not y:
        return NotRadial("the kernel of the gradient form is not in its difference's points")
    return (x, y, u_node, w_node), found[2], sign
