"""The IR evaluator: the value of a formula on arrays, through each op's reference.

One walk serves every dense evaluation: the NumPy oracle (:mod:`lazytensor.backends.reference.dense`),
the references of sympy-defined elementwise ops, the gradients of min-type reductions at
gathered pairs (in torch) and the values hoisted out of gradient kernels. Arrays have the
vector dimension last and broadcast against each other on the leading axes.

>>> import numpy as np
>>> from lazytensor.codegen import ir, ops
>>> x, y = ir.var(0, 2, "i"), ir.var(1, 2, "j")
>>> evaluate(ops.apply("sum", ops.apply("mul", x, y)),
...          {0: np.array([[1.0, 2.0]]), 1: np.array([[3.0, 4.0]])}).tolist()
[[11.0]]
"""

from __future__ import annotations

import numpy as np

from . import ir
from .arraymath import numpy_namespace
from .ops import get


def evaluate(root: ir.Node, env: dict, xp=None, like=None):
    """Value of ``root`` with ``env[k]`` the array of variable index ``k``.

    ``xp`` is an array namespace (:mod:`lazytensor.codegen.arraymath`, NumPy by
    default); constants take the dtype and device of ``like`` (default: any array of
    ``env``). A result whose vector axis is 1 where the formula's dimension is larger
    (a broadcast scalar) is widened to the formula's dimension.
    """
    xp = xp or numpy_namespace()
    if like is None:
        like = next(iter(env.values())) if env else np.zeros(1)
    memo: dict[int, object] = {}
    for node in ir.topo_order(root):
        if node.op == "var":
            memo[id(node)] = env[node.index]
        elif node.op == "const":
            memo[id(node)] = xp.asarray(list(node.params), like)
        else:
            memo[id(node)] = get(node.op).ref(xp, [memo[id(a)] for a in node.args], node.params)
    out = memo[id(root)]
    if out.shape[-1] != root.dim:
        out = out * xp.asarray([1.0] * root.dim, like)
    return out

