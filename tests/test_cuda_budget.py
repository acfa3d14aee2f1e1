"""The ptxas budget of the reference CUDA kernels (nvcc only, no GPU).

Each reference kernel is compiled for sm_90 to PTX and assembled with ``ptxas -v``. It
fails on any spill or stack frame (local memory), on more than 64 registers for float32
formulas of dimension <= 16 (4 blocks of 256 threads per multiprocessor), and in float32
kernels on f64 instructions inside the pair loops (loop depth >= 2 of the reduce entry,
>= 3 in block-sparse kernels) or on more of them than the per-tile flush and the final
write need. Block-sparse variants of some cases are held to the same budget.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from lazytensor.codegen import ir, ops
from lazytensor.codegen.cuda.nvcc import nvcc_path
from lazytensor.codegen.cuda.ptxas import audit, entry_body, f64_by_depth, loop_depths
from lazytensor.codegen.cuda.render import render_cuda_kernel
from lazytensor.codegen.render_c import VarSpec

pytestmark = pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found (CUDA toolkit)")

A = ops.apply


def _xy(D):
    return ir.var(0, D, "i"), ir.var(1, D, "j"), [VarSpec(0, D, "i"), VarSpec(1, D, "j")]


def gaussian(D, E=1, dtype="float32"):
    x, y, specs = _xy(D)
    k = A("exp", A("neg", A("sum", A("square", A("sub", x, y)))))
    b = ir.var(2, E, "j")
    return A("mul", k, b), specs + [VarSpec(2, E, "j")], "sum", {}, dtype


def sqdist(D, reduction, opts):
    x, y, specs = _xy(D)
    return A("sum", A("square", A("sub", x, y))), specs, reduction, opts, "float32"


def lse(D, weight=0):
    x, y, specs = _xy(D)
    f = A("neg", A("sum", A("square", A("sub", x, y))))
    if not weight:
        return f, specs, "logsumexp", {}, "float32"
    w = ir.var(2, weight, "j")
    return A("concat", f, w), specs + [VarSpec(2, weight, "j")], "sumsoftmaxweight", {}, \
        "float32"


def attention(D, E):
    x, y, specs = _xy(D)
    v = ir.var(2, E, "j")
    return (A("concat", A("sum", A("mul", x, y)), v), specs + [VarSpec(2, E, "j")],
            "sumsoftmaxweight", {}, "float32")


CASES = {
    "gaussian_d3": gaussian(3),
    "gaussian_d3_e2": gaussian(3, 2),
    "gaussian_d16": gaussian(16),
    "gaussian_d64": gaussian(64),
    "gaussian_d256": gaussian(256),
    "gaussian_d784": gaussian(784),
    "gaussian_d3_f64": gaussian(3, dtype="float64"),
    "k_at_v_e64": gaussian(3, 64),
    "attention_d64_e64": attention(64, 64),
    "argkmin_k10_d3": sqdist(3, "argkmin", {"K": 10}),
    "argkmin_k10_d784": sqdist(784, "argkmin", {"K": 10}),
    "min_argmin_d3": sqdist(3, "min_argmin", {}),
    "logsumexp_d3": lse(3),
    "softmax_d3_w2": lse(3, 2),
}
# block-sparse variants: the same budget (their pair loops sit one loop deeper, inside the
# loop over a piece's intervals)
RANGED = {f"ranged_{name}": CASES[name] for name in (
    "gaussian_d3", "gaussian_d3_f64", "gaussian_d784", "k_at_v_e64", "attention_d64_e64",
    "argkmin_k10_d3", "logsumexp_d3")}
CASES.update(RANGED)


@pytest.fixture(scope="module")
def audits():
    def one(name):
        f, specs, red, opts, dtype = CASES[name]
        try:
            src = render_cuda_kernel(f, specs, red, opts, dtype, name="lt",
                                     ranged=name in RANGED)
            return name, audit(src)
        except Exception as e:  # noqa: BLE001 (reported by the case's test)
            return name, e

    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 2)) as pool:
        return dict(pool.map(one, CASES))


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_kernel_fits_its_budget(audits, name):
    result = audits[name]
    if isinstance(result, Exception):
        raise result
    formula, _, _, _, dtype = CASES[name]
    res = result["resources"]
    for entry in ("lt_reduce", "lt_merge"):
        r = res[entry]
        assert r["spill_stores"] == r["spill_loads"] == 0, (entry, r)
        assert r["stack"] == 0, (entry, r)  # no local memory
    widest = max(n.dim for n in ir.topo_order(formula) if n.op == "var")
    if dtype == "float32" and widest <= 16:
        assert res["lt_reduce"]["registers"] <= 64, res["lt_reduce"]
    if dtype == "float32":
        f64 = f64_by_depth(result["ptx"], "lt_reduce")
        pair_depth = 3 if name in RANGED else 2
        in_loops = [ins for depth, ins in f64 if depth >= pair_depth]
        assert not in_loops, f"f64 instructions in the pair loops: {in_loops[:8]}"
        assert len(f64) <= 8 * formula.dim + 8, f64  # the per-tile flush and the write


def test_the_depth_rule_sees_the_pair_loop(audits):
    """The direct kernel's pair loop is at depth 2 (so the f64 rule is not vacuous)."""
    ptx = audits["gaussian_d3"]["ptx"]
    assert max(loop_depths(entry_body(ptx, "lt_reduce"))) >= 2
    ptx = audits["ranged_gaussian_d3"]["ptx"]  # intervals, tiles, pairs
    assert max(loop_depths(entry_body(ptx, "lt_reduce"))) >= 3
