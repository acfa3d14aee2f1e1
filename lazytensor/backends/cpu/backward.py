"""Both sides of a CPU backward in one kernel (:mod:`lazytensor.codegen.cpu.twosided`).

A backward whose i-side (i-variables, parameters) and j-side (j-variables) inputs both
need a gradient runs two Sums over the same pairs (:mod:`lazytensor.autodiff.autograd`). When both
are wide sums with dot products (the gradients of a Gaussian kernel in dimension 64 in x,
y and σ), one kernel computes them from the same tiles: the distances and exponentials
once instead of twice. :func:`two_sided_totals` runs it where it applies -- CPU backend,
no block-sparse ranges, a backward that builds no graph (``create_graph`` takes the two
differentiable Sums), N and M > 0 -- and returns each side's total as ``_side_sum`` would;
otherwise None, and the caller runs the two Sums. :func:`add_row_terms` adds the row
terms split off a side's sum (:class:`lazytensor.codegen.linearize.RowSplit`) in NumPy,
for these kernels and the one-sided ones alike, in backwards that build no graph. ``LAZYTENSOR_TWO_SIDED=0`` turns it off.

>>> import torch
>>> from lazytensor import Vi, Vj
>>> x, y = torch.rand(50, 64, requires_grad=True), torch.rand(60, 64, requires_grad=True)
>>> (-Vi(x).sqdist(Vj(y))).exp().sum(1).sum().backward()
>>> x.grad.shape, y.grad.shape
(torch.Size([50, 64]), torch.Size([60, 64]))
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from ...codegen import ir
from ...codegen.arraymath import torch_namespace
from ...codegen.cpu.twosided import render_two_sided, two_sided_formula, two_sided_shape
from ...codegen.evaluate import evaluate
from ...codegen.render_c import VarSpec
from ...core import kernels
from ...core.kernels import KernelSpec, Toolchain, load_once


@dataclass(frozen=True)
class TwoSided:
    """The kernel of both sides of a backward and how its inputs are laid out: the
    backward's arguments, then the i-side's hoisted values (j-rows), then the j-side's
    (i-rows)."""

    spec: KernelSpec
    n_args: int
    F_i: int
    F_j: int


def two_sided_plan(call, plan) -> TwoSided | None:
    """The :class:`TwoSided` of a :class:`lazytensor.autodiff.autograd.VjpFormulas`, or None where the
    kernel does not apply (worked out once per plan, kept in ``call.memo``)."""
    key = ("twosided", id(plan))
    if key not in call.memo:
        call.memo[key] = (plan, _plan(plan))  # the plan kept: its id stays its own
    return call.memo[key][1]


def _plan(plan) -> TwoSided | None:
    if len(plan.sides) != 2:
        return None
    si, sj = plan.sides
    if (si.call.backend != "cpu" or si.plan is None or sj.plan is None or si.normalized
            or sj.normalized or si.shift is not None or sj.shift is not None):
        return None
    from .runtime import check_stack

    try:  # each side within a thread's stack as a one-sided kernel (else that says why)
        check_stack(si.call.spec())
        check_stack(sj.call.spec())
    except ValueError:
        return None
    n_args = len(si.call.cats) - len(si.plan.hoisted)
    n_hi, n_hj = len(si.plan.hoisted), len(sj.plan.hoisted)
    # the j-side's hoisted values (its own j-rows) numbered after the i-side's
    renumber = {ir.var(n_args + k, n.dim, "j"): ir.var(n_args + n_hi + k, n.dim, "j")
                for k, n in enumerate(sj.plan.hoisted)}
    G_j = ir.substitute(sj.call.formula, renumber) if renumber else sj.call.formula
    formula = two_sided_formula(si.call.formula, ir.swap_ij(G_j))
    cats = list(si.call.cats) + ["i"] * n_hj
    dims = list(si.call.dims) + [n.dim for n in sj.plan.hoisted]
    specs = tuple(VarSpec(k, d, c) for k, (d, c) in enumerate(zip(dims, cats)))
    if two_sided_shape(formula, list(specs), si.call.dtype) is None:
        return None
    spec = KernelSpec(formula, specs, "sum", si.call.opts, si.call.dtype)
    assert n_args + n_hi + n_hj == len(specs)
    return TwoSided(spec, n_args, si.call.formula.dim, sj.call.formula.dim)


_table: dict = {}


def _backend() -> Toolchain:
    from .runtime import cpu_toolchain

    return cpu_toolchain(render=lambda spec: render_two_sided(spec.formula, list(spec.var_specs),
                                                            spec.opts_dict, spec.dtype),
                       key_extra={"two_sided": True}, label="two-sided gradient kernel")


def _kernel(spec: KernelSpec):
    from .runtime import CpuKernel

    def load():
        kernel = CpuKernel(kernels.kernel_binary(_backend(), spec), spec)
        kernel.outputs = kernel.outputs * 2  # the i-side and the j-side sums
        return kernel

    return load_once(_table, spec, load)


def applies(call, args: list, ranges) -> bool:
    """The backward of ``call`` on ``args`` may take the two-sided kernel (see the module
    docstring)."""
    return (ranges is None and call.backend == "cpu" and not torch.is_grad_enabled()
            and os.environ.get("LAZYTENSOR_TWO_SIDED", "1") not in ("0", "false", "no")
            and call.N > 0 and call.M > 0 and all(s > 0 for s in call.batch)
            and call.dtype in ("float32", "float64")
            and not torch._C._are_functorch_transforms_active()
            and all(isinstance(a, torch.Tensor) and a.device.type == "cpu" for a in args))


def two_sided_totals(call, plan, args: list) -> list | None:
    """[total of the i-side, total of the j-side] of the backward ``plan`` of ``call``
    (each as :func:`lazytensor.autodiff.autograd._side_sum` gives it), or None when the kernel
    does not apply to this plan."""
    from .runtime import CpuLaunch

    ts = two_sided_plan(call, plan)
    if ts is None:
        return None
    si, sj = plan.sides
    args = [a.detach().resolve_conj().resolve_neg().contiguous() for a in args]
    xp = torch_namespace()
    rows = []
    for side in (si, sj):  # each side's hoisted values, of its own reduced variables
        arrays = {k: a for k, (a, cat) in enumerate(zip(args, side.call.cats)) if cat == "j"}
        rows.append([evaluate(n, arrays, xp).contiguous() for n in side.plan.hoisted])
    data = args + rows[0] + rows[1]
    shapes = [tuple(a.shape) for a in data]
    key = ("twosided-launch", tuple(shapes))
    launch = call.memo.get(key)
    if launch is None:
        sc = si.call
        launch = call.memo[key] = CpuLaunch(_kernel(ts.spec), shapes,
                                            [v.cat for v in ts.spec.var_specs], sc.batch,
                                            sc.N, sc.M)
    dt = getattr(torch, si.call.dtype)
    Gi = torch.empty((*si.call.batch, si.call.N, ts.F_i), dtype=dt)
    Gj = torch.empty((*si.call.batch, si.call.M, ts.F_j), dtype=dt)
    launch(data, [Gi, Gj], _ptr)
    out = []
    for side, G, extra in ((si, Gi, rows[0]), (sj, Gj, rows[1])):
        split = side.plan.split
        out.append(G if split is None else add_row_terms(split, G, args + extra, side.call.cats))
    return out


def add_row_terms(split, G, args: list, cats: tuple):
    """``G[..., :split.dim]`` plus the row terms ``coef * G[..., weight] * L(i)`` (see
    :class:`lazytensor.codegen.linearize.RowSplit`), in NumPy, in place in ``G``'s memory
    (a torch view of it is returned); for backwards that build no graph."""
    g = G.detach().numpy()
    out = g[..., : split.dim]
    arrays = {}
    for k, (a, cat) in enumerate(zip(args, cats)):
        if cat in ("i", "p"):
            a = a.detach().resolve_conj().resolve_neg().numpy()
            arrays[k] = a if cat == "i" else a[..., None, :]  # (*batch, 1, D) against rows
    for t in split.terms:
        L = (evaluate(t.factor, arrays) if t.factor.op != "const"
             else np.asarray(t.factor.params, dtype=g.dtype))
        L = np.asarray(L)  # its width read from the array: no calls into the plan's types
        out[..., t.offset: t.offset + L.shape[-1]] += (t.coef * g[..., t.weight: t.weight + 1]) * L
    return torch.from_numpy(out)


def _ptr(a) -> int:
    return a.data_ptr()

