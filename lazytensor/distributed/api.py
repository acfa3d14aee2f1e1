"""``reduce``: one reduction over a process group, prepared, checked across ranks, run.

>>> from lazytensor.distributed.api import ShardedReduction
>>> ShardedReduction.__doc__.split(".")[0]
'What every rank knows about one distributed reduction'
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..codegen import ir, reductions
from ..core.binding import Variable, bind, is_torch
from ..scale import blocks, merge
from . import protocol
from .context import Sharding

_last_stats: dict = {}


def last_stats() -> dict:
    """Timings of this process's last distributed reduction (``"forward"``, and
    ``"backward"`` after a backward pass): mode, ranks, ring steps, seconds spent in
    kernels (``compute_s``) and waiting for transfers after them (``wait_s``), bytes sent."""
    return {k: dict(v) for k, v in _last_stats.items()}


@dataclass(eq=False)
class ShardedReduction:
    """What every rank knows about one distributed reduction."""

    name: str
    formula: ir.Node
    variables: list
    axis: int
    opts: dict
    backend: str
    grad_mode: str | None
    comm: protocol.Comm
    out_idx: list
    red_idx: list
    par_idx: list
    dtype: str
    n_out: int
    what: str
    sizes: list = field(default_factory=list)
    description: str = ""  # the call's identity across ranks (see _describe)

    @property
    def offsets(self) -> list:
        return np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(int).tolist()

    @property
    def red_dims(self) -> list:
        return [self.variables[k].dim for k in self.red_idx]

    def split(self, tensors) -> tuple:
        a, b = len(self.out_idx), len(self.out_idx) + len(self.red_idx)
        return list(tensors[:a]), list(tensors[a:b]), list(tensors[b:])

    def tensors(self) -> list:
        return [self.variables[k].data for k in (*self.out_idx, *self.red_idx, *self.par_idx)]

    def variables_with(self, out_vals, red_vals, par_vals) -> list:
        """The call's variables holding these arrays (scalars unchanged)."""
        new = list(self.variables)
        for idx, vals in ((self.out_idx, out_vals), (self.red_idx, red_vals),
                          (self.par_idx, par_vals)):
            for k, a in zip(idx, vals):
                v = self.variables[k]
                new[k] = Variable(a, v.cat, v.dim, v.label)
        return new

    def record(self, phase: str, **stats) -> None:
        _last_stats[phase] = {"ranks": self.comm.size, **stats}


def _describe(plan: ShardedReduction, sharding: Sharding) -> str:
    """The prepared call's identity, the same on every rank that makes the same call."""
    def var(v):
        if v.is_scalar:
            return f"{v.cat}{v.dim}={v.data!r}"
        shape = v.shape[-1:] if v.cat != "p" else v.shape
        return f"{v.cat}{v.dim}{list(shape)}{'+grad' if v.data.requires_grad else ''}"

    return (f"{plan.name} over {'j' if plan.axis == 1 else 'i'} of "
            f"{ir.to_text(plan.formula, limit=160)} [{plan.formula.key[:12]}] "
            f"opts={sorted(plan.opts.items())} {plan.dtype} on {plan.comm.device.type} "
            f"backend={plan.backend} grad_mode={plan.grad_mode} "
            f"grad={'on' if torch.is_grad_enabled() else 'off'} mode={sharding.mode} "
            f"(<= {sharding.allgather_bytes} B) variables=[{', '.join(map(var, plan.variables))}]")


def _prepare(formula, variables, reduction, axis, opts, backend, grad_mode, comm) -> ShardedReduction:
    red = reductions.get(reduction)
    merge.rule(red.name)  # a reduction without a merge rule cannot be split
    if axis not in (0, 1):
        raise ValueError(f"reduction axis must be 0 (over i) or 1 (over j), got {axis!r}")
    sig = bind(variables)
    if sig.batch:
        raise NotImplementedError(f"a distributed {red.name} with batch dimensions "
                                  f"{sig.batch}: reduce each batch element separately")
    red_cat, out_cat = blocks.REDUCED_CAT[axis], blocks.OUTPUT_CAT[axis]
    arrays = [k for k, v in enumerate(variables) if not v.is_scalar]
    red_idx = [k for k in arrays if variables[k].cat == red_cat]
    if not red_idx:
        raise ValueError(f"a distributed {red.name} over {red_cat} shards the {red_cat}-variables, "
                         f"but the formula {ir.to_text(formula, limit=80)} has none")
    return ShardedReduction(red.name, formula, list(variables), axis, dict(opts), backend, grad_mode, comm,
                [k for k in arrays if variables[k].cat == out_cat], red_idx,
                [k for k in arrays if variables[k].cat == "p"], sig.dtype,
                blocks.output_lead(variables, axis)[0],
                f"distributed {red.name} over {red_cat} on rank {comm.rank} of {comm.size}")


def _as_torch(variables: list) -> tuple:
    numpy_in = any(isinstance(v.data, np.ndarray) for v in variables)
    if not numpy_in:
        return variables, False
    return [Variable(torch.from_numpy(np.ascontiguousarray(v.data)), v.cat, v.dim, v.label)
            if isinstance(v.data, np.ndarray) else v for v in variables], True


def reduce(formula: ir.Node, variables: list, reduction: str, axis: int, opts: dict,
           backend: str = "auto", grad_mode: str | None = None, sharding: Sharding | None = None):
    """``reduction`` of ``formula`` over ``axis``, the reduced side's rows split over the
    ranks of ``sharding.group`` (each rank passes its own slice); returns this rank's
    output rows, as :func:`lazytensor.engine.plans.reduce` does for one process.

    Every rank of the group must call it with the same formula, reduction and options.
    """
    sharding = sharding or Sharding()
    _last_stats.clear()
    variables, numpy_in = _as_torch(list(variables))
    device = next((v.data.device for v in variables if is_torch(v.data)), torch.device("cpu"))
    comm = protocol.Comm(sharding, device)
    plan, failure, description = None, None, ""
    try:
        plan = _prepare(formula, variables, reduction, axis, dict(opts), backend, grad_mode, comm)
        description = plan.description = _describe(plan, sharding)
    except Exception as e:  # reported on every rank by the handshake
        failure = e
    what = plan.what if plan is not None else f"distributed {reduction} on rank {comm.rank}"
    counts = [plan.n_out, variables[plan.red_idx[0]].rows] if plan is not None else [0, 0]
    table = protocol.handshake(comm, description, counts, failure, what)
    plan.sizes = [row[1] for row in table]
    total = sum(plan.sizes)
    reductions.get(plan.name).check(formula.dim, plan.opts, total)  # as one process, everywhere
    nbytes = total * sum(plan.red_dims) * torch.empty((), dtype=getattr(torch, plan.dtype)).element_size()
    mode = sharding.mode
    if mode == "auto":
        mode = "allgather" if nbytes <= sharding.allgather_bytes else "ring"
    if comm.size == 1 or mode == "allgather":
        from .allgather import gathered_reduce

        outs = gathered_reduce(plan)
    else:
        from .ring import ring_reduce

        outs = ring_reduce(plan)
    if numpy_in:
        outs = tuple(o.detach().numpy() for o in outs)
    return outs[0] if len(outs) == 1 else tuple(outs)


__all__ = ["ShardedReduction", "last_stats", "reduce"]
