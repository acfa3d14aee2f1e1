"""Merging partial reductions of j-blocks (lazytensor.scale.merge, lazytensor.scale.blocks) against
one reduction over all of j: values to rounding, indices exact, gradients too."""

import numpy as np
import pytest
import torch

from lazytensor import Vi, Vj
from lazytensor import dask as ltdask
from lazytensor.engine import plans as engine
from lazytensor.scale import blocks, merge


def random_bounds(rng, M, nblocks):
    """Uneven cut points [0, ..., M], with empty blocks now and then."""
    cuts = np.sort(rng.integers(0, M + 1, size=nblocks - 1))
    return [0, *cuts.tolist(), M]


def blockwise(name, K, opts, bounds, rng):
    """The reduction as merged block states, the blocks merged in a random order."""
    dtype = str(K.variables[0].data.dtype).replace("torch.", "")
    lead = blocks.output_lead(K.variables, 1)
    states = [blocks.block_state(name, K.formula, blocks.slice_rows(K.variables, 1, a, b), 1,
                                 opts, b - a, a, lead, dtype)
              for a, b in zip(bounds[:-1], bounds[1:])]
    order = rng.permutation(len(states))
    state = states[order[0]]
    for k in order[1:]:  # sequential, in a shuffled order (merge is order-free)
        state = merge.merge(name, state, states[k], opts)
    return merge.finalize(name, state, opts, dtype)


def one_process(name, K, opts):
    out = engine.reduce(K.formula, K.variables, name, 1, opts)
    return out if isinstance(out, tuple) else (out,)


def check_equal(got, want, rtol=1e-12):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.dtype == np.int64:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * np.nanmax(np.abs(w[np.isfinite(w)]),
                                                                             initial=1.0))


def gaussian(rng, N=37, M=53, D=3, E=2):
    x, y, b = rng.random((N, D)), rng.random((M, D)), rng.standard_normal((M, E))
    return (-Vi(x).sqdist(Vj(y)) * 4).exp(), b


CASES = [
    ("sum", {}), ("sum", {"sum_scheme": "kahan_scheme"}), ("min", {}), ("max", {}),
    ("argmin", {}), ("argmax", {}), ("min_argmin", {}), ("max_argmax", {}),
    ("kmin", {"K": 4}), ("argkmin", {"K": 4}), ("kmin_argkmin", {"K": 7}),
    ("logsumexp", {}), ("logsumexp_weight", {}), ("sumsoftmaxweight", {}),
    ("max_sumshiftexp", {}),
]


def formula_for(name, rng, M=53):
    K, b = gaussian(rng, M=M)
    if name == "sum":
        return K * Vj(b)
    if name in ("logsumexp_weight", "sumsoftmaxweight"):
        # signed weights: some blocks' partial sums are negative, the totals positive
        w = b + 0.7 if name == "logsumexp_weight" else b
        return (Vi(rng.random((37, 3))) | Vj(rng.random((M, 3)))).concat(Vj(w))
    if name in ("logsumexp", "max_sumshiftexp"):
        return -Vi(rng.random((37, 3))).sqdist(Vj(rng.random((M, 3)))) * 3
    return (Vi(rng.random((37, 2))) - Vj(rng.random((M, 2)))).abs()  # F = 2, per component


@pytest.mark.parametrize("name,opts", CASES, ids=[f"{n}{'-' + '-'.join(o) if o else ''}"
                                                  for n, o in CASES])
def test_merged_blocks_equal_one_reduction_in_float64(name, opts, rng):
    K = formula_for(name, rng)
    want = one_process(name, K, opts)
    assert all(np.isfinite(w).mean() > 0.9 for w in want if w.dtype != np.int64)
    for nblocks in (1, 2, 5, 11):
        bounds = random_bounds(rng, 53, nblocks)
        check_equal(blockwise(name, K, opts, bounds, rng), want)


def test_float32_sums_merge_in_float64(rng):
    x, y = rng.random((40, 3)).astype(np.float32), rng.random((3000, 3)).astype(np.float32)
    b = rng.standard_normal((3000, 2)).astype(np.float32)
    K = (-Vi(x).sqdist(Vj(y))).exp() * Vj(b)
    got = blockwise("sum", K, {}, random_bounds(rng, 3000, 6), rng)[0]
    assert got.dtype == np.float32
    x64, y64, b64 = (a.astype(np.float64) for a in (x, y, b))
    terms = np.exp(-((x64[:, None] - y64[None]) ** 2).sum(-1))[..., None] * b64[None]
    np.testing.assert_allclose(got, terms.sum(1), atol=2e-6 * np.abs(terms).sum(1).max())


def test_kahan_merge_keeps_what_a_plain_float64_sum_loses():
    def st(v):
        return np.array([[v]]), np.zeros((1, 1))

    plain, kahan = {}, {"sum_scheme": "kahan_scheme"}
    for opts, want in ((plain, 0.0), (kahan, 1.0)):
        s = merge.merge("sum", merge.merge("sum", st(1e16), st(1.0), opts), st(-1e16), opts)
        assert merge.finalize("sum", s, opts, "float64")[0][0, 0] == want
    inf = merge.merge("sum", st(np.inf), st(1.0), kahan)
    assert merge.finalize("sum", inf, kahan, "float64")[0][0, 0] == np.inf


@pytest.mark.parametrize("name", ["argmin", "argmax", "min_argmin", "argkmin", "kmin_argkmin"])
def test_ties_across_blocks_go_to_the_lowest_global_index(name, rng):
    x = rng.integers(0, 3, (30, 2)).astype(np.float64)
    y = rng.integers(0, 3, (80, 2)).astype(np.float64)  # many equal distances
    K = Vi(x).sqdist(Vj(y))
    opts = {"K": 6} if "kmin" in name else {}
    for _ in range(4):
        check_equal(blockwise(name, K, opts, random_bounds(rng, 80, 7), rng),
                    one_process(name, K, opts))


@pytest.mark.parametrize("name,opts", [("min_argmin", {}), ("max_argmax", {}),
                                       ("kmin_argkmin", {"K": 5}), ("sum", {}),
                                       ("logsumexp", {}), ("sumsoftmaxweight", {})])
def test_nan_terms_propagate_as_in_one_reduction(name, opts, rng):
    x, y = rng.random((20, 2)), rng.random((60, 2))
    c = rng.random((60, 1))
    c[rng.choice(60, 4, replace=False)] = -1.0  # log(-1) = NaN for every i
    f = Vi(x).sqdist(Vj(y)) + Vj(c).log()
    K = f.concat(Vj(rng.standard_normal((60, 2)))) if name == "sumsoftmaxweight" else f
    for nblocks in (3, 8):
        check_equal(blockwise(name, K, opts, random_bounds(rng, 60, nblocks), rng),
                    one_process(name, K, opts))


@pytest.mark.parametrize("name", ["logsumexp", "logsumexp_weight", "sumsoftmaxweight"])
def test_infinite_terms_follow_the_kernels_limits(name, rng):
    x, y, w = rng.random((15, 2)), rng.random((50, 2)), rng.random((50, 2)) + 0.5
    c = rng.random((50, 1)) + 0.5
    c[:12] = 0.0  # -inf terms: a whole block of them, the others among finite ones
    f = Vi(x).sqdist(Vj(y)) * 0 + Vj(c).log()
    g = -Vj(c).log()  # +inf terms, in several blocks with different counts
    for form in (f, g):
        K = form.concat(Vj(w)) if name != "logsumexp" else form
        for bounds in ([0, 12, 50], [0, 5, 12, 30, 50], [0, 3, 7, 12, 12, 50]):
            check_equal(blockwise(name, K, {}, bounds, rng), one_process(name, K, {}))


def test_kmin_blocks_smaller_than_k_pad_with_empty_slots(rng):
    x, y = rng.random((10, 1)), rng.random((20, 1))
    K = Vi(x).sqdist(Vj(y))
    bounds = [0, 1, 1, 3, 4, 20]  # blocks of 1, 0, 2, 1, 16 points against K = 6
    check_equal(blockwise("kmin_argkmin", K, {"K": 6}, bounds, rng),
                one_process("kmin_argkmin", K, {"K": 6}))


@pytest.mark.parametrize("name,opts", [n for n in CASES if n[0] != "max_sumshiftexp"])
def test_pack_and_unpack_give_the_state_back(name, opts, rng):
    K = formula_for(name, rng)
    state = blocks.block_state(name, K.formula, K.variables, 1, opts, 53, 100, (37,), "float64")
    back = ltdask.unpack(name, ltdask.pack(name, state, opts, K.formula.dim), opts,
                         K.formula.dim, np.float64)
    for a, b in zip(state, back):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_numpy_in_numpy_out_and_torch_in_torch_out(rng):
    y = rng.random((9, 1))
    for conv in (lambda a: a, torch.from_numpy):
        a = merge.partial("min_argmin", (conv(y[None, :4].min(1)), conv(y[None, :4].argmin(1))),
                          {}, 0)
        b = merge.partial("min_argmin", (conv(y[None, 4:].min(1)), conv(y[None, 4:].argmin(1))),
                          {}, 4)
        v, i = merge.finalize("min_argmin", merge.merge("min_argmin", a, b, {}), {}, "float64")
        assert type(v) is type(conv(y)) and int(i[0, 0]) == int(np.argmin(y))


def test_reductions_without_a_rule_say_so():
    with pytest.raises(ValueError, match="unknown reduction"):
        merge.rule("median")


GRAD_CASES = [("sum", {}), ("min", {}), ("max_argmax", {}), ("kmin", {"K": 3}),
              ("kmin_argkmin", {"K": 5}), ("logsumexp", {}), ("logsumexp_weight", {}),
              ("sumsoftmaxweight", {})]


@pytest.mark.parametrize("name,opts", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_block_gradients_through_the_merge_equal_one_reduction(name, opts, rng):
    N, M = 23, 41
    x = torch.tensor(rng.random((N, 2)), requires_grad=True)
    y = torch.tensor(rng.random((M, 2)), requires_grad=True)
    w = torch.tensor(rng.standard_normal((M, 3)) + (2.0 if name == "logsumexp_weight" else 0),
                     requires_grad=True)

    def formula(xx, yy, ww):
        f = -Vi(xx).sqdist(Vj(yy)) * 3
        if name == "sum":
            return f.exp() * Vj(ww)
        return f.concat(Vj(ww)) if "weight" in name else f

    K = formula(x, y, w)
    want = one_process(name, K, opts)
    cot = [torch.tensor(rng.standard_normal(o.shape)) if o.is_floating_point() else None
           for o in want]
    leaves = [x, y, w]
    used = [t for t in leaves if any(v.data is t for v in K.variables)]
    want_grads = torch.autograd.grad([o for o, g in zip(want, cot) if g is not None], used,
                                     [g for g in cot if g is not None])

    bounds = random_bounds(rng, M, 4)
    with torch.no_grad():
        states = [blocks.block_state(name, K.formula, blocks.slice_rows(K.variables, 1, a, b), 1,
                                     opts, b - a, a, (N,), "float64")
                  for a, b in zip(bounds[:-1], bounds[1:])]
    cots = merge.cotangents(name, states, bounds[:-1], np.diff(bounds).tolist(), cot, opts,
                            torch.float64, K.formula.dim)
    got = {id(t): torch.zeros_like(t) for t in used}
    for (a, b), block_cots in zip(zip(bounds[:-1], bounds[1:]), cots):
        if a == b:
            continue
        yb, wb = y[a:b].detach().requires_grad_(), w[a:b].detach().requires_grad_()
        xb = x.detach().requires_grad_()
        Kb = formula(xb, yb, wb)
        outs = blocks.run_block(name, Kb.formula, Kb.variables, 1, opts, b - a, grad=True)
        pairs = [(o, c) for o, c in zip(outs, block_cots) if c is not None]
        ins = [t for t in (xb, yb, wb) if any(v.data is t for v in Kb.variables)]
        gs = torch.autograd.grad([o for o, _ in pairs], ins, [c for _, c in pairs],
                                 allow_unused=True)
        for t, g in zip(ins, gs):
            if g is None:
                continue
            target = x if t is xb else y if t is yb else w
            if target is x:
                got[id(x)] += g
            else:
                got[id(target)][a:b] += g
    for t, wg in zip(used, want_grads):
        torch.testing.assert_close(got[id(t)], wg, rtol=1e-10, atol=1e-10)
