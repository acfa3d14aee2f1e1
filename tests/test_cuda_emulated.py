"""The CUDA backend without a GPU: real runtime and driver code over emulated kernels.

:mod:`cuda_emulation` compiles each kernel's CUDA source for the host (the skeleton's
phases run block by block, thread by thread, with the thread count the fake driver
reports) and fakes ``libcuda``. Everything else is the code a GPU run uses: the engine's
CUDA branch, the cache key, ``batch_layout``, ``plan_launch`` (1D and split-j),
``pack_args``, the ctypes driver calls, the context push/pop around them. The results are
compared with the NumPy reference. What stays unverified here: the GPU's execution
itself (shared memory, barriers, the real driver, streams); ``test_cuda_runtime.py``
covers that on a GPU machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types

import cuda_emulation
import numpy as np
import pytest
import torch
from lazytensor.codegen import compilers, ir, ops, reductions
from lazytensor.codegen.render_c import VarSpec
from lazytensor.codegen.render_cuda import MAX_BATCH_DIMS, args_fields
from test_ranges_kernel import _clustered_pattern, random_ranges

from lazytensor import LazyTensor, Pm, Vi, Vj, cuda_driver, cuda_runtime, engine, runtime
from lazytensor.ranges import BlockRanges

pytestmark = pytest.mark.skipif(cuda_emulation.cxx() is None, reason="no C++ compiler")

A = ops.apply
THREADS = 32  # what the fake driver reports as the kernels' thread limit
SMS = 2  # multiprocessors of the fake device: few rows already take the split-j scheme


@pytest.fixture
def fake_gpu(monkeypatch):
    """Route CPU torch tensors through the CUDA backend, over the fake driver."""
    monkeypatch.setenv("FAKE_CUDA_MAX_THREADS", str(THREADS))
    monkeypatch.setenv("FAKE_CUDA_SMS", str(SMS))
    drv = cuda_driver.Driver(str(cuda_emulation.fake_libcuda()))
    monkeypatch.setattr(cuda_driver, "_driver", drv)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: types.SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(cuda_runtime, "_table", {})
    monkeypatch.setattr(cuda_runtime, "device_index", lambda device: 0)
    monkeypatch.setattr(cuda_runtime, "_cubin", lambda spec, index: str(
        cuda_emulation.emulated_kernel_library(spec)).encode())
    monkeypatch.setattr(engine, "_resolve_backend",
                        lambda backend, device: "numpy" if backend == "numpy" else "cuda")
    yield drv
    assert drv.lib.fake_context_depth() == 0  # every push was popped


def _close(got, want, rtol):
    got = got.detach().numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    if want.dtype == np.int64:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * 1e-3)


def _both(fn, *args):
    """fn(backend) on the emulated CUDA backend and on the NumPy reference."""
    return fn("auto", *args), fn("numpy", *args)


# ---------------------------------------------------------------- every reduction, both schemes

REDUCTIONS = sorted({r.name for r in reductions.REDUCTIONS.values()})


def _call(name, x, y, b, backend, ranges=None):
    d2 = Vi(x).sqdist(Vj(y))
    K = 3
    if name in ("logsumexp_weight", "sumsoftmaxweight"):
        F = (-d2).concat(Vj(b))
    elif name in ("logsumexp", "max_sumshiftexp"):
        F = -d2
    else:
        F = (-d2).exp().concat(Vi(x) * Vj(y))  # dimension 4
    red = reductions.get(name)
    opts = {"K": K} if name in ("kmin", "argkmin", "kmin_argkmin") else {}
    return engine.reduce(F.formula, F.variables, red.name, 1, opts, backend, ranges=ranges)


@pytest.mark.parametrize("name", REDUCTIONS)
@pytest.mark.parametrize("N, M", [(70, 50), (5, 3000)], ids=["1d", "split"])
def test_reduction_matches_reference(fake_gpu, name, N, M, rng):
    x = torch.from_numpy(rng.standard_normal((N, 3)))
    y = torch.from_numpy(rng.standard_normal((M, 3)))
    b = torch.from_numpy(rng.standard_normal((M, 2)))
    launches = fake_gpu.lib.fake_launches()
    got, want = _both(lambda be: _call(name, x, y, b, be))
    for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        _close(g, w, 1e-10)
    split = cuda_runtime.plan_launch(N, M, 1, SMS, THREADS, 256, 64).nJC > 1
    assert fake_gpu.lib.fake_launches() - launches == (2 if split else 1)


@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction_with_ranges_matches_reference(fake_gpu, name, rng):
    """Block-sparse: blocks longer than a block of threads, gaps, intervals out of order,
    repeated or empty (the reference itself is checked against dense float64 in
    test_ranges_kernel.py); one launch."""
    N, M = 150, 90
    x = torch.from_numpy(rng.standard_normal((N, 3)))
    y = torch.from_numpy(rng.standard_normal((M, 3)))
    b = torch.from_numpy(rng.standard_normal((M, 2)))
    ranges = BlockRanges.build(random_ranges(rng, N, M, n_blocks=4), N, M)
    launches = fake_gpu.lib.fake_launches()
    got = _call(name, x, y, b, "auto", ranges)
    assert fake_gpu.lib.fake_launches() - launches == 1
    want = _call(name, x, y, b, "numpy", ranges)
    for g, w in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        _close(g, w, 1e-10)


def test_ranges_with_batch_and_gradients(fake_gpu, rng):
    """The same ranges in every batch element; gradients take the transposed pattern."""
    B, N, M = 2, 70, 80
    ranges, mask = _clustered_pattern(rng, N, M)
    xs = rng.standard_normal((B, N, 1, 2))
    ys, bs = rng.standard_normal((B, 1, M, 2)), rng.standard_normal((B, 1, M, 1))
    x, y, b = (torch.from_numpy(a).float().requires_grad_() for a in (xs, ys, bs))
    out = ((-LazyTensor(x).sqdist(LazyTensor(y))).exp() * LazyTensor(b)).sum(dim=2, ranges=ranges)
    lse = (-LazyTensor(x).sqdist(LazyTensor(y))).logsumexp(dim=1, ranges=ranges)
    g = torch.from_numpy(rng.standard_normal(out.shape)).float()
    ok = torch.from_numpy(mask.any(0))
    grads = torch.autograd.grad((out * g).sum() + lse[..., 0][:, ok].sum(), (x, y, b))
    xd, yd, bd = (torch.from_numpy(a).requires_grad_() for a in (xs, ys, bs))
    d2 = ((xd - yd) ** 2).sum(-1)
    dense = ((torch.exp(-d2) * torch.from_numpy(mask))[..., None] * bd).sum(2)
    ref = torch.logsumexp(torch.where(torch.from_numpy(mask), -d2, -torch.inf), dim=1)
    want = torch.autograd.grad((dense * g.double()).sum() + ref[:, ok].sum(), (xd, yd, bd))
    np.testing.assert_allclose(out.detach().numpy(), dense.detach().numpy(), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(lse[..., 0][:, ok].detach().numpy(),
                               ref[:, ok].detach().numpy(), rtol=1e-4, atol=1e-5)
    for a, w in zip(grads, want):
        np.testing.assert_allclose(a.numpy(), w.numpy(), rtol=1e-3, atol=1e-4)


def test_ranges_pieces_cover_each_block():
    r = BlockRanges.build(random_ranges(np.random.default_rng(1), 300, 40, n_blocks=5), 300, 40)
    p = r.pieces(THREADS)
    assert p[0, 0] == 0 and p[-1, 1] == 300 and np.all(p[1:, 0] == p[:-1, 1])
    assert np.all((p[:, 1] - p[:, 0] <= THREADS) & (p[:, 1] > p[:, 0]))
    for i0, i1, s0, s1 in r.blocks:  # each piece keeps its block's intervals
        inside = (p[:, 0] >= i0) & (p[:, 1] <= i1)
        assert p[inside, 1].max() == i1 and np.all(p[inside, 2:] == (s0, s1))


def test_split_scheme_is_chosen_for_few_rows():
    few = cuda_runtime.plan_launch(5, 3000, 1, SMS, THREADS, 256, 64)
    many = cuda_runtime.plan_launch(70, 50, 1, SMS, THREADS, 256, 64)
    assert few.nJC > 1 and few.merge_grid == 1 and many.nJC == 1


def test_float32_gaussian_and_argkmin(fake_gpu, rng):
    x = torch.from_numpy(rng.random((300, 3), dtype=np.float32))
    y = torch.from_numpy(rng.random((2000, 3), dtype=np.float32))
    b = torch.from_numpy(rng.random((2000, 2), dtype=np.float32))
    got, want = _both(lambda be: ((-Vi(x).sqdist(Vj(y))).exp() * Vj(b)).sum(dim=1,
                                                                      backend=be))
    _close(got, want, 1e-5)
    got, want = _both(lambda be: Vi(x).sqdist(Vj(y)).argKmin(10, dim=1, backend=be))
    _close(got, want, 0)


def test_batched_broadcast_with_parameter(fake_gpu, rng):
    """Batch dims (2, 1, 3) against (1, 4, 1): broadcasting in several directions."""
    x = torch.from_numpy(rng.standard_normal((2, 1, 3, 40, 3)))
    y = torch.from_numpy(rng.standard_normal((1, 4, 1, 30, 3)))
    s = torch.from_numpy(rng.random((2, 4, 1, 1)) + 0.5)
    X = LazyTensor(x[..., :, None, :])
    Y = LazyTensor(y[..., None, :, :])
    S = LazyTensor(s[..., None, None, :])
    got, want = _both(lambda be: (-(X.sqdist(Y)) * S).exp().sum(dim=4, backend=be))
    assert got.shape == (2, 4, 3, 40, 1)
    _close(got, want, 1e-10)
    got, want = _both(lambda be: (X - Y).abs().sum(-1).min_argmin(dim=3, backend=be))
    _close(got[0], want[0], 1e-10)
    _close(got[1], want[1], 0)


def test_large_dimensions_take_the_unstaged_paths(fake_gpu, rng):
    """i-variables above LOCAL_DIM by pointer, j-rows above the shared-memory row limit."""
    x = torch.from_numpy(rng.standard_normal((20, 600)) / 20)
    y = torch.from_numpy(rng.standard_normal((300, 600)) / 20)
    got, want = _both(lambda be: (-Vi(x).sqdist(Vj(y))).exp().sum(dim=1, backend=be))
    _close(got, want, 1e-10)


def test_formula_without_j_variables(fake_gpu, rng):
    x = torch.from_numpy(rng.standard_normal((50, 3)))
    p = torch.from_numpy(rng.standard_normal(3))
    y = torch.from_numpy(rng.standard_normal((7, 1)))
    got, want = _both(lambda be: ((Vi(x) | Pm(p)) + 0 * Vj(y)).sum(dim=1, backend=be))
    _close(got, want, 1e-10)


def test_empty_j_range(fake_gpu, rng):
    x = torch.from_numpy(rng.standard_normal((10, 2)))
    y = torch.zeros((0, 2), dtype=torch.float64)
    got, want = _both(lambda be: Vi(x).sqdist(Vj(y)).sum(dim=1, backend=be))
    _close(got, want, 0)
    got, want = _both(lambda be: Vi(x).sqdist(Vj(y)).min_argmin(dim=1, backend=be))
    _close(got[0], want[0], 0)
    _close(got[1], want[1], 0)


def test_gradients_through_the_cuda_backend(fake_gpu, rng):
    def grads(backend):
        x = torch.from_numpy(rng_x).requires_grad_()
        y = torch.from_numpy(rng_y).requires_grad_()
        out = (-Vi(x).sqdist(Vj(y))).exp().sum(dim=1, backend=backend)
        lse = (-Vi(x).sqdist(Vj(y))).logsumexp(dim=1, backend=backend)
        return torch.autograd.grad((out ** 2).sum() + lse.sum(), [x, y])

    rng_x, rng_y = rng.standard_normal((40, 3)), rng.standard_normal((2500, 3))
    for g, w in zip(grads("auto"), grads("numpy")):
        _close(g, w, 1e-9)


def test_sync_mode(fake_gpu, monkeypatch, rng):
    monkeypatch.setenv("LAZYTENSOR_CUDA_SYNC", "1")
    x = torch.from_numpy(rng.standard_normal((33, 3)))
    got, want = _both(lambda be: Vi(x).sqdist(Vj(x)).sum(dim=1, backend=be))
    _close(got, want, 1e-10)


# ---------------------------------------------------------------- layout and planning


def test_batch_layout_merges_and_drops_dims():
    shapes = [(2, 3, 4, 5, 3), (2, 3, 4, 7, 3), (1, 1, 1, 3)]
    bshape, vbs = cuda_runtime.batch_layout(shapes, ["i", "j", "p"], (2, 3, 4))
    assert bshape == [24] and vbs == [[15], [21], [0]]
    bshape, vbs = cuda_runtime.batch_layout([(2, 1, 4, 5, 3)], ["i"], (2, 1, 4))
    assert bshape == [8] and vbs == [[15]]


def test_batch_layout_too_many_dims():
    n = MAX_BATCH_DIMS + 1
    # alternate broadcasting so that no two neighbours merge
    a = tuple(2 if k % 2 else 1 for k in range(n)) + (5, 1)
    b = tuple(1 if k % 2 else 2 for k in range(n)) + (5, 1)
    with pytest.raises(ValueError, match="batch dimensions"):
        cuda_runtime.batch_layout([a, b], ["i", "j"], (2,) * n)
    bshape, _ = cuda_runtime.batch_layout([a, b], ["i", "i"], (2,) * (n - 1) + (1,))
    assert len(bshape) == n - 1


@pytest.mark.parametrize("N, M, B", [(1, 10**7, 1), (100, 10**6, 3), (10**6, 10**6, 1),
                                     (7, 100, 2), (0, 5, 1), (0, 10**7, 1), (5, 0, 1),
                                     (3000, 10**7, 1)])
def test_plan_launch_covers_every_pair(N, M, B):
    for acc in (16, 2400):
        p = cuda_runtime.plan_launch(N, M, B, 132, 256, 256, acc)
        assert p.nJC >= 1 and p.JC * p.nJC >= M and p.JC * (p.nJC - 1) < max(M, 1)
        assert p.grid == B * -(-N // 256) * p.nJC
        assert p.part_bytes <= 256 << 20 or p.nJC == 1
        if p.nJC > 1:
            assert p.JC % 256 == 0 and p.merge_grid * 256 >= B * N


def test_pack_args_follows_the_struct_layout():
    args = cuda_runtime.pack_args(2, 1, [11, 12], [21], 31, [4, 5], [[6, 7], [0, 8]], 9, 10,
                                  3, 4)
    words = list(args)
    fields = args_fields(2, 1)
    assert len(words) == sum(n for _, n in fields)
    at = {}
    pos = 0
    for name, n in fields:
        at[name] = words[pos: pos + n]
        pos += n
    assert at["vars"] == [11, 12] and at["outs"] == [21] and at["part"] == [31]
    assert at["vbs"][:2] == [6, 7] and at["vbs"][MAX_BATCH_DIMS: MAX_BATCH_DIMS + 2] == [0, 8]
    assert at["bshape"][:3] == [4, 5, 1]
    assert (at["N"], at["M"], at["B"], at["nbd"], at["nJC"], at["JC"]) == (
        [9], [10], [20], [2], [3], [4])
    assert (at["pieces"], at["ivs"], at["npieces"]) == ([0], [0], [0])  # full product
    args = cuda_runtime.pack_args(2, 1, [11, 12], [21], 0, [], [[], []], 9, 10, 1, 10,
                                  (41, 42, 43))
    assert list(args)[-3:] == [41, 42, 43]


# ---------------------------------------------------------------- driver, engine, imports


def test_missing_driver_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no NVIDIA driver found.*install the NVIDIA driver"):
        cuda_driver.Driver("/nonexistent/libcuda.so.1")


def test_driver_init_failure_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("FAKE_CUDA_INIT_ERROR", "100")
    monkeypatch.setenv("LAZYTENSOR_LIBCUDA", str(cuda_emulation.fake_libcuda()))
    monkeypatch.setattr(cuda_driver, "_driver", None)
    with pytest.raises(RuntimeError, match="CUDA_ERROR_NO_DEVICE"):
        cuda_driver.driver()


def test_resolve_backend_for_cuda_tensors():
    assert engine._resolve_backend("auto", "cuda:0") == "cuda"
    assert engine._resolve_backend("cuda", "cuda:1") == "cuda"
    assert engine._resolve_backend("numpy", "cuda:0") == "numpy"
    with pytest.raises(ValueError, match="backend='cpu'"):
        engine._resolve_backend("cpu", "cuda:0")
    with pytest.raises(ValueError, match="needs torch CUDA tensors"):
        engine._resolve_backend("cuda", "cpu")


def test_importing_lazytensor_loads_no_cuda_module():
    code = (
        "import sys, numpy as np, torch\n"
        "import lazytensor\n"
        "from lazytensor import Vi, Vj\n"
        "x = np.random.rand(20, 3)\n"
        "(Vi(x).sqdist(Vj(x))).sum(dim=1, backend='numpy')\n"
        "bad = [m for m in sys.modules if m.startswith(('pycuda', 'lazytensor.cuda'))]\n"
        "assert not bad, bad\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(compilers.nvcc_path() is None, reason="nvcc not found (CUDA toolkit)")
def test_cubin_is_built_once_through_the_cache(monkeypatch, tmp_path):
    """The real build path: key with the device's sm_XX, nvcc, the cache; then a hit."""
    monkeypatch.setenv("LAZYTENSOR_LIBCUDA", str(cuda_emulation.fake_libcuda()))
    monkeypatch.setattr(cuda_driver, "_driver", None)
    x, y = ir.var(0, 3, "i"), ir.var(1, 3, "j")
    spec = runtime.KernelSpec(A("exp", A("neg", A("sum", A("square", A("sub", x, y))))),
                              (VarSpec(0, 3, "i"), VarSpec(1, 3, "j")), "sum", (), "float32")
    calls = []

    original = compilers.compile_cuda

    def counting(*a, **kw):
        calls.append(a[2])
        return original(*a, **kw)

    monkeypatch.setattr(compilers, "compile_cuda", counting)
    first = cuda_runtime._cubin(spec, 0)
    second = cuda_runtime._cubin(spec, 0)
    assert first[:4] == b"\x7fELF" and first == second
    assert calls == ["sm_90"]  # the fake device is compute capability 9.0


def test_missing_nvcc_is_a_clear_error(fake_gpu, monkeypatch):
    def no_nvcc(arch):
        raise compilers.CompilerNotFound("nvcc not found")

    monkeypatch.setattr(compilers, "cuda_identity", no_nvcc)
    monkeypatch.setattr(cuda_runtime, "_cubin", _real_cubin)
    x = torch.rand(5, 3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="install the CUDA toolkit"):
        Vi(x).sqdist(Vj(x)).sum(dim=1)


_real_cubin = cuda_runtime._cubin
