"""The IR layer, no compiler needed: hash-consing, keys, immutability, simplify, diff.

Values are checked by evaluating formulas with the dense reference evaluator
(``lazytensor.codegen.evaluate``) in float64 on random data; derivatives against
central finite differences.
"""

import pickle

import numpy as np
import pytest
from lazytensor.codegen import diff, ir, ops
from lazytensor.codegen.evaluate import evaluate
from lazytensor.codegen.simplify import simplify

A = ops.apply


def x3():
    return ir.var(0, 3, "i")


def y3():
    return ir.var(1, 3, "j")


# ------------------------------------------------------------------ nodes


def test_hash_consing_returns_the_same_object():
    f1 = A("exp", A("mul", x3(), y3()))
    f2 = A("exp", A("mul", ir.var(0, 3, "i"), ir.var(1, 3, "j")))
    assert f1 is f2
    assert f1 == f2 and hash(f1) == hash(f2)
    assert ir.const([1.0, 2.0]) is ir.const((1.0, 2.0))
    assert ir.const(2) is ir.const(2.0)


def test_different_structures_are_different_nodes():
    x, y = x3(), y3()
    assert A("add", x, y) is not A("add", y, x)
    assert A("sub", x, y) is not A("add", x, y)
    assert ir.var(0, 3, "i") is not ir.var(0, 3, "j")
    assert ir.var(0, 3, "i") is not ir.var(0, 2, "i")
    assert ir.var(0, 3, "i") is not ir.var(1, 3, "i")
    assert A("pow", x, params=(2.0,)) is not A("pow", x, params=(3.0,))
    assert A("slice", x, params=(0, 2)) is not A("slice", x, params=(1, 2))


def test_keys_are_structural_sha256_and_keep_full_float_precision():
    x = x3()
    k = A("exp", x).key
    assert len(k) == 64 and int(k, 16) >= 0
    assert A("exp", x).key == k
    assert A("log", x).key != k
    a, b = 0.1, np.nextafter(0.1, 1.0)
    assert ir.const(a) is not ir.const(b)
    assert ir.const(a).key != ir.const(b).key
    assert A("pow", x, params=(a,)).key != A("pow", x, params=(float(b),)).key
    # numpy scalars are canonicalized to Python numbers
    assert A("pow", x, params=(np.float64(2.5),)) is A("pow", x, params=(2.5,))
    assert A("slice", x, params=(np.int64(1), 2)) is A("slice", x, params=(1, 2))
    # argument order is part of the key
    assert A("sub", x, y3()).key != A("sub", y3(), x).key


def test_nodes_are_immutable():
    f = A("exp", x3())
    for name, value in (("dim", 5), ("op", "log"), ("args", ()), ("key", "0"), ("params", (1,))):
        with pytest.raises(AttributeError):
            setattr(f, name, value)
    with pytest.raises(AttributeError):
        f.new_attribute = 1
    assert f.dim == 3 and f.op == "exp"


def test_pickle_roundtrip_is_identity():
    f = A("sum", A("mul", x3(), A("pow", y3(), params=(0.5,))))
    assert pickle.loads(pickle.dumps(f)) is f


def test_var_and_make_validation():
    with pytest.raises(ValueError, match="category"):
        ir.var(0, 3, "k")
    with pytest.raises(ValueError, match="dimension"):
        ir.var(0, 0, "i")
    with pytest.raises(TypeError):
        ir.make("pow", (x3(),), (object(),), 3)


def test_apply_checks_arity_and_dimensions():
    x, y = x3(), ir.var(1, 2, "j")
    with pytest.raises(ValueError, match="arguments"):
        A("exp", x, x)
    with pytest.raises(ValueError, match="dimension"):
        A("add", x, y)
    with pytest.raises(ValueError):
        A("slice", x, params=(2, 2))
    with pytest.raises(ValueError):
        A("matvec", ir.var(0, 7, "i"), y)
    with pytest.raises(ValueError, match="unknown op"):
        A("no_such_op", x)
    # dimension-1 operands broadcast against D
    assert A("mul", x, ir.var(2, 1, "p")).dim == 3
    assert A("sum", x).dim == 1
    assert A("concat", x, y).dim == 5
    assert A("tensorprod", x, y).dim == 6
    assert A("matvec", ir.var(0, 6, "i"), y).dim == 3
    assert A("vecmat", y, ir.var(0, 6, "i")).dim == 3
    assert A("one_hot", ir.var(0, 1, "i"), params=(4,)).dim == 4


def test_topo_order_children_first_each_once():
    x, y = x3(), y3()
    shared = A("mul", x, y)
    f = A("add", A("exp", shared), A("sin", shared))
    order = ir.topo_order(f)
    assert len(order) == len(set(map(id, order)))
    pos = {id(n): k for k, n in enumerate(order)}
    for n in order:
        for a in n.args:
            assert pos[id(a)] < pos[id(n)]
    assert order[-1] is f
    assert sum(1 for n in order if n is shared) == 1
    assert [v.index for v in ir.variables(f)] == [0, 1]


def test_substitute_and_swap_ij():
    x, y = x3(), y3()
    f = A("add", A("exp", x), y)
    z = ir.var(5, 3, "p")
    g = ir.substitute(f, {x: z})
    assert g is A("add", A("exp", z), y)
    s = ir.swap_ij(f)
    assert s is A("add", A("exp", ir.var(0, 3, "j")), ir.var(1, 3, "i"))
    assert ir.swap_ij(s) is f
    assert "exp" in ir.to_text(f) and "Vi(0,3)" in ir.to_text(f)


# ------------------------------------------------------------------ simplify


def test_simplify_neutral_elements():
    x = x3()
    one, zero = ir.const(1.0), ir.const(0.0)
    assert simplify(A("mul", x, one)) is x
    assert simplify(A("mul", one, x)) is x
    assert simplify(A("add", x, zero)) is x
    assert simplify(A("add", zero, x)) is x
    assert simplify(A("sub", x, zero)) is x
    assert simplify(A("sub", zero, x)) is A("neg", x)
    assert simplify(A("div", x, one)) is x
    assert simplify(A("neg", A("neg", x))) is x
    assert simplify(A("pow", x, params=(1.0,))) is x
    assert simplify(A("mul", x, ir.const(-1.0))) is A("neg", x)
    s = ir.var(1, 1, "j")
    assert simplify(A("sum", s)) is s


def test_simplify_zeros_keep_dimension():
    x = x3()
    z = simplify(A("mul", x, ir.const(0.0)))
    assert z.op == "const" and z.dim == 3 and z.params == (0.0, 0.0, 0.0)
    assert simplify(A("div", ir.const(0.0), x)).dim == 3
    assert simplify(A("sum", A("mul", x, ir.const(0.0)))) is ir.const(0.0)
    # a dimension-1 survivor replacing a dimension-3 node is expanded
    s = ir.var(1, 1, "j")
    e = simplify(A("add", s, ir.const([0.0, 0.0, 0.0])))
    assert e.dim == 3 and e is A("expand", s, params=(3,))
    e = simplify(A("mul", ir.const([1.0, 1.0]), s))
    assert e.dim == 2


def test_simplify_constant_folding():
    c = simplify(A("add", ir.const(2.0), A("mul", ir.const(3.0), ir.const(4.0))))
    assert c is ir.const(14.0)
    c = simplify(A("exp", ir.const([0.0, 1.0])))
    assert c.op == "const" and c.params == pytest.approx((1.0, np.e))
    x = x3()
    f = simplify(A("mul", x, A("sub", ir.const(3.0), ir.const(3.0))))
    assert f.op == "const" and f.params == (0.0,) * 3


def _random_formula(rng, x, y, p, depth):
    """A random formula in x (i), y (j), p (param) built from safe ops."""
    if depth == 0:
        leaves = [
            x,
            y,
            p,
            ir.const(float(rng.choice([0.0, 1.0, -1.0, 2.0]))),
            ir.const([0.0] * 3),
            ir.const([1.0] * 3),
        ]
        return leaves[rng.integers(len(leaves))]
    kind = rng.integers(6)
    a = _random_formula(rng, x, y, p, depth - 1)
    b = _random_formula(rng, x, y, p, depth - 1)
    if kind == 0:
        return A("add", a, b)
    if kind == 1:
        return A("mul", a, b)
    if kind == 2:
        return A("sub", a, b)
    if kind == 3:
        return A("sin", a)
    if kind == 4:
        return A("neg", a)
    s = A("sum", a) if a.dim > 1 else a
    return A("mul", s, b)


def _env(rng, shapes):
    return {k: rng.standard_normal(s) for k, s in shapes.items()}


def test_simplify_preserves_values_on_random_formulas(rng):
    x, y, p = ir.var(0, 3, "i"), ir.var(1, 3, "j"), ir.var(2, 1, "p")
    env = {
        0: rng.standard_normal((4, 1, 3)),
        1: rng.standard_normal((1, 5, 3)),
        2: rng.standard_normal((1, 1, 1)),
    }
    for _ in range(60):
        f = _random_formula(rng, x, y, p, int(rng.integers(1, 5)))
        g = simplify(f)
        assert g.dim == f.dim
        assert len(ir.topo_order(g)) <= len(ir.topo_order(f))
        np.testing.assert_allclose(
            np.broadcast_to(evaluate(g, env), (4, 5, f.dim)),
            np.broadcast_to(evaluate(f, env), (4, 5, f.dim)),
            rtol=1e-12,
            atol=1e-12,
        )


# ------------------------------------------------------------------ differentiation


def _fd_vjp(f, x, env, g, h=1e-6):
    """Central differences of <g, f> with respect to env[x.index], elementwise."""
    base = env[x.index]
    out = np.zeros_like(base)
    for idx in np.ndindex(*base.shape):
        e = dict(env)
        plus, minus = base.copy(), base.copy()
        plus[idx] += h
        minus[idx] -= h
        e[x.index] = plus
        fp = (evaluate(f, e) * g).sum()
        e[x.index] = minus
        fm = (evaluate(f, e) * g).sum()
        out[idx] = (fp - fm) / (2 * h)
    return out


FORMULAS = {
    "gaussian": lambda x, y, p: A("exp", A("neg", A("sum", A("square", A("sub", x, y))))),
    "cauchy": lambda x, y, p: A(
        "inv", A("add", ir.const(1.0), A("sum", A("square", A("sub", x, y))))
    ),
    "laplace": lambda x, y, p: A(
        "exp", A("neg", A("sqrt", A("add", ir.const(0.1), A("sum", A("square", A("sub", x, y))))))
    ),
    "vector": lambda x, y, p: A(
        "mul", A("sin", A("mul", x, y)), A("log", A("add", ir.const(2.0), A("cos", A("add", x, p))))
    ),
    "dot_scaled": lambda x, y, p: A(
        "div", A("sum", A("mul", x, y)), A("add", ir.const(3.0), A("square", p))
    ),
    "slices": lambda x, y, p: A(
        "concat", A("slice", x, params=(1, 2)), A("mul", A("slice", y, params=(0, 1)), p)
    ),
    "matvec": lambda x, y, p: A("matvec", A("tensorprod", x, y), A("tanh", x)),
    "vecmat": lambda x, y, p: A("vecmat", A("sigmoid", y), A("tensorprod", x, A("exp", y))),
    "pow": lambda x, y, p: A(
        "pow", A("add", ir.const(2.0), A("sin", A("mul", x, y))), params=(-1.5,)
    ),
    "softplus": lambda x, y, p: A(
        "mul", A("softplus", A("sub", x, y)), A("logsigmoid", A("add", x, p))
    ),
    "min_max": lambda x, y, p: A("add", A("vmin", A("mul", x, y)), A("vmax", A("sub", x, y))),
}


def _diff_env(rng):
    # x (i, N=2), y (j, M=2), p (parameter), all float64, well away from kinks
    return {
        0: rng.uniform(-1, 1, (2, 1, 3)),
        1: rng.uniform(-1, 1, (1, 2, 3)),
        2: rng.uniform(-1, 1, (1, 1, 1)),
    }


@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_vjp_matches_finite_differences(name, rng):
    x, y, p = ir.var(0, 3, "i"), ir.var(1, 3, "j"), ir.var(2, 1, "p")
    f = FORMULAS[name](x, y, p)
    env = _diff_env(rng)
    g = ir.var(3, f.dim, "i")
    gval = rng.standard_normal((2, 2, f.dim))
    env[3] = gval
    cots = diff.vjp(f, [x, y, p], g)
    for v in (x, y, p):
        assert cots[v].dim == v.dim
        # symbolic cotangent per pair, summed over the axes v is broadcast along
        sym = np.broadcast_to(evaluate(cots[v], env), (2, 2, v.dim))
        axes = tuple(k for k, s in enumerate(env[v.index].shape[:2]) if s == 1)
        sym = sym.sum(axis=axes, keepdims=True)
        num = _fd_vjp(f, v, env, gval)
        np.testing.assert_allclose(sym, num, rtol=1e-6, atol=1e-7, err_msg=f"d/d{v.cat}")


@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_jvp_matches_finite_differences(name, rng):
    x, y, p = ir.var(0, 3, "i"), ir.var(1, 3, "j"), ir.var(2, 1, "p")
    f = FORMULAS[name](x, y, p)
    env = _diff_env(rng)
    tx, ty = ir.var(4, 3, "i"), ir.var(5, 3, "j")
    env[4] = rng.standard_normal((2, 1, 3))
    env[5] = rng.standard_normal((1, 2, 3))
    t = diff.jvp(f, {x: tx, y: ty})
    assert t.dim == f.dim
    sym = np.broadcast_to(evaluate(t, env), (2, 2, f.dim))
    h = 1e-6
    ep, em = dict(env), dict(env)
    ep[0], ep[1] = env[0] + h * env[4], env[1] + h * env[5]
    em[0], em[1] = env[0] - h * env[4], env[1] - h * env[5]
    num = (evaluate(f, ep) - evaluate(f, em)) / (2 * h)
    np.testing.assert_allclose(sym, np.broadcast_to(num, sym.shape), rtol=1e-6, atol=1e-7)


def test_vjp_of_unrelated_variable_is_zero():
    x, y = x3(), y3()
    z = ir.var(2, 2, "p")
    f = A("exp", x)
    g = ir.var(3, 3, "i")
    cots = diff.vjp(f, [y, z], g)
    assert cots[y] is ir.const([0.0] * 3)
    assert cots[z] is ir.const([0.0] * 2)
    assert diff.jvp(f, {y: ir.var(4, 3, "j")}) is ir.const([0.0] * 3)
    with pytest.raises(ValueError, match="dimension"):
        diff.vjp(f, [x], ir.var(3, 2, "i"))


def test_vjp_accumulates_shared_subterms():
    # F = s * s with s = sum(x * y): dF/dx = 2 s y, the shared s is counted twice
    x, y = x3(), y3()
    s = A("sum", A("mul", x, y))
    f = A("mul", s, s)
    g = ir.var(3, 1, "i")
    cot = diff.vjp(f, [x], g)[x]
    env = {
        0: np.array([[[1.0, 2.0, 3.0]]]),
        1: np.array([[[0.5, -1.0, 2.0]]]),
        3: np.array([[[1.0]]]),
    }
    sval = 0.5 - 2.0 + 6.0
    np.testing.assert_allclose(evaluate(cot, env)[0, 0], 2 * sval * env[1][0, 0])


def test_vjp_output_is_simplified():
    x = x3()
    g = ir.var(3, 3, "i")
    cot = diff.vjp(A("add", x, ir.const(1.0)), [x], g)[x]
    assert cot is g
    cot = diff.vjp(A("mul", x, ir.const(2.0)), [x], g)[x]
    assert all(n.op != "const" or n.params != (1.0,) for n in ir.topo_order(cot))


@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_second_order_vjp_matches_finite_differences(name, rng):
    """Derivative formulas are formulas too: differentiate the VJP again (Hessian-vector)."""
    x, y, p = ir.var(0, 3, "i"), ir.var(1, 3, "j"), ir.var(2, 1, "p")
    f = FORMULAS[name](x, y, p)
    env = _diff_env(rng)
    g = ir.var(3, f.dim, "i")
    env[3] = rng.standard_normal((2, 2, f.dim))
    t = ir.var(4, 3, "i")
    env[4] = rng.standard_normal((2, 1, 3))
    first = diff.vjp(f, [x], g)[x]  # (dF/dx)^T g, dimension 3
    h = A("sum", A("mul", first, t))  # <(dF/dx)^T g, t>
    second = diff.vjp(h, [x, y], ir.var(5, 1, "i"))
    env[5] = np.ones((2, 2, 1))
    for v in (x, y):
        sym = np.broadcast_to(evaluate(second[v], env), (2, 2, v.dim))
        axes = tuple(k for k, s in enumerate(env[v.index].shape[:2]) if s == 1)
        sym = sym.sum(axis=axes, keepdims=True)
        num = _fd_vjp(h, v, env, np.ones((2, 2, 1)))
        np.testing.assert_allclose(sym, num, rtol=1e-5, atol=1e-6, err_msg=f"d2/dx d{v.cat}")


def test_simplify_pushes_slices_through_concat_pad_and_elementwise():
    from lazytensor.codegen.simplify import simplify

    x, y, g = ir.var(0, 3, "i"), ir.var(1, 4, "j"), ir.var(2, 5, "i")
    c = ops.apply("concat", x, y)
    assert simplify(ops.apply("slice", c, params=(0, 3))) is x
    assert simplify(ops.apply("slice", c, params=(3, 4))) is y
    assert simplify(ops.apply("slice", c, params=(4, 2))) is simplify(
        ops.apply("slice", y, params=(1, 2)))
    both = ops.apply("add", ops.apply("pad", x, params=(2, 7)), ops.apply("pad", y, params=(0, 7)))
    # [0, 2) holds y[0:2] alone; [2, 4) holds x[0:2] + y[2:4]
    assert simplify(ops.apply("slice", both, params=(0, 2))) is simplify(
        ops.apply("slice", y, params=(0, 2)))
    mixed = simplify(ops.apply("slice", both, params=(2, 2)))
    assert mixed.op == "add"
    s = ops.apply("mul", ops.apply("sum", g), ops.apply("neg", c))
    assert simplify(ops.apply("slice", s, params=(3, 4))).args[1].args[0] is y
