"""The all-gather scheme: gather every rank's rows of the reduced side, run one kernel.

For small reduced sides (one collective instead of a ring of transfers). The gathered
arrays are differentiable: the gradient of a gathered array is summed over the ranks and
each rank keeps its own rows (:class:`GatherRows` and :class:`ScatterRowSums` are each
other's adjoints, so gradients of any order work); parameters are broadcast from the
first rank and their gradients summed over the ranks (:class:`Replicated`). The kernel
sees the same arrays as one process would: results are those of one process.
"""

from __future__ import annotations

import time

import torch

from ..engine import plans as engine
from . import protocol


def gather_rows(comm, sizes: list, x: torch.Tensor, what: str) -> torch.Tensor:
    """Every rank's rows of ``x`` (``sizes[k]`` rows on rank k), in rank order."""
    if comm.size == 1:
        return x
    width = max(sizes)
    buf = x.new_zeros((width, *x.shape[1:]))
    buf[: x.shape[0]] = x
    table = comm.all_gather(buf, f"{what}: the all-gather of the reduced side")
    return torch.cat([table[k, : sizes[k]] for k in range(comm.size)])


class GatherRows(torch.autograd.Function):
    """All ranks' rows; backward: this rank's rows of the gradient summed over ranks."""

    @staticmethod
    def forward(ctx, comm, sizes, what, x):
        ctx.comm, ctx.sizes, ctx.what = comm, sizes, what
        return gather_rows(comm, sizes, x.detach(), what)

    @staticmethod
    def backward(ctx, g):
        return None, None, None, ScatterRowSums.apply(ctx.comm, ctx.sizes, ctx.what, g)


class ScatterRowSums(torch.autograd.Function):
    """This rank's rows of ``g`` summed over the ranks (the adjoint of GatherRows)."""

    @staticmethod
    def forward(ctx, comm, sizes, what, g):
        ctx.comm, ctx.sizes, ctx.what = comm, sizes, what
        total = g.detach().contiguous().clone()
        if comm.size > 1:
            comm.all_reduce_(total, f"{what}: the sum of the reduced side's gradients")
        start = sum(sizes[: comm.rank])
        return total[start: start + sizes[comm.rank]].clone()

    @staticmethod
    def backward(ctx, h):
        return None, None, None, GatherRows.apply(ctx.comm, ctx.sizes, ctx.what, h)


class Replicated(torch.autograd.Function):
    """The first rank's values of a parameter; backward: its gradient summed over ranks."""

    @staticmethod
    def forward(ctx, comm, what, p):
        ctx.comm, ctx.what = comm, what
        return protocol.broadcast_tensors(comm, [p], what)[0].clone()

    @staticmethod
    def backward(ctx, g):
        return None, None, SumOverRanks.apply(ctx.comm, ctx.what, g)


class SumOverRanks(torch.autograd.Function):
    """``Σ_ranks g`` on every rank (its own adjoint)."""

    @staticmethod
    def forward(ctx, comm, what, g):
        ctx.comm, ctx.what = comm, what
        total = g.detach().contiguous().clone()
        if comm.size > 1:
            comm.all_reduce_(total, f"{what}: the sum of the parameters' gradients")
        return total

    @staticmethod
    def backward(ctx, h):
        return None, None, SumOverRanks.apply(ctx.comm, ctx.what, h)


def gathered_reduce(plan) -> tuple:
    """The reduction on all the reduced side's rows at once; a failure raises everywhere."""
    comm, what = plan.comm, plan.what
    out_vals, red_vals, par_vals = plan.split(plan.tensors())
    start = time.perf_counter()
    full, pars = red_vals, par_vals
    if comm.size > 1:
        full = [GatherRows.apply(comm, plan.sizes, what, t) for t in red_vals]
        pars = [Replicated.apply(comm, what, p) for p in par_vals]
    gathered = time.perf_counter()
    failure, res = None, None
    try:
        res = engine.reduce(plan.formula, plan.variables_with(out_vals, full, pars), plan.name,
                            plan.axis, plan.opts, plan.backend, plan.grad_mode)
    except Exception as e:  # every rank raises below
        failure = e
    done = time.perf_counter()
    if comm.size > 1:
        protocol.agree(comm, failure, what)
    elif failure is not None:
        raise failure
    plan.record("forward", mode="allgather", steps=1, compute_s=done - gathered,
                wait_s=gathered - start,
                bytes=sum(t.numel() * t.element_size() for t in red_vals) * (comm.size - 1))
    return res if isinstance(res, tuple) else (res,)


__all__ = ["GatherRows", "Replicated", "ScatterRowSums", "SumOverRanks", "gather_rows",
           "gathered_reduce"]
