"""The op registry against its two front ends: formula strings and LazyTensor methods.

Every op record that names a formula-string function or a ``LazyTensor`` method must be
built by it; the compositions (``SqDist``, ``Mod``, ``Kron``, ...) must give the same IR
through both; and the registry must be complete as soon as the package is imported.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from lazytensor.codegen import compositions, ir, ops
from lazytensor.codegen import parse as formula_parse

from lazytensor import Genred, Pm, Vi, Vj

# The formula-string functions pykeops users write; none may disappear.
KEOPS_NAMES = (
    "Exp Log Sqrt Rsqrt Sin Cos Tan Asin Acos Atan Sinh Cosh Tanh Asinh Acosh Atanh Erf Erfc "
    "Log1p Expm1 Sigmoid Softplus LogSigmoid Abs Sign Step ReLU Floor Ceil Inv Square XLogX "
    "SinXDivX Minus Sum Max Min ArgMax ArgMin Add Subtract Mult Divide Atan2 IntCst IntInv Zero "
    "Pow Powf Clamp ClampInt IfElse Mod Round SqNorm2 Norm2 Normalize SqDist Scalprod "
    "WeightedSqNorm WeightedSqDist SumT Elem Extract Concat OneHot MatVecMult VecMatMult "
    "TensorProd Kron TensorDot Grad").split()


def _builtin_ops():
    return [d for d in ops.REGISTRY.values() if not d.user]


def _operand_dims(opdef):
    """Dimensions of operands the op accepts (matrices for the products)."""
    return {"matvec": (6, 3), "vecmat": (2, 6), "tensorprod": (2, 3)}.get(
        opdef.name, (3,) * opdef.arity)


def test_the_registry_is_complete_at_import():
    code = ("from lazytensor.codegen import ops\n"
            "names = set(ops.REGISTRY)\n"
            "assert {'exp', 'sum', 'matvec', 'gather', 'softplus'} <= names, sorted(names)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=False)
    assert proc.returncode == 0, proc.stderr


def test_formula_string_names_keep_pykeops_functions():
    missing = sorted(set(KEOPS_NAMES) - set(formula_parse.FUNCTIONS))
    assert not missing, f"formula functions lost: {missing}"


@pytest.mark.parametrize("opdef", [d for d in _builtin_ops() if d.keops],
                         ids=lambda d: d.name)
def test_formula_string_names_build_their_op(opdef):
    dims = _operand_dims(opdef)
    names = [f"a{k}" for k in range(len(dims))]
    aliases = [f"{n} = Vi({k}, {d})" for k, (n, d) in enumerate(zip(names, dims))]
    for keops in opdef.keops:
        node, _ = formula_parse.parse(f"{keops}({', '.join(names)})", aliases)
        args = tuple(ir.var(k, d, "i") for k, d in enumerate(dims))
        assert node is ops.apply(opdef.name, *args), keops


@pytest.mark.parametrize("opdef", [d for d in _builtin_ops() if d.method],
                         ids=lambda d: d.name)
def test_lazytensor_methods_build_their_op(opdef, rng):
    dims = _operand_dims(opdef)
    leaves = [Vi(rng.standard_normal((4, d))) for d in dims]
    out = getattr(leaves[0], opdef.method)(*leaves[1:])
    args = tuple(ir.var(k, d, "i") for k, d in enumerate(dims))
    assert out.formula is ops.apply(opdef.name, *args)


def test_compositions_give_the_same_ir_through_strings_and_methods(rng):
    x, y, s = Vi(rng.random((5, 4))), Vj(rng.random((6, 4))), Pm(rng.random(16))
    aliases = ["x = Vi(4)", "y = Vj(4)", "s = Pm(16)"]
    m, o = Pm(rng.random(4) + 1), Pm(rng.random(4))
    cases = [
        ("SqDist(x, y)", x.sqdist(y)),
        ("Normalize(x) | y", x.normalize() | y),
        ("Norm2(x - y)", (x - y).norm2()),
        ("Powf(x, y)", x.powf(y)),
        ("Round(x, 2)", x.round(2)),
        ("WeightedSqNorm(s, x)", x.weightedsqnorm(s)),
        ("Kron(x, y, Ind(2, 2), (2, 2))", x.keops_kron(y, (2, 2), (2, 2))),
        ("TensorDot(x, y, Ind(2, 2), Ind(2, 2), Ind(1), Ind(0))",
         x.keops_tensordot(y, (2, 2), (2, 2), (1,), (0,))),
    ]
    for text, lazy in cases:
        node, variables = formula_parse.parse(text, aliases)
        renumber = {ir.var(k, v.dim, v.cat): ir.var(n, v.dim, v.cat)
                    for k, v in enumerate(lazy.variables)
                    for n, d in enumerate(variables) if v.cat == d.cat and v.dim == d.dim}
        assert ir.substitute(lazy.formula, renumber) is node, text
    node, _ = formula_parse.parse("Mod(x, m, o)", ["x = Vi(4)", "m = Pm(4)", "o = Pm(4)"])
    assert x.mod(m, o).formula is node


def test_kron_and_tensordot_strings_match_numpy(rng):
    a, b = rng.standard_normal((3, 6)), rng.standard_normal((4, 6))
    kron = Genred("Kron(a, b, Ind(2, 3), Ind(3, 2))", ["a = Vi(6)", "b = Vj(6)"], axis=1)
    want = np.stack([sum(np.kron(a[i].reshape(2, 3), b[j].reshape(3, 2)).reshape(-1)
                         for j in range(4)) for i in range(3)])
    np.testing.assert_allclose(kron(a, b, backend="numpy"), want, rtol=1e-12)
    dot = Genred("TensorDot(a, b, (2, 3), (3, 2), (1,), (0,))", ["a = Vi(6)", "b = Vj(6)"], axis=1)
    want = np.stack([sum(np.tensordot(a[i].reshape(2, 3), b[j].reshape(3, 2), ([1], [0]))
                         .reshape(-1) for j in range(4)) for i in range(3)])
    np.testing.assert_allclose(dot(a, b, backend="numpy"), want, rtol=1e-12)


def test_kron_checks_shapes_against_dimensions():
    x, y = ir.var(0, 6, "i"), ir.var(1, 4, "j")
    with pytest.raises(ValueError, match="shape \\(2, 2\\) holds 4 values"):
        compositions.kron(x, y, (2, 2), (2, 2))
    with pytest.raises(ValueError, match="cannot contract"):
        compositions.tensordot(x, y, (2, 3), (2, 2), (1,), (0,))
    with pytest.raises(formula_parse.FormulaSyntaxError, match="expected an integer"):
        formula_parse.parse("Kron(x, y, Ind(a), Ind(2))", ["x = Vi(4)", "y = Vj(4)"])
