"""A Sum reduction as the methods see it: the radial kernel, its points, weights and box.

:func:`bind_problem` turns ``(formula, variables, axis)`` into a :class:`Problem` (a
reduction over i is the same sum with i and j exchanged), or the reason why only the
exact sum applies (the formula is not a radial kernel sum, batch dimensions, gradients
with respect to the kernel's parameters, no points).

>>> import numpy as np
>>> from lazytensor import Vi, Vj
>>> x, b = np.random.rand(5, 2), np.random.rand(5, 1)
>>> K = (-Vi(x).sqdist(Vj(x))).exp() * Vj(b)
>>> p = bind_problem(K.formula, K.variables, 1)
>>> (p.N, p.M, p.D, p.E, p.library)
(5, 5, 2, 1, 'numpy')
>>> bind_problem((Vi(x) * Vj(x)).sum(-1).formula, K.variables[:2], 1)
'the formula depends on x_i and y_j other than through x_i - y_j (not translation-invariant)'
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..codegen import ir, radial
from ..codegen.arraymath import numpy_namespace, torch_namespace
from ..codegen.evaluate import evaluate
from ..core.binding import Variable, bind, is_torch


@dataclass(eq=False)
class Problem:
    """``s_i = Σ_j φ(|x_i − y_j|²) w_j`` bound to arrays (a reduction over j).

    ``formula``/``variables``: the reduction over j (i and j exchanged for ``axis=0``);
    ``x``/``y``: the points as float64 NumPy (detached); ``params``: index -> float64
    values of the parameters; ``lo``/``hi``: the joint bounding box of x and y.
    """

    kernel: radial.RadialSum
    formula: ir.Node
    variables: list
    params: dict
    x: np.ndarray
    y: np.ndarray
    library: str
    dtype: str
    device: str
    lo: np.ndarray
    hi: np.ndarray
    requires_grad: bool = False
    _weights: object = field(default=None, repr=False)

    @property
    def N(self) -> int:
        return self.x.shape[0]

    @property
    def M(self) -> int:
        return self.y.shape[0]

    @property
    def D(self) -> int:
        return self.kernel.D

    @property
    def E(self) -> int:
        return self.kernel.E

    @property
    def diameter(self) -> float:
        return float(np.linalg.norm(self.hi - self.lo))

    def array(self, var: ir.Node):
        """The data of a formula variable (torch or NumPy, as given)."""
        return self.variables[var.index].data

    def weights(self):
        """``w_j`` as an (M, E) float64 array of the inputs' library (differentiable in
        torch): the weight formula evaluated on the j-variables."""
        if self._weights is None:
            self._weights = _evaluate_weights(self)
        return self._weights

    def weight_sums(self) -> np.ndarray:
        """``Σ_j |w_je|`` per channel (E,)."""
        w = self.weights()
        w = w.detach().cpu().numpy() if is_torch(w) else w
        return np.abs(w).sum(0)


def _as_float64(a):
    if is_torch(a):
        return a.double()
    return np.asarray(a, dtype=np.float64)


def _evaluate_weights(p: Problem):
    torch_lib = p.library == "torch"
    like = _as_float64(p.array(p.kernel.y))
    node = p.kernel.weight
    if node is None:
        return (like[:, :1] * 0 + 1).expand(-1, p.E) if torch_lib else np.ones((p.M, p.E))
    env = {}
    for v in ir.variables(node):
        data = p.variables[v.index].data
        if isinstance(data, (int, float)):
            data = np.full(1, float(data))
        if torch_lib and not is_torch(data):
            import torch

            data = torch.as_tensor(data, device=like.device)
        env[v.index] = _as_float64(data)
    xp = torch_namespace() if torch_lib else numpy_namespace()
    w = evaluate(node, env, xp, like=like)
    shape = (p.M, p.E)
    if torch_lib:
        return w.expand(*shape) if tuple(w.shape) != shape else w
    return np.broadcast_to(w, shape)


def bind_problem(formula: ir.Node, variables: list, axis: int):
    """A :class:`Problem`, or a string saying why only the exact sum applies."""
    if axis == 0:
        formula = ir.swap_ij(formula)
        variables = [Variable(v.data, ir.swap_cat(v.cat), v.dim, v.label, v.io_dtype)
                     for v in variables]
    found = radial.analyze(formula)
    if isinstance(found, radial.NotRadial):
        return found.reason
    sig = bind(variables)
    if sig.batch:
        return f"batch dimensions {sig.batch} (the fast methods take one sum at a time)"
    params = {}
    for k, v in enumerate(variables):
        if v.cat != "p":
            continue
        if getattr(v.data, "requires_grad", False):
            return "a gradient with respect to the kernel's parameters is asked"
        params[k] = np.atleast_1d(_numpy(v.data)).reshape(-1)
    x, y = _numpy(variables[found.x.index].data), _numpy(variables[found.y.index].data)
    if x.shape[0] == 0 or y.shape[0] == 0:
        return "no points"
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        return "points that are not finite"
    lo = np.minimum(x.min(0), y.min(0))
    hi = np.maximum(x.max(0), y.max(0))
    grad = any(getattr(v.data, "requires_grad", False) for v in variables)
    return Problem(found, formula, variables, params, x, y, sig.library, sig.dtype, sig.device,
                   lo, hi, grad)


def _numpy(a) -> np.ndarray:
    if is_torch(a):
        return a.detach().cpu().double().numpy()
    return np.asarray(a, dtype=np.float64)
