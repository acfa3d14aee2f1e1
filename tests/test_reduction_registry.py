"""The reduction registry: array-level states merge exactly, and the facts hold together.

For every reduction, the state over j in [0, k) merged with the state over [k, M) must give
the outputs of the whole range (values bit for bit where the reduction selects, to
rounding where it sums), in NumPy and in torch, on data with ties, NaN and infinities; the
reference evaluator, which splits j when a chunk would not fit its budget, must give the
same outputs as in one piece.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lazytensor.codegen import reductions

from lazytensor import Vi, Vj
from lazytensor.backends.reference import dense as reference

ALL = [r.name for r in reductions.all_reductions()]


def _opts(red, M):
    return {"K": min(4, M)} if red.needs_k else {}


def _values(rng, red, M, specials):
    F = 3 if red.weighted or red.name == "sum" or not red.name.startswith(("log", "max_s")) else 1
    v = rng.integers(-3, 4, size=(5, M, F)).astype(np.float64)  # many ties
    if specials:
        v[0, rng.integers(M), 0] = np.nan
        v[1, rng.integers(M), 0] = np.inf
        v[2, :, 0] = -np.inf
        v[3, rng.integers(M), 0] = -np.inf
    if red.weighted:
        v[..., 1:] = np.abs(v[..., 1:]) + 0.5  # positive weights
    return v


def _same(got, want):
    for g, w in zip(got, want):
        g = g.numpy() if isinstance(g, torch.Tensor) else g
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.dtype == np.int64:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=0)


@pytest.mark.parametrize("specials", [False, True], ids=["finite", "nan-inf"])
@pytest.mark.parametrize("name", ALL)
def test_merging_two_states_gives_the_whole_range(name, specials, rng):
    red = reductions.get(name)
    M = 9
    v = _values(rng, red, M, specials)
    opts = _opts(red, M)
    want = red.ref(v, opts)
    for k in (0, 1, 4, M):
        a, b = red.partial(v[:, :k], opts, 0), red.partial(v[:, k:], opts, k)
        _same(red.finalize(red.merge(a, b, opts), opts), want)
        ta = [torch.from_numpy(x) for x in a]
        tb = [torch.from_numpy(x) for x in b]
        _same(red.finalize(red.merge(ta, tb, opts), opts), want)


@pytest.mark.parametrize("name", ALL)
def test_the_reference_splits_j_without_changing_results(name, rng, monkeypatch):
    red = reductions.get(name)
    x, y, b = rng.standard_normal((7, 2)), rng.standard_normal((40, 2)), rng.random((40, 2))
    d2 = -Vi(x).sqdist(Vj(y))
    F = d2.concat(Vj(b)) if red.weighted else (d2 if red.name.startswith(("log", "max_s"))
                                               else d2.concat(Vi(x) * Vj(y)))
    data = [v.data for v in F.variables]
    cats = [v.cat for v in F.variables]
    opts = {"K": 3} if red.needs_k else {}
    whole = reference.reduce(F.formula, data, cats, (), 7, 40, name, opts)
    monkeypatch.setenv("LAZYTENSOR_REF_CHUNK", "20")  # chunks of a few columns
    assert reference._chunks(40, F.formula.dim)[1] < 40
    split = reference.reduce(F.formula, data, cats, (), 7, 40, name, opts)
    for s, w in zip(split, whole):
        if w.dtype == np.int64:
            np.testing.assert_array_equal(s, w)
        else:
            np.testing.assert_allclose(s, w, rtol=1e-12)


def test_facts_hold_together():
    for red in reductions.all_reductions():
        outs = red.outputs(3, {"K": 2})
        assert 1 <= red.user_outputs <= len(outs), red.name
        if red.arg_variant:
            variant = reductions.get(red.arg_variant)
            assert variant.gradient == "gather" and variant.outputs(3, {"K": 2})[0] == outs[0]
        if red.gradient == "gather":
            assert [o.kind for o in outs] == ["value", "index"], red.name
        if red.weighted_variant:
            assert reductions.get(red.weighted_variant).weighted
        if red.fusable:
            assert red.gradient == "sum", red.name
        assert reductions.get(red.keops_name or red.name) is red
    assert reductions.get("Min_ArgMin_Reduction") is reductions.get("min_argmin")
