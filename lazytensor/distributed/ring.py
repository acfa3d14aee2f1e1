"""The ring scheme: the reduced side's blocks travel around the ranks.

Forward, on rank r of R, step t = 0 .. R-1 works on the block of rank ``r - t``: it
starts the transfer of that block to rank r+1 and the receipt of the next one from
rank r-1, runs the kernel on the block while they travel, merges the block's partial
state (:mod:`lazytensor.scale.merge`) into the running one and waits. A block's message is
its variables' rows packed in one flat buffer (``m · Σ D`` values).

Backward, the blocks go around once more and each carries the gradient of its rows:
step t recomputes the block's reduction with autograd, pulls the cotangents of its
outputs (from the saved block states, :func:`lazytensor.scale.merge.cotangents`) back to this
rank's rows (kept), to the parameters (summed over the ranks at the end) and to the
block's rows, added to the block's gradient that came with it from rank r-1 and sent on
to rank r+1; after the last step each block's gradient reaches its owner. A block whose
cotangents are all zero (a min that none of its points won) is skipped.
"""

from __future__ import annotations

import time

import torch
from torch.autograd.function import once_differentiable

from ..scale import blocks, merge
from . import protocol


def _pack(tensors: list, dtype, device) -> torch.Tensor:
    if not tensors:
        return torch.empty(0, dtype=dtype, device=device)
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _unpack(flat: torch.Tensor, rows: int, dims: list) -> list:
    out, pos = [], 0
    for d in dims:
        out.append(flat[pos: pos + rows * d].view(rows, d))
        pos += rows * d
    return out


def _forward(plan, out_vals, red_vals, par_vals):
    """(outputs, each rank's block state, broadcast parameters)."""
    comm, R, r = plan.comm, plan.comm.size, plan.comm.rank
    rule, dims, sizes, offsets = merge.rule(plan.name), plan.red_dims, plan.sizes, plan.offsets
    pars = protocol.broadcast_tensors(comm, par_vals, plan.what)
    dtype = getattr(torch, plan.dtype)
    cur = _pack(red_vals, dtype, comm.device)
    states, acc, failure = [None] * R, None, None
    compute_s = wait_s = 0.0
    nbytes = 0
    for t in range(R):
        owner = (r - t) % R
        works = []
        step = (f"{plan.what}: ring step {t + 2} of {R} (the block of rank {(owner - 1) % R} "
                f"from rank {(r - 1) % R})")
        if t < R - 1:
            nxt = torch.empty(sizes[(owner - 1) % R] * sum(dims), dtype=dtype, device=comm.device)
            works = comm.exchange([(cur, r + 1, 2 * t)], [(nxt, r - 1, 2 * t)], step)
            nbytes += cur.numel() * cur.element_size()
        start = time.perf_counter()
        if failure is None:
            try:
                variables = plan.variables_with(out_vals, _unpack(cur, sizes[owner], dims), pars)
                st = blocks.block_state(plan.name, plan.formula, variables, plan.axis, plan.opts,
                                        sizes[owner], offsets[owner], (plan.n_out,), plan.dtype,
                                        plan.backend)
                states[owner] = st
                acc = st if acc is None else rule.merge(acc, st, plan.opts)
            except Exception as e:  # the ring goes on; every rank raises in agree()
                failure = e
        waited = time.perf_counter()
        comm.wait(works, step)
        compute_s += waited - start
        wait_s += time.perf_counter() - waited
        if works:
            cur = nxt
    protocol.agree(comm, failure, plan.what)
    plan.record("forward", mode="ring", steps=R, compute_s=compute_s, wait_s=wait_s, bytes=nbytes)
    outs = merge.finalize(plan.name, acc, plan.opts, dtype)
    return outs, states, pars


def _backward(plan, out_vals, red_vals, pars, states, grads, needs):
    """Gradients of the inputs (out side, reduced side, parameters), None where unneeded."""
    comm, R, r = plan.comm, plan.comm.size, plan.comm.rank
    dims, sizes, offsets = plan.red_dims, plan.sizes, plan.offsets
    dtype = getattr(torch, plan.dtype)
    need_out, need_red, need_par = plan.split(needs)
    gdims = [d for d, n in zip(dims, need_red) if n]
    failure, cots = None, None
    try:
        cots = merge.cotangents(plan.name, states, offsets, sizes, list(grads), plan.opts, dtype,
                                plan.formula.dim)
    except Exception as e:
        failure = e
    protocol.handshake(comm, "backward of " + plan.description, [], failure, plan.what + " (backward)")
    out_g = [torch.zeros_like(v) if n else None for v, n in zip(out_vals, need_out)]
    par_g = [torch.zeros_like(p) if n else None for p, n in zip(pars, need_par)]
    cur = _pack(red_vals, dtype, comm.device)
    acc_sends: list = []
    back = f"{plan.what} (backward): the return of the gradients to their ranks"
    compute_s = wait_s = 0.0
    nbytes = 0
    for t in range(R):
        owner = (r - t) % R
        sends, recvs, acc_in = [], [], None
        if t < R - 1:
            nxt = torch.empty(sizes[(owner - 1) % R] * sum(dims), dtype=dtype, device=comm.device)
            sends.append((cur, r + 1, 2 * t))
            recvs.append((nxt, r - 1, 2 * t))
            nbytes += cur.numel() * cur.element_size()
        if t > 0 and gdims:  # the gradient of this block's rows so far, from rank r-1
            acc_in = torch.empty(sizes[owner] * sum(gdims), dtype=dtype, device=comm.device)
            recvs.append((acc_in, r - 1, 2 * t - 1))
        step = f"{plan.what} (backward): ring step {t + 1} of {R}"
        works = comm.exchange(sends, recvs, step)
        start = time.perf_counter()
        contribution = torch.zeros(sizes[owner] * sum(gdims), dtype=dtype, device=comm.device)
        if failure is None and sizes[owner] > 0 and _flows(cots[owner]):
            try:
                got = _block_grads(plan, out_vals, _unpack(cur, sizes[owner], dims), pars,
                                   cots[owner], need_out, need_red, need_par)
                for acc_g, g in zip(out_g + par_g, got[0] + got[2]):
                    if acc_g is not None and g is not None:
                        acc_g += g
                contribution = _pack([g if g is not None else torch.zeros(sizes[owner], d,
                                                                          dtype=dtype)
                                      for g, d, n in zip(got[1], dims, need_red) if n],
                                     dtype, comm.device)
            except Exception as e:
                failure = e
        waited = time.perf_counter()
        comm.wait(works, step)
        compute_s += waited - start
        wait_s += time.perf_counter() - waited
        if gdims:
            acc = contribution if acc_in is None else acc_in + contribution
            if R == 1:
                final = acc
            else:
                acc_sends += comm.exchange([(acc, r + 1, 2 * t + 1)], [], back)
                nbytes += acc.numel() * acc.element_size()
        if t < R - 1:
            cur = nxt
    if gdims and R > 1:
        final = torch.empty(sizes[r] * sum(gdims), dtype=dtype, device=comm.device)
        acc_sends += comm.exchange([], [(final, r - 1, 2 * R - 1)], back)
    comm.wait(acc_sends, back)
    protocol.agree(comm, failure, plan.what + " (backward)")
    red_g = [None] * len(red_vals)
    if gdims:
        parts = iter(_unpack(final, sizes[r], gdims))
        red_g = [next(parts).clone() if n else None for n in need_red]
    if any(need_par) and R > 1:
        flat = torch.cat([g.reshape(-1) for g in par_g if g is not None])
        comm.all_reduce_(flat, f"{plan.what} (backward): the sum of the parameters' gradients")
        pos = 0
        for k, g in enumerate(par_g):
            if g is not None:
                par_g[k] = flat[pos: pos + g.numel()].view(g.shape)
                pos += g.numel()
    plan.record("backward", mode="ring", steps=R, compute_s=compute_s, wait_s=wait_s,
                bytes=nbytes)
    return out_g + red_g + par_g


def _flows(cots) -> bool:
    return any(c is not None and bool(torch.any(c != 0)) for c in cots)


def _block_grads(plan, out_vals, block, pars, cots, need_out, need_red, need_par):
    """This block's share of the gradients: (out side, block rows, parameters)."""
    with torch.enable_grad():
        leaves = [[v.detach().requires_grad_(n) for v, n in zip(vals, needs)]
                  for vals, needs in ((out_vals, need_out), (block, need_red), (pars, need_par))]
        variables = plan.variables_with(*leaves)
        outs = blocks.run_block(plan.name, plan.formula, variables, plan.axis, plan.opts,
                                block[0].shape[0], plan.backend, grad=True,
                                grad_mode=plan.grad_mode)
        pairs = [(o, c.to(o.dtype)) for o, c in zip(outs, cots)
                 if c is not None and o.requires_grad]
        wanted = [x for group in leaves for x in group if x.requires_grad]
        got = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [c for _, c in pairs],
                                       allow_unused=True) if pairs else [None] * len(wanted))
    return [[next(got) if x.requires_grad else None for x in group] for group in leaves]


class RingReduction(torch.autograd.Function):
    """The ring forward; its backward is the ring of gradients (first order only)."""

    @staticmethod
    def forward(ctx, plan, *tensors):
        out_vals, red_vals, par_vals = plan.split(tensors)
        outs, states, pars = _forward(plan, out_vals, red_vals, par_vals)
        ctx.plan, ctx.states, ctx.pars = plan, states, pars
        ctx.save_for_backward(*tensors)
        for o in outs:
            if not o.is_floating_point():
                ctx.mark_non_differentiable(o)
        return tuple(outs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        plan = ctx.plan
        out_vals, red_vals, _ = plan.split(ctx.saved_tensors)
        needs = list(ctx.needs_input_grad[1:])
        return (None, *_backward(plan, out_vals, red_vals, ctx.pars, ctx.states, grads, needs))


def ring_reduce(plan) -> tuple:
    """The reduction by the ring scheme, differentiable when an input requires grad."""
    tensors = plan.tensors()
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        if not merge.rule(plan.name).gradient_runs():
            raise NotImplementedError(f"the {plan.name} reduction has no gradient")
        return tuple(RingReduction.apply(plan, *tensors))
    with torch.no_grad():
        return tuple(_forward(plan, *plan.split(tensors))[0])


__all__ = ["RingReduction", "ring_reduce"]
