"""Dual (mixed-mode) gradients: forward-mode tangents fused into the forward kernel.

For ``a_i = Σ_j F(x_i, y_j, p)`` with ``x`` (and/or ``p``) of small total dimension k, the
forward kernel also accumulates ``J_i = Σ_j ∂F/∂(x_i, p)`` (k tangent directions, each a
JVP formula sharing the forward's subterms). The backward for those inputs is then
``g_iᵀ J_i``: an O(N·k·F) product, with no second pass over the N×M pairs. Branches
(``ifelse``, ``step``, ``relu``, ``clamp``, comparisons) need no reverse rule: each
tangent follows the branch taken.

LogSumExp fuses too: ``∂ lse_i = Σ_j softmax_ij(F) ∂F_ij``, a softmax-weighted sum of the
tangents, which the SumSoftMaxWeight accumulator computes in the same pass as ``lse``.
(SumSoftMaxWeight and weighted LogSumExp have fused forms as well, as softmax-weighted
sums of ``∂w``, ``w ⊗ ∂f`` and ``∂f``; they use the symbolic path for now.)

Second-order gradients (``create_graph=True``) fall back to the symbolic path
(:mod:`lazytensor.autodiff.autograd`), which is differentiable to any order. The fused call (the
tangent formulas) is worked out once per call and set of dual inputs (:func:`fused_call`).

``grad_mode`` ("auto", "symbolic", "dual") and its default are options
(:func:`lazytensor.core.options.set_default_grad_mode`).

>>> AUTO_MAX_FUSED, AUTO_MAX_OUTPUT_DIM, AUTO_MIN_PAIRS
(16, 3, 65536)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..codegen import ir, reductions, tangents
from ..core.call import ReductionCall, execute
from .autograd import reduction_vjp, unbroadcast

# "auto" picks dual mode while the fused formula (F and its k tangents: E * (1 + k)
# components for F of dimension E) stays within the pair loop's vector width
# (codegen.cpu.WIDE = 16; past it the fused pairs go one at a time: 14x the forward at
# E = 1, k = 16), and for outputs of at most 3 components (from E = 4 the forward's weighted
# sums are cheap and the tangents are not: symbolic / dual 0.84-1.06 at E = 4 and 8).
# Measured on the CPU backend, N = M = 10,000, Gaussian kernel, loaded machine, medians of
# 5 alternated rounds: symbolic / dual 1.6-2.7 at E = 1, k = 1..15; 1.1-1.3 at E = 2,
# k = 1..7 and E = 3, k = 3..4; 0.89 at E = 4, k = 3; 0.47 at E = 8, k = 3; 0.28 at E = 4, k = 6.
AUTO_MAX_FUSED = 16
AUTO_MAX_OUTPUT_DIM = 3
# Fewest pairs (B x N x M) for which "auto" picks dual mode. Below this the backward kernel
# that dual mode saves costs no more than the tangents it adds to the forward: forward +
# backward take the same time either way, and the forward alone is 1.5x faster without
# tangents (Gaussian D = 3, x requires grad, minimum of 400 calls, loaded machine:
# N = M = 200: 239 / 240 us forward + backward, 114 / 77 us forward, dual / symbolic;
# N = M = 300: 297 / 317 us and 178 / 108 us: from there dual mode pays).
AUTO_MIN_PAIRS = 1 << 16


def dual_slots(call: ReductionCall, requires_grad: tuple, mode: str) -> tuple:
    """Indices of the inputs whose gradient will come from fused tangents (() = symbolic),
    given which inputs require a gradient."""
    fusable = reductions.get(call.reduction).fusable
    if mode == "symbolic" or not fusable:
        if mode == "dual" and not fusable:
            names = [r.name for r in reductions.all_reductions() if r.fusable]
            raise ValueError(f"grad_mode='dual' supports the reductions {tuple(names)}, "
                             f"not {call.reduction}")
        return ()
    ks = [k for k, r in enumerate(requires_grad) if r and call.cats[k] in ("i", "p")]
    k_total = sum(call.dims[k] for k in ks)
    pairs = call.N * call.M
    for s in call.batch:
        pairs *= s
    E = call.formula.dim
    if not ks or (mode == "auto" and (E > AUTO_MAX_OUTPUT_DIM or E * (1 + k_total) > AUTO_MAX_FUSED
                                      or pairs < AUTO_MIN_PAIRS)):
        return ()
    return tuple(ks)


def tangent_formulas(F: ir.Node, call: ReductionCall, ks: list[int]) -> list[ir.Node]:
    """One JVP formula per tangent direction (basis vector of each dual input)."""
    out = []
    for k in ks:
        x = ir.var(k, call.dims[k], call.cats[k])
        out.extend(tangents.basis_jvp(F, x, c) for c in range(call.dims[k]))
    return out


@dataclass(frozen=True)
class Fused:
    """The fused forward of a call: ``call`` sums F and the distinct tangents; tangent t
    is ``scales[t]`` times distinct tangent ``index[t]`` (index ``n_unique``: zero)."""

    call: ReductionCall
    index: tuple
    scales: tuple
    n_unique: int


def fused_call(call: ReductionCall, ks: tuple) -> Fused:
    """The forward call that also accumulates the tangents (kept in ``call``'s memo).

    Sum: ``concat(F, ∂F...)`` summed. LogSumExp: the same formula read as ``f`` and the
    weights ``∂f`` of a softmax-weighted sum, whose second output is the log-sum-exp. The
    tangents are those of :func:`lazytensor.codegen.tangents.fused_tangents`: each distinct
    one once, constant factors applied after the sum.
    """
    key = ("dual", tuple(ks))
    fused = call.memo.get(key)
    if fused is None:
        fused = call.memo[key] = _fused_call(call, ks)
    return fused


def _fused_call(call: ReductionCall, ks: tuple) -> Fused:
    red = reductions.get(call.reduction)
    F = call.formula
    unique, uses = tangents.fused_tangents(F, tangent_formulas(F, call, ks))
    n = len(unique)
    if not unique:  # no input changes F: one zero column keeps the fused form
        unique = [ir.const([0.0] * F.dim)]
    formula, reduction, keep_opts = red.dual(F, unique)
    fused = call.with_formula(formula, call.cats, call.dims, reduction,
                              call.opts if keep_opts else ())
    return Fused(fused, tuple(u if u >= 0 else n for u, _ in uses),
                 tuple(sc for _, sc in uses), n)


class FusedReduction(torch.autograd.Function):
    """Sum / LogSumExp whose forward also accumulates ``Σ_j ∂F/∂v`` for the dual inputs."""

    @staticmethod
    def forward(ctx, call: ReductionCall, ks: tuple, ranges, *tensors):
        fused = fused_call(call, tuple(ks))
        outs = execute(fused.call, list(tensors), ranges)
        out, J = reductions.get(call.reduction).dual_outputs(outs, call.formula.dim)
        out = out.contiguous()
        if ranges is not None and ranges.empty_rows().any():
            # rows that reduce over no pair have no tangent (a log-sum-exp's would be 0/0)
            empty = torch.from_numpy(ranges.empty_rows()).to(J.device)
            J = J.masked_fill(empty[:, None, None], 0)
        ctx.call, ctx.ks, ctx.n_in, ctx.fused = call, tuple(ks), len(tensors), fused
        ctx.ranges = ranges
        ctx.save_for_backward(*tensors, out, J)
        return out

    @staticmethod
    def backward(ctx, g):
        saved = ctx.saved_tensors
        inputs, out, J = list(saved[: ctx.n_in]), saved[ctx.n_in], saved[ctx.n_in + 1]
        needs = list(ctx.needs_input_grad[3:])
        call = ctx.call
        if torch.is_grad_enabled():
            # create_graph: the symbolic path is differentiable to any order.
            return (None, None, None, *reduction_vjp(call, inputs, [out], [g], needs,
                                                     ctx.ranges))
        grads = [None] * len(inputs)
        parts = _slot_gradients(J, g, ctx.fused, [call.dims[k] for k in ctx.ks],
                                [call.cats[k] == "p" for k in ctx.ks])
        for k, part in zip(ctx.ks, parts):
            if needs[k]:
                grads[k] = unbroadcast(part, inputs[k].shape)
        rest = [needs[k] and k not in ctx.ks for k in range(len(inputs))]
        if any(rest):
            sym = reduction_vjp(call, inputs, [out], [g], rest, ctx.ranges)
            grads = [s if s is not None else d for s, d in zip(sym, grads)]
        return (None, None, None, *grads)


def _slot_gradients(J: torch.Tensor, g: torch.Tensor, fused: Fused, dims: list,
                    row_sums: list) -> list:
    """``gᵀ J`` split per dual input: ``(..., N, d)`` tensors, one per input of ``dims``,
    summed over the rows (``(..., d)``) where ``row_sums`` says so (parameters).

    On the CPU the O(N·k·F) contraction runs in NumPy's single-threaded loops: torch
    would wake its thread pool for each of these few-microsecond operations, and on a
    busy machine every parallel operation waits for a scheduler slice (20 ms measured per
    operation at N = 20,000 on two loaded cores, against 0.05 ms on one thread)."""
    remap = (fused.n_unique < len(fused.index) or any(sc != 1.0 for sc in fused.scales)
             or fused.index != tuple(range(len(fused.index))))
    if J.device.type == "cpu" and J.dtype in (torch.float32, torch.float64):
        slot = np.einsum("...kf,...f->...k", J[..., : fused.n_unique, :].numpy(), g.numpy())
        if remap:  # tangent t = scales[t] * distinct tangent index[t]; index n_unique: zero
            # the zero column: of shape (..., 1) even when no tangent is distinct (then
            # ``slot`` has none, and every input reaches F through zero-derivative ops only)
            zero = np.zeros(slot.shape[:-1] + (1,), dtype=slot.dtype)
            slot = np.concatenate([slot, zero], -1)[..., list(fused.index)]
            slot *= np.asarray(fused.scales, dtype=slot.dtype)
        out, offset = [], 0
        for d, rows in zip(dims, row_sums):
            part = slot[..., offset: offset + d]
            offset += d
            out.append(torch.from_numpy(np.ascontiguousarray(part.sum(-2) if rows else part)))
        return out
    slot = torch.einsum("...kf,...f->...k", J[..., : fused.n_unique, :], g)
    if remap:
        slot = torch.cat([slot, slot.new_zeros(slot.shape[:-1] + (1,))], -1)
        index = torch.tensor(fused.index, device=g.device)
        scales = torch.tensor(fused.scales, dtype=g.dtype, device=g.device)
        slot = slot.index_select(-1, index) * scales
    return [p.sum(-2) if rows else p for p, rows in zip(torch.split(slot, dims, -1), row_sums)]
