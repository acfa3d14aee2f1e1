"""Formulas with large values: every one runs correctly or is refused before compiling.

A CPU kernel keeps each formula node's value in a local array; values too large for a
thread's stack go to a per-thread heap buffer (codegen.footprint), and what still does
not fit is refused with a ValueError before anything is compiled (runtime.check_stack,
sized by codegen.cpu.stack). Each case runs in a forked child, so that a crash fails the
test instead of ending the run. The fuzz test draws random formulas whose intermediate
values are large (``LAZYTENSOR_HYPOTHESIS_EXAMPLES`` raises its CI count of 12).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest
from conftest import ChildError, run_in_child
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from lazytensor.codegen import ir, ops
from lazytensor.codegen.compilers import cpu_compiler
from lazytensor.codegen.cpu import kernel as cpu_kernel
from lazytensor.codegen.cpu.kernel import render_cpu_kernel
from lazytensor.codegen.cpu.stack import cpu_kernel_memory
from lazytensor.codegen.footprint import MAX_NODE_DIM, FormulaTooLarge
from lazytensor.codegen.render_c import VarSpec

from lazytensor import Genred, Vi, Vj
from lazytensor.backends.cpu import runtime
from lazytensor.engine import plans as engine

needs_compiler = pytest.mark.skipif(not cpu_compiler().available, reason="no C++ compiler")
pytestmark = needs_compiler


# ------------------------------------------------------------------ the reported crashes


def _tensorprod_sum():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((50, 1024)), rng.standard_normal((60, 1024))
    g = Genred("Sum(TensorProd(x,y))", ["x=Vi(1024)", "y=Vj(1024)"], "Sum", axis=1)
    got = g(x, y)[:, 0]
    ref = x.sum(1) * y.sum(1).sum()
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _gaussian_600k():
    rng = np.random.default_rng(2)
    D = 600_000
    x, y = 1e-3 * rng.standard_normal((4, D)), 1e-3 * rng.standard_normal((5, D))
    got = (-Vi(x).sqdist(Vj(y))).exp().sum(1)[:, 0]
    ref = np.exp(-((x[:, None] - y[None]) ** 2).sum(-1)).sum(1)
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _forty_one_hots():
    rng = np.random.default_rng(3)
    xi = rng.integers(0, 100, (10, 1)).astype(float)
    yj = rng.standard_normal((12, 1))
    f = None
    for k in range(40):
        t = (Vi(xi) + k).one_hot(65536).sum()
        f = t if f is None else f + t
    got = (f * Vj(yj)).sum(1)[:, 0]
    ref = 40 * yj.sum()
    return float(np.abs(got - ref).max() / abs(ref))


@pytest.mark.parametrize("case", [_tensorprod_sum, _gaussian_600k, _forty_one_hots],
                         ids=["tensorprod_1024x1024", "gaussian_D600k_float64", "40_one_hots_65536"])
def test_formulas_with_large_intermediate_values_run(case):
    assert run_in_child(case) < 1e-10


def _row_value_of_900():
    rng = np.random.default_rng(4)
    a, b, c = rng.standard_normal((3, 3)), rng.standard_normal((3, 300)), rng.standard_normal((3, 1))
    got = Vi(a).tensorprod(Vi(b)).concat(Vi(c)).sum(dim=1)
    ref = np.concatenate([np.einsum("ia,ib->iab", a, b).reshape(3, 900), c], 1)
    return float(np.abs(got - ref).max())


def test_large_row_values_are_stored_aligned():
    """g++ 12 stored this 900-component row value with aligned AVX moves into a stack slot
    that was only 16-byte aligned (a segfault, found by the random formulas below): node
    arrays of 32 bytes or more are declared ``alignas(64)``."""
    assert run_in_child(_row_value_of_900) == 0.0


# ------------------------------------------------------------------ the estimate


def _frames(source: str) -> list[tuple[int, str]]:
    """(bytes, function) of every stack frame g++ reports for ``source`` (-fstack-usage)."""
    c = cpu_compiler()
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "k.cpp"), "w") as f:
            f.write(source)
        subprocess.run([*c.argv, *c.flags(), "-fstack-usage", "k.cpp", "-o", "k.so", *c.libs()],
                       cwd=d, check=True, capture_output=True)
        (su,) = [n for n in os.listdir(d) if n.endswith(".su")]
        with open(os.path.join(d, su)) as f:
            rows = [line.rstrip("\n").split("\t") for line in f]
    return [(int(n), where) for where, n, _kind in rows]


def _v(k, d, cat):
    return ir.var(k, d, cat), VarSpec(k, d, cat)


def _estimate_cases():
    A = ops.apply
    (x3, sx3), (y3, sy3) = _v(0, 3, "i"), _v(1, 3, "j")
    (x64, sx64), (y64, sy64) = _v(0, 64, "i"), _v(1, 64, "j")
    (b64, sb64) = _v(2, 64, "j")
    (xb, sxb), (yb, syb) = _v(0, 1024, "i"), _v(1, 1024, "j")
    (xs, sxs), (ys, sys_) = _v(0, 1, "i"), _v(1, 1, "j")
    gauss = A("exp", A("neg", A("sum", A("square", A("sub", x3, y3)))))
    d64 = A("neg", A("sum", A("square", A("sub", x64, y64))))
    return {
        "gaussian_D3": (gauss, [sx3, sy3], "sum", {}),
        "output_of_20000": (A("mul", ir.var(0, 20000, "i"), ir.var(1, 20000, "j")),
                            [VarSpec(0, 20000, "i"), VarSpec(1, 20000, "j")], "sum", {}),
        "argKmin_60_of_1000": (A("sub", ir.var(0, 1000, "i"), ir.var(1, 1000, "j")),
                               [VarSpec(0, 1000, "i"), VarSpec(1, 1000, "j")], "argkmin",
                               {"K": 60}),
        "logsumexp_D64_dots": (d64, [sx64, sy64], "logsumexp", {}),
        "tensorprod_on_the_heap": (A("sum", A("tensorprod", xb, yb)), [sxb, syb], "sum", {}),
        "one_hot_on_the_heap": (A("sum", A("one_hot", A("add", xs, ys), params=(65536,))),
                                [sxs, sys_], "sum", {}),
        "K_at_V_64": (A("mul", gauss, b64), [sx3, sy3, sb64], "sum", {}),
        "softmax_of_64": (A("concat", A("neg", A("sum", A("square", A("sub", x3, y3)))), b64),
                          [sx3, sy3, sb64], "sumsoftmaxweight", {}),
    }


@pytest.mark.parametrize("name", list(_estimate_cases()))
def test_stack_estimate_bounds_what_the_compiler_reports(name):
    """The sum of every frame g++ lays out (a bound on any chain of calls) stays within
    the estimate, so a kernel the check lets through fits the stack it was sized for (the
    block-sparse kernel as well, with its interval loop or gathering chunk loop)."""
    formula, specs, reduction, opts = _estimate_cases()[name]
    for dtype, ranged in (("float32", False), ("float64", False), ("float32", True)):
        frames = _frames(render_cpu_kernel(formula, specs, reduction, opts, dtype,
                                           ranged=ranged))
        used = sum(n for n, _ in frames)
        estimate = cpu_kernel_memory(formula, specs, reduction, opts, dtype,
                                     ranged=ranged).stack
        assert used <= estimate, (dtype, ranged, used, estimate, sorted(frames)[-3:])


def test_large_values_leave_the_stack_for_the_heap():
    formula, specs, reduction, opts = _estimate_cases()["tensorprod_on_the_heap"]
    mem = cpu_kernel_memory(formula, specs, reduction, opts, "float64")
    assert mem.heap == 8 * 1024 * 1024 and mem.stack < 1 << 20
    src = render_cpu_kernel(formula, specs, reduction, opts, "float64")
    assert "lt_heap.p + 0;  // tensorprod" in src and "lt_heap.reserve(1048576)" in src
    small = _estimate_cases()["gaussian_D3"]
    assert "lt_heap" not in render_cpu_kernel(*small, "float32")


# ------------------------------------------------------------------ refusals


@pytest.fixture
def no_build(monkeypatch):
    """Any attempt to build or load a CPU kernel fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a kernel was built: the formula should have been refused first")

    monkeypatch.setattr(runtime, "kernel_binary", refuse)


def test_an_output_too_large_for_the_stack_is_refused_before_compiling(no_build):
    x, y = np.ones((2, 400_000), np.float32), np.ones((3, 400_000), np.float32)
    with pytest.raises(ValueError, match=r"formula too large.*MB of stack per thread"):
        (Vi(x) * Vj(y)).sum(dim=1)


def test_a_value_too_large_for_int_loops_is_refused_before_compiling(no_build):
    x, y = np.ones((1, 65536)), np.ones((2, 65536))
    with pytest.raises(FormulaTooLarge, match=r"tensorprod.*4294967296 components") as info:
        Vi(x).tensorprod(Vj(y)).sum().sum(dim=1)
    assert str(MAX_NODE_DIM) in str(info.value)


def test_values_beyond_the_heap_budget_are_refused_before_compiling(no_build):
    x, y = np.ones((1, 20000)), np.ones((2, 20000))  # a value of 400 M doubles
    with pytest.raises(ValueError, match=r"needs 3051 MB per thread for its intermediate"):
        Vi(x).tensorprod(Vj(y)).sum().sum(dim=1)


def test_a_kernel_is_planned_once_when_built_and_not_at_all_when_read_from_disk(
        monkeypatch, rng, tmp_path):
    """The stack check and the render read one plan of the kernel; a kernel found on disk
    is checked against the stack from its cache entry's metadata, with no plan at all."""
    plans = []
    plan = cpu_kernel.cpu_kernel_shape

    def counting(*args, **kwargs):
        plans.append(args[2])  # the reduction
        return plan(*args, **kwargs)

    monkeypatch.setattr(cpu_kernel, "cpu_kernel_shape", counting)
    monkeypatch.setenv("LAZYTENSOR_CACHE_DIR", str(tmp_path / "cache"))  # nothing on disk yet
    x, y, b = rng.standard_normal((30, 64)), rng.standard_normal((40, 64)), rng.standard_normal((40, 2))
    scale = float(rng.uniform(0.01, 0.02))
    want = np.exp(-scale * ((x[:, None] - y[None]) ** 2).sum(-1)) @ b

    def fresh_process():  # what a new process starts with: no plans, no loaded kernels
        monkeypatch.setattr(engine, "_plans", engine.PlanCache(8))
        monkeypatch.setattr(runtime, "_table", {})
        runtime.planned_shape.cache_clear()

    for expected in (["sum"], []):  # built (and stored), then read from disk
        fresh_process()
        plans.clear()
        got = (-Vi(x).sqdist(Vj(y)) * scale).exp() @ b
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
        assert plans == expected


def test_the_budget_follows_the_threads_stack_size(monkeypatch):
    monkeypatch.setenv("OMP_STACKSIZE", "1M")
    assert runtime.stack_budget() == 3 << 18
    monkeypatch.setenv("OMP_STACKSIZE", "512")  # kilobytes without a unit
    assert runtime.stack_budget() == 3 << 17
    monkeypatch.delenv("OMP_STACKSIZE")
    assert runtime.stack_budget() <= 6 << 20


def test_openmp_workers_with_small_stacks_get_a_refusal_not_a_crash(tmp_path):
    """With OMP_STACKSIZE=1M the worker threads have 1 MB: a kernel sized for 8 MB would
    overflow them; it is refused with the stack it needs and the stack there is."""
    code = textwrap.dedent("""
        import numpy as np
        from lazytensor import Vi, Vj
        x, y = np.ones((64, 30000), np.float32), np.ones((4096, 30000), np.float32)
        try:
            (Vi(x[:, :1]) * Vj(y)).sum(dim=1)
        except ValueError as e:
            print("refused:", e)
    """)
    env = {**os.environ, "OMP_STACKSIZE": "1M", "LAZYTENSOR_NUM_THREADS": "2"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused: formula too large" in proc.stdout and "at most 0.8 MB here" in proc.stdout


# ------------------------------------------------------------------ random formulas

_LOCAL = os.environ.get("LAZYTENSOR_HYPOTHESIS_EXAMPLES")
FUZZ = settings(max_examples=int(_LOCAL or 12), deadline=None, derandomize=False,
                print_blob=True, suppress_health_check=[HealthCheck.too_slow,
                                                        HealthCheck.data_too_large])
MAX_VALUE = 1 << 19  # components of one value: the NumPy reference holds N*M of them
LEAF_DIMS = (1, 3, 17, 300, 1024)


@st.composite
def big_formulas(draw, budget: int = 6):
    """(text, builder) of a random formula of vectors, some of them large: builder maps
    the leaves {(cat, dim): LazyTensor} to the formula's LazyTensor."""
    def leaf(dim):
        cat = draw(st.sampled_from("ij"))
        return f"V{cat}[{dim}]", lambda L: L[(cat, dim)]

    def grow(depth):
        if depth == 0 or draw(st.integers(0, 4)) == 0:
            dim = draw(st.sampled_from(LEAF_DIMS))
            return (*leaf(dim), dim)
        kind = draw(st.sampled_from(["tensorprod", "one_hot", "expand", "concat", "unary",
                                     "binary", "sum", "matvec"]))
        ta, fa, da = grow(depth - 1)
        if kind == "tensorprod":
            tb, fb, db = grow(depth - 1)
            if da * db > MAX_VALUE:
                return ta, fa, da
            return f"tensorprod({ta}, {tb})", lambda L: fa(L).tensorprod(fb(L)), da * db
        if kind in ("one_hot", "expand"):
            D = draw(st.sampled_from([1000, 40000, 200000, MAX_VALUE]))
            scalar = (lambda L: fa(L).sum() * (1 / da)) if da > 1 else fa  # the mean
            if kind == "one_hot":  # at the rounded value of 7 |a|: some 1s
                return (f"one_hot({ta}, {D})",
                        lambda L: (scalar(L).abs() * 7).round().one_hot(D), D)
            return (f"expand({ta}, {D})",
                    lambda L: scalar(L).sin()._op("expand", params=(D,)), D)
        if kind == "concat":
            tb, fb, db = grow(depth - 1)
            if da + db > MAX_VALUE:
                return ta, fa, da
            return f"concat({ta}, {tb})", lambda L: fa(L).concat(fb(L)), da + db
        if kind == "unary":
            name = draw(st.sampled_from(["sin", "cos", "tanh", "abs", "square"]))
            return f"{name}({ta})", lambda L: getattr(fa(L), name)(), da
        if kind == "binary":
            tb, fb, db = grow(depth - 1)
            if db not in (1, da) and da != 1:
                return ta, fa, da
            name = draw(st.sampled_from(["__add__", "__sub__", "__mul__"]))
            return f"{name}({ta}, {tb})", lambda L: getattr(fa(L), name)(fb(L)), max(da, db)
        if kind == "sum":  # the mean, as the values' magnitude does not grow with D
            return f"mean({ta})", lambda L: fa(L).sum() * (1 / da), 1
        # matvec: a matrix of the value's dimension times a vector dividing it
        m = draw(st.sampled_from([d for d in LEAF_DIMS if da % d == 0]))
        tb, fb = leaf(m)
        return f"matvec({ta}, {tb})", lambda L: fa(L).matvecmult(fb(L)), da // m

    return grow(draw(st.integers(2, 4)))


def _fuzz_case(text, build, dim, reduction, dtype, seed):
    """In the child: the kernel's result against the NumPy reference, or the refusal."""
    rng = np.random.default_rng(seed)
    N, M = 3, 2
    leaves = {}
    for cat, rows in (("i", N), ("j", M)):
        for d in LEAF_DIMS:
            data = (rng.standard_normal((rows, d)) / np.sqrt(d)).astype(dtype)
            leaves[(cat, d)] = Vi(data) if cat == "i" else Vj(data)
    formula = build(leaves)
    if reduction == "logsumexp":  # a scalar for it: the mean, whose magnitude stays O(1)
        formula = (formula.sum() * (1 / dim)).sin()
    compiled = []
    real = runtime.kernel_binary

    def spy(*args, **kwargs):
        compiled.append(1)
        return real(*args, **kwargs)

    runtime.kernel_binary = spy
    try:
        got = getattr(formula, reduction)(dim=1)
    except ValueError as e:
        if "formula too large" not in str(e) or compiled:
            raise
        return "refused"
    ref = getattr(formula, reduction)(dim=1, backend="numpy")
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if reduction == "argmin":  # (near-)ties may go either way: indices in range
        assert got.shape == ref.shape and ((got >= 0) & (got < M)).all(), text
        return "ran"
    scale = 1.0 + np.abs(ref).max()
    tol = 1e-3 if dtype == np.float32 else 1e-9
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * scale, err_msg=text)
    return "ran"


@FUZZ
@given(big_formulas(), st.sampled_from(["sum", "min", "logsumexp", "argmin"]),
       st.sampled_from([np.float32, np.float64]), st.integers(0, 2**32 - 1))
def test_random_formulas_with_large_values_run_or_are_refused(formula, reduction, dtype, seed):
    text, build, dim = formula
    note(f"{reduction} of {text} (dimension {dim}), {np.dtype(dtype).name}, seed {seed}")
    try:
        outcome = run_in_child(lambda: _fuzz_case(text, build, dim, reduction, dtype, seed))
    except ChildError as e:
        raise AssertionError(f"{reduction} of {text}: {e}") from None
    event(outcome)

