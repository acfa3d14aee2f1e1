"""CUDA code generation: every op and every reduction compiles with nvcc for sm_90.

No GPU is needed (nvcc only); the tests are skipped where nvcc is absent. nvcc costs
seconds per invocation, so kernels are rendered with distinct names and concatenated:
one ``.cu`` per dtype for the ops (one kernel per op), one per dtype for the reductions
(one kernel per reduction, on a formula using several ops), one for the layout variants
(large dimensions, parameters only, no j-variable, wide sums), and the block-sparse
variants of the reductions and layouts. The files compile concurrently.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from lazytensor.codegen import ir, ops, reductions
from lazytensor.codegen.cuda.nvcc import compile_cuda, nvcc_path
from lazytensor.codegen.cuda.render import render_cuda_kernel, tile_rows
from lazytensor.codegen.render_c import VarSpec

pytestmark = pytest.mark.skipif(nvcc_path() is None, reason="nvcc not found (CUDA toolkit)")

A = ops.apply
ARCH = "sm_90"
DTYPES = ("float32", "float64")

# Variables of the op formulas: x (i, 3), y (j, 3), s (i, 1), t (j, 1), m (j, 6), p (param, 3).
X, Y, S, T_, MAT, P = (ir.var(0, 3, "i"), ir.var(1, 3, "j"), ir.var(2, 1, "i"),
                       ir.var(3, 1, "j"), ir.var(4, 6, "j"), ir.var(5, 3, "p"))
SPECS = [VarSpec(0, 3, "i"), VarSpec(1, 3, "j"), VarSpec(2, 1, "i"), VarSpec(3, 1, "j"),
         VarSpec(4, 6, "j"), VarSpec(5, 3, "p")]

# How to use the ops that are not plain elementwise functions of (x - y) or (x, y).
SPECIAL = {
    "ifelse": lambda: A("ifelse", A("sub", X, Y), X, P),
    "clamp": lambda: A("clamp", X, Y, P),
    "pow": lambda: A("add", A("pow", X, params=(2.5,)), A("pow", Y, params=(-3.0,))),
    "expand": lambda: A("expand", A("mul", S, T_), params=(3,)),
    "slice": lambda: A("slice", A("sub", X, Y), params=(1, 2)),
    "pad": lambda: A("pad", X, params=(1, 5)),
    "concat": lambda: A("concat", X, T_),
    "one_hot": lambda: A("one_hot", A("add", S, T_), params=(4,)),
    "matvec": lambda: A("matvec", MAT, X),
    "vecmat": lambda: A("vecmat", X, MAT),
    "tensorprod": lambda: A("tensorprod", X, Y),
    "matmul": lambda: A("matmul", MAT, X, params=(3,)),
    "gather": lambda: A("gather", A("mul", X, Y), params=((2, 0, 0, 1),)),
    "scatter": lambda: A("scatter", A("sub", X, Y), params=((3, 0, 3), 5)),
    "softmax_weight": lambda: A("softmax_weight", A("sub", X, Y), P, params=(True,)),
}


def op_formula(name: str) -> ir.Node:
    """A formula that uses op ``name`` on the variables above."""
    if name in SPECIAL:
        return SPECIAL[name]()
    opdef = ops.get(name)
    if opdef.arity == 1:
        return A(name, A("sub", X, Y))
    if opdef.arity == 2:
        return A(name, X, Y)
    raise AssertionError(f"op {name!r} (arity {opdef.arity}) needs a case in SPECIAL")


def all_ops() -> list[str]:
    return sorted(ops.REGISTRY)


def reduction_names() -> list[str]:
    return sorted({r.name for r in reductions.REDUCTIONS.values()})


def reduction_case(name: str):
    """(formula, opts) for reduction ``name``: a Gaussian-like kernel with a few ops."""
    d2 = A("sum", A("square", A("sub", X, Y)))
    red = reductions.get(name)
    opts = {"K": 3} if name in ("kmin", "argkmin", "kmin_argkmin") else {}
    if getattr(red, "weighted", False):
        return A("concat", A("neg", d2), A("mul", A("exp", A("neg", d2)), MAT)), opts
    if name in ("logsumexp", "max_sumshiftexp"):
        return A("add", A("neg", d2), A("log1p", A("sum", A("mul", P, Y)))), opts
    return A("concat", A("exp", A("neg", d2)), A("sqrt", A("add", d2, S))), opts


def _module(kernels, ranged: bool = False) -> str:
    return "".join(render_cuda_kernel(f, specs, red, opts, dtype, name=name, ranged=ranged)
                   for name, f, specs, red, opts, dtype in kernels)


def _ops_module(dtype):
    return _module([(f"op_{n}", op_formula(n), SPECS, "sum", {}, dtype) for n in all_ops()])


def _reductions_module(dtype, ranged=False):
    kernels = []
    for n in reduction_names():
        f, opts = reduction_case(n)
        kernels.append((f"red_{n}", f, SPECS, n, opts, dtype))
        if n in ("sum", "min_argmin", "kmin_argkmin"):  # Kahan sums, and i/j swapped
            f2 = ir.swap_ij(f)
            specs2 = [VarSpec(v.index, v.dim, {"i": "j", "j": "i"}.get(v.cat, v.cat))
                      for v in SPECS]
            kernels.append((f"swapped_{n}", f2, specs2, n, opts, dtype))
    kernels.append(("kahan", A("exp", A("neg", A("sum", A("square", A("sub", X, Y))))), SPECS,
                    "sum", {"sum_scheme": "kahan_scheme"}, dtype))
    return _module(kernels, ranged)


def _layouts_module(ranged=False):
    """Shapes that take the other code paths: large i (by pointer), large j (unstaged),
    vector sums chunked, wide sums (K @ V, attention)."""
    big_i, big_j = ir.var(0, 784, "i"), ir.var(1, 784, "j")
    w = ir.var(2, 64, "j")
    gauss = A("mul", A("exp", A("neg", A("sum", A("square", A("sub", big_i, big_j))))), w)
    specs = [VarSpec(0, 784, "i"), VarSpec(1, 784, "j"), VarSpec(2, 64, "j")]
    p_only = A("mul", A("sum", A("mul", X, P)), S)  # no j-variable at all
    kernels = [("big_f32", gauss, specs, "sum", {}, "float32"),
               ("big_f64", gauss, specs, "sum", {}, "float64"),
               ("big_kmin", A("sum", A("square", A("sub", big_i, big_j))), specs[:2], "argkmin",
                {"K": 10}, "float32"),
               ("no_j", p_only, [VarSpec(0, 3, "i"), VarSpec(2, 1, "i"), VarSpec(5, 3, "p")],
                "sum", {}, "float64"),
               ("k_at_v", A("mul", A("exp", A("neg", A("sum", A("square", A("sub", X, Y))))),
                            w), SPECS[:2] + [VarSpec(2, 64, "j")], "sum", {}, "float32"),
               ("attention", A("concat", A("sum", A("mul", X, Y)), w),
                SPECS[:2] + [VarSpec(2, 64, "j")], "sumsoftmaxweight", {}, "float64")]
    return _module(kernels, ranged)


MODULES = {
    **{f"ops_{dt}": functools.partial(_ops_module, dt) for dt in DTYPES},
    **{f"reductions_{dt}": functools.partial(_reductions_module, dt) for dt in DTYPES},
    "layouts": _layouts_module,
    # the block-sparse variants (a block of threads per piece, its intervals in tiles)
    "ranged_reductions": functools.partial(_reductions_module, "float32", True),
    "ranged_layouts": functools.partial(_layouts_module, True),
}


@pytest.fixture(scope="module")
def compiled():
    """Compile every module concurrently; name -> cubin path or the exception raised."""
    workdir = Path(tempfile.mkdtemp(prefix="lazytensor-nvcc-"))
    sources = {}
    for name, render in MODULES.items():  # rendering (sympy, registries) stays on one thread
        try:
            sources[name] = render()
        except Exception as e:  # noqa: BLE001 (reported by the test of that module)
            sources[name] = e

    def build(name):
        if isinstance(sources[name], Exception):
            return name, sources[name]
        try:
            return name, compile_cuda(sources[name], workdir, ARCH, name=name, what=name)
        except Exception as e:  # noqa: BLE001
            return name, e

    with ThreadPoolExecutor(max_workers=min(len(MODULES), os.cpu_count() or 2)) as pool:
        yield dict(pool.map(build, MODULES))
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_compiles(compiled, module):
    result = compiled[module]
    if isinstance(result, Exception):
        raise result
    data = result.read_bytes()
    assert data[:4] == b"\x7fELF"


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_kernel_is_in_its_cubin(compiled, dtype):
    """Each op and reduction kernel is present (extern "C": unmangled names)."""
    for module, names in ((f"ops_{dtype}", [f"op_{n}" for n in all_ops()]),
                          (f"reductions_{dtype}", [f"red_{n}" for n in reduction_names()])):
        result = compiled[module]
        if isinstance(result, Exception):
            pytest.skip(f"{module} did not compile")
        data = result.read_bytes()
        for n in names:
            for sym in (f"{n}_reduce", f"{n}_merge", f"{n}_acc"):
                assert sym.encode() + b"\0" in data, sym


def test_every_registered_op_has_a_formula():
    for name in all_ops():
        assert name in op_formula(name).key or any(
            node.op == name for node in ir.topo_order(op_formula(name))), name


def test_every_reduction_has_a_case():
    for name in reduction_names():
        f, opts = reduction_case(name)
        reductions.get(name).check(f.dim, opts)


def test_tile_rows_fit_shared_memory():
    for dims in ([3], [3, 2], [64], [512], [1024], [784, 64]):
        for dtype, size in (("float32", 4), ("float64", 8)):
            specs = [VarSpec(k, d, "j") for k, d in enumerate(dims)]
            rows = tile_rows(specs, dtype)
            assert rows == 0 or rows * sum(dims) * size <= 16384
    assert tile_rows([VarSpec(0, 3, "i")], "float32") == 0  # nothing to stage
