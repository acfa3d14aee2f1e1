"""The peers suite's plumbing (benchmarks/peers.py), at tiny sizes: every contender's result
against float64, missing packages skipped with a note, the expert loop's accuracy on 10^6-term
sums, and the operation count behind the floor. No timing is asserted.

torch.compile runs here with its "eager" backend (inductor's compile alone would take most of
the time allowed): the sum-over-j form, its row blocks and padding are what is checked.
"""

from __future__ import annotations

import argparse

import pytest
import torch

from benchmarks import floor, peer_contenders, peers
from benchmarks.bench import _plan

SMALL = [peers.Workload("gauss", 3, 200, 300), peers.Workload("gauss", 64, 200, 150),
         peers.Workload("knn", 3, 200, 300), peers.Workload("knn", 64, 200, 150),
         peers.Workload("lse", 3, 200, 300), peers.Workload("grad", 3, 200, 300)]


@pytest.fixture(scope="module")
def expert():
    from benchmarks.expert import ExpertLoops

    return ExpertLoops()


@pytest.mark.parametrize("w", SMALL, ids=lambda w: f"{w.kind}-D{w.D}")
def test_every_contender_matches_float64(w, expert, rng):
    res = peers.measure(w, rounds=1, budget=60, threads=2, expert=expert,
                        compile_backend="eager", seed=int(rng.integers(2**31)))
    names = {"lazytensor", "torch dense", "torch.compile (eager)", "JAX", "numba"}
    if w.kind == "knn":
        names.add("faiss IndexFlatL2")
    if w.D == 3 and w.kind in ("gauss", "grad"):
        names.add("expert C loop")
    if w.kind == "lse" and w.D != 3:
        names.discard("numba")
    assert names <= set(res), res
    for name, r in res.items():
        if isinstance(r, str):  # only a missing optional package may skip
            assert r.startswith("skipped:") and name in ("numba", "JAX", "faiss IndexFlatL2"), r
            continue
        assert r["ok"], (name, r)
        assert r["time"] > 0


def test_the_error_sees_a_wrong_result():
    w = peers.Workload("gauss", 3, 50, 80)
    data = peers.make_data(w, 3)
    ref = peers.reference(w, data, rows=20)
    good = peer_contenders.torch_dense("gauss", data["x"], data["y"], data["b"], data["s2"])
    assert peers.error(w, good, ref) < 1e-5
    assert peers.error(w, good * 1.001, ref) > 5e-4
    wk = peers.Workload("knn", 3, 50, 80)
    ind = peer_contenders.torch_dense("knn", data["x"], data["y"], data["b"], data["s2"])
    refk = peers.reference(wk, data, rows=20)
    assert peers.error(wk, ind, refk) == 0
    assert peers.error(wk, torch.full_like(ind, 7), refk) > 1e-3


def test_missing_packages_are_skipped_with_a_note(monkeypatch):
    for name in ("numba", "jax", "faiss"):
        monkeypatch.setitem(peer_contenders.OPTIONAL, name, "no_such_module_for_the_peers_test")
    w = peers.Workload("knn", 3, 40, 50)
    res = peers.measure(w, rounds=1, budget=60, threads=1, compile_backend="eager")
    for name in ("numba", "JAX", "faiss IndexFlatL2"):
        assert res[name].startswith("skipped: no_such_module_for_the_peers_test not importable")
    assert res["lazytensor"]["ok"] and res["torch dense"]["ok"]


@pytest.mark.parametrize("fused", [False, True], ids=["value", "value+gradient"])
def test_expert_loop_within_1e6_of_float64_on_a_million_terms(fused, expert, rng):
    gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
    M, s2 = 10**6, 0.03
    x, y = torch.rand(4, 3, generator=gen), torch.rand(M, 3, generator=gen)
    b, g = torch.rand(M, 1, generator=gen), torch.randn(4, generator=gen)
    xd = x.double().requires_grad_(True)
    diff = xd[:, None] - y.double()[None]
    e = torch.exp(-(diff ** 2).sum(-1) / s2)
    ref = e @ b.double()
    (ref[:, 0] * g.double()).sum().backward()
    if fused:
        val, gx = expert.gauss3_grad(x, y, b, s2, g, threads=2)
        # the gradient's terms cancel: its error relative to the sum of their magnitudes
        scale = (2 / s2) * g.double().abs()[:, None] * torch.einsum(
            "ij,ijk->ik", e * b.double()[:, 0], diff.abs()).detach()
        assert ((gx.double() - xd.grad).abs() / scale).max() < 1e-6
    else:
        val = expert.gauss3(x, y, b, s2, threads=2)
    assert ((val.double() - ref.detach()).abs() / ref.detach().abs()).max() < 1e-6


def test_statement_and_formula_counts():
    assert floor.statement_ops("p = p * r + 2.0f / 720.0f") == {"fma": 1, "add": 0}
    assert floor.statement_ops("x = x < -87.6f ? -87.6f : x") == {"fma": 0, "add": 1}
    assert floor.statement_ops("const float n = t - shift") == {"fma": 0, "add": 1}
    assert floor.statement_ops("bits <<= 23") == {"fma": 0, "add": 0}
    exp = {"fma": 10, "add": 2}
    ops, width = floor.formula_ops(
        "mul(exp(mul(neg(sum(mul(sub(Vi(0,3), Vj(1,3)), sub(Vi(0,3), Vj(1,3))))), Vi(4,1))), "
        "Vj(3,1))", exp)
    # sub x3 (once), sum(mul) 3, neg 1, mul 1, exp, mul 1
    assert (ops, width) == ({"fma": 3 + 1 + 10 + 1, "add": 3 + 1 + 2}, 1)
    ops, width = floor.formula_ops("concat(slice(sub(Vi(0,3), Vj(1,3)), 0, 1), Vj(2,1))", exp)
    assert (ops, width) == ({"fma": 0, "add": 3}, 2)
    assert floor.floor_pairs_per_s({"fma": 2, "add": 1}, {"fma": 4.0, "add": 1.0,
                                                          "mixed": 6.0}) == 1.0


def test_generated_source_is_counted():
    (src,) = floor.generated_sources("gauss", 3, N=300)
    ops = floor.kernel_ops(src)
    assert floor.exp_ops(src)["fma"] >= 6  # a polynomial of degree >= 6 at float32
    assert ops["fma"] >= 3 + 6 and ops["add"] >= 3 + 1  # the distance, exp, the sum's add


def test_the_bench_plans_the_peers_tables():
    titles = [t for t, _ in _plan(argparse.Namespace(suite="peers", quick=True))]
    assert titles[0] == "limit" and len(titles) == 1 + len(peers.WORKLOADS)
    assert any("k-NN" in t and "D = 64" in t for t in titles)
