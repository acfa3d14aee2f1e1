"""The call type and the low-level dispatch: one bound reduction, run on one backend.

A :class:`ReductionCall` is a reduction over j of a formula whose variables are bound to
arrays of known kinds: categories and dimensions, library, dtype, device, batch shape,
N and M (a reduction over i is the same call with i and j exchanged). :func:`execute`
runs it on canonical arrays with no autograd, through the launcher of the call's backend
(:mod:`lazytensor.core.backend`: the NumPy reference, CPU kernels, CUDA kernels). What does not change from call to call (the kernel, its launch
arguments, the outputs' shapes) is kept in the call's ``memo``, so that a call that comes
back (the plans of :mod:`lazytensor.engine.plans.plans` keep them) only allocates and launches.

>>> import numpy as np
>>> from lazytensor.codegen import ir, ops
>>> x, y = ir.var(0, 2, "i"), ir.var(1, 2, "j")
>>> call = ReductionCall(ops.apply("sum", ops.apply("mul", x, y)), ("i", "j"), (2, 2), "sum",
...                      (), "numpy", "numpy", "float64", "cpu", (), 3, 4)
>>> execute(call, [np.ones((3, 2)), np.ones((4, 2))])[0][:, 0].tolist()
[8.0, 8.0, 8.0]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..codegen import ir, reductions
from ..codegen.render_c import VarSpec
from . import backend
from .kernels import KernelSpec


@dataclass(frozen=True, eq=False)
class ReductionCall:
    """A bound reduction over j: the formula, its variables' layout, options, sizes.

    ``device_index`` is the GPU of a CUDA call. ``memo`` holds what is worked out once for
    the call: its executor (kernel and launch for one layout of arrays), and the gradient
    plans of :mod:`lazytensor.autodiff.autograd` and :mod:`lazytensor.autodiff.dual`.
    """

    formula: ir.Node
    cats: tuple
    dims: tuple
    reduction: str
    opts: tuple
    backend: str
    library: str
    dtype: str
    device: str
    batch: tuple
    N: int
    M: int
    device_index: int | None = None
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def opts_dict(self) -> dict:
        return dict(self.opts)

    def outputs(self):
        return reductions.get(self.reduction).outputs(self.formula.dim, self.opts_dict)

    def with_formula(self, formula, cats, dims, reduction="sum", opts=(), axis=1):
        """A new call on the same sizes (used by gradients); axis 0 swaps i and j."""
        N, M = self.N, self.M
        if axis == 0:
            formula = ir.swap_ij(formula)
            cats = tuple(ir.swap_cat(c) for c in cats)
            N, M = M, N
        return ReductionCall(formula, tuple(cats), tuple(dims), reduction, tuple(opts),
                             self.backend, self.library, self.dtype, self.device, self.batch, N, M,
                             self.device_index)

    def spec(self, ranged: bool = False) -> KernelSpec:
        """The kernel of this call (everything static about it); ``ranged``: its
        block-sparse variant."""
        return KernelSpec(
            self.formula,
            tuple(VarSpec(k, d, c) for k, (d, c) in enumerate(zip(self.dims, self.cats))),
            self.reduction, self.opts, self.dtype, ranged)


def execute(call: ReductionCall, arrays: list, ranges=None) -> list:
    """Outputs of ``call`` on canonical arrays (no autograd); block-sparse with ``ranges``
    (a :class:`lazytensor.scale.ranges.BlockRanges` of the call's reduction over j)."""
    runtime = call.memo.get("runtime")
    if runtime is None:
        runtime = call.memo["runtime"] = backend.get(call.backend)
    if runtime.contiguous_inputs:
        arrays = _contiguous(call, arrays)
    shapes = tuple(a.shape for a in arrays)
    hit = call.memo.get("executor")
    if hit is None or hit[0] != shapes:
        hit = call.memo["executor"] = (shapes, runtime.executor(call, shapes, out_specs(call)))
    return hit[1](arrays, ranges)


def _contiguous(call: ReductionCall, arrays: list) -> list:
    if call.library == "torch":
        return [a if a.is_contiguous() and not _lazy_bits(a) else plain(a) for a in arrays]
    return [np.ascontiguousarray(a) for a in arrays]


def _lazy_bits(a) -> bool:
    """A torch view whose memory does not hold its values: a negated (``t.conj().imag``,
    ``torch._neg_view``) or conjugated view, whose sign torch applies only on reading."""
    return a.is_neg() or a.is_conj()


def plain(a):
    """``a``'s values in contiguous memory of their own sign (a copy only when needed)."""
    return a.detach().resolve_conj().resolve_neg().contiguous()


def out_specs(call: ReductionCall) -> list:
    """(shape, dtype) of each output, in the call's library."""
    specs = []
    for o in call.outputs():
        shape = (*call.batch, call.N, o.dim)
        if call.library == "torch":
            import torch

            specs.append((shape, getattr(torch, call.dtype) if o.kind == "value" else torch.int64))
        else:
            specs.append((shape, np.dtype(call.dtype if o.kind == "value" else np.int64)))
    return specs


def scalar_array(value: float, library: str, dtype: str, device: str):
    """A Python number as a 1-element array of the call's library, dtype and device."""
    if library == "torch":
        import torch

        return torch.full((1,), float(value), dtype=getattr(torch, dtype), device=device)
    return np.full((1,), float(value), dtype=dtype)
