"""The CUDA backend end to end: results against the CPU backend, on a GPU or the emulator.

The ``gpu`` fixture (conftest.py) is the real GPU when torch sees one, else the emulator
(tests/cuda_emulator): the generated kernels run unmodified, one fiber per CUDA thread,
through pycuda over a fake driver, and the emulator's race and barrier checks fail a test.
Skipped only where nvcc is absent. On a GPU machine: ``python -m pytest -m cuda
tests/test_cuda_runtime.py`` (``LAZYTENSOR_TEST_GPU=emulator`` forces the emulator).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from conftest import GPU_REDUCTIONS, assert_gpu_close, gpu_reduction

from lazytensor import LazyTensor, Vi, Vj
from lazytensor.backends.cuda import loader as kernels
from lazytensor.backends.cuda import streams

pytestmark = [pytest.mark.cuda]

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("N, M", [(3000, 2000), (7, 100_000)], ids=["1d", "split"])
@pytest.mark.parametrize("name", GPU_REDUCTIONS)
def test_reduction_cuda_matches_cpu(gpu, name, N, M, dtype):
    g = torch.Generator().manual_seed(N + M)
    x = torch.rand(N, 3, generator=g, dtype=dtype)
    y = torch.rand(M, 3, generator=g, dtype=dtype)
    b = torch.randn(M, 2, generator=g, dtype=dtype)
    want = gpu_reduction(name, x, y, b, "cpu")
    got = gpu_reduction(name, gpu.to(x), gpu.to(y), gpu.to(b), "auto")
    assert_gpu_close(gpu, got, want, dtype, x, y)


def test_batched_broadcast(gpu):
    x = torch.randn(2, 1, 3, 500, 1, 3, dtype=torch.float64)
    y = torch.randn(1, 4, 1, 1, 700, 3, dtype=torch.float64)
    s = torch.rand(2, 4, 1, 1, 1, 1, dtype=torch.float64) + 0.5

    def run(x, y, s, backend):
        K = (-LazyTensor(x).sqdist(LazyTensor(y)) * LazyTensor(s)).exp()
        return K.sum(dim=4, backend=backend), K.argmax(dim=3, backend=backend)

    got = run(gpu.to(x), gpu.to(y), gpu.to(s), "cuda")
    want = run(x, y, s, "cpu")
    assert_gpu_close(gpu, got[0], want[0], torch.float64)
    assert_gpu_close(gpu, got[1], want[1], torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_gradients(gpu, dtype):
    x0, y0 = torch.rand(2000, 3, dtype=dtype), torch.rand(3000, 3, dtype=dtype)
    b0 = torch.randn(3000, 2, dtype=dtype)

    def grads(to, backend):
        x, y, b = (to(t).requires_grad_() for t in (x0, y0, b0))
        K = (-Vi(x).sqdist(Vj(y)) * 4).exp()
        loss = ((K * Vj(b)).sum(dim=1, backend=backend) ** 2).sum()
        loss = loss + (-Vi(x).sqdist(Vj(y))).logsumexp(dim=1, backend=backend).sum()
        loss = loss + Vi(x).sqdist(Vj(y)).min(dim=1, backend=backend).sum()
        return torch.autograd.grad(loss, [x, y, b])

    for g, w in zip(grads(gpu.to, "auto"), grads(lambda t: t.clone(), "cpu")):
        assert_gpu_close(gpu, g, w, dtype)


def test_large_dimension_and_knn(gpu):
    # the emulator runs kernels on one CPU core: fewer points, still several blocks
    N, M = (300, 500) if gpu.emulated else (1500, 2500)
    x = torch.randn(N, 784) / 28
    y = torch.randn(M, 784) / 28
    want = Vi(x).sqdist(Vj(y)).argKmin(10, dim=1, backend="cpu")
    got = Vi(gpu.to(x)).sqdist(Vj(gpu.to(y))).argKmin(10, dim=1)
    assert_gpu_close(gpu, got, want, torch.float32, x, y)
    want = (-Vi(x).sqdist(Vj(y))).exp().sum(dim=1, backend="cpu")
    assert_gpu_close(gpu, (-Vi(gpu.to(x)).sqdist(Vj(gpu.to(y)))).exp().sum(dim=1), want,
             torch.float32)


def test_runs_on_the_current_stream(gpu):
    n = 2000 if gpu.emulated else 20000
    x = gpu.to(torch.rand(n, 3))
    y = gpu.to(torch.rand(n, 3))
    want = (-Vi(x).sqdist(Vj(y))).exp().sum(dim=1)
    gpu.synchronize()
    s = gpu.Stream()
    s.wait_stream(gpu.current_stream())
    with gpu.stream(s):
        x2 = x * 1.0  # queued on s: the kernel must run after it
        got = (-Vi(x2).sqdist(Vj(y))).exp().sum(dim=1)
    s.synchronize()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)


def test_numpy_backend_with_cuda_tensors(gpu):
    x = gpu.to(torch.rand(100, 3, dtype=torch.float64))
    got = Vi(x).sqdist(Vj(x)).sum(dim=1, backend="numpy")
    want = Vi(x).sqdist(Vj(x)).sum(dim=1, backend="cuda")
    assert gpu.is_device(got)
    torch.testing.assert_close(got, want)


def test_empty_and_tiny_sizes(gpu):
    x = gpu.to(torch.rand(1, 3, dtype=torch.float64))
    y = gpu.to(torch.rand(0, 3, dtype=torch.float64))
    assert Vi(x).sqdist(Vj(y)).sum(dim=1).cpu().tolist() == [[0.0]]
    assert Vi(x).sqdist(Vj(y)).min(dim=1).cpu().tolist() == [[np.inf]]
    got = Vi(x).sqdist(Vj(x)).sum(dim=1)
    assert got.cpu().tolist() == [[0.0]]


# ---------------------------------------------------------------- NumPy arrays on the GPU


@pytest.mark.parametrize("backend", ["gpu", "GPU", "cuda"])
def test_numpy_arrays_on_the_gpu_come_back_as_numpy(gpu, backend, rng):
    x, y = rng.random((700, 3)), rng.random((900, 3))
    b = rng.standard_normal((900, 2)).astype(np.float32)
    K = (-Vi(x.astype(np.float32)).sqdist(Vj(y.astype(np.float32)))).exp()
    got = (K * Vj(b)).sum(dim=1, backend=backend)
    want = (K * Vj(b)).sum(dim=1, backend="cpu")
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == (700, 2)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
    nn = Vi(x).sqdist(Vj(y)).argKmin(4, dim=1, backend=backend)
    np.testing.assert_array_equal(nn, Vi(x).sqdist(Vj(y)).argKmin(4, dim=1, backend="cpu"))


def test_device_id_picks_the_gpu(gpu, rng):
    from lazytensor import Genred

    if not gpu.emulated and torch.cuda.device_count() < 2:
        pytest.skip("one GPU: device_id=1 has nowhere to go")
    x, y = rng.random((300, 3)), rng.random((400, 3))
    want = Vi(x).sqdist(Vj(y)).min(dim=1, backend="cpu")
    got = Vi(x).sqdist(Vj(y)).min(dim=1, backend="GPU", device_id=1)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    red = Genred("SqDist(x, y)", ["x = Vi(3)", "y = Vj(3)"], "Min", axis=1)
    np.testing.assert_allclose(red(x, y, backend="GPU", device_id=1), want, rtol=1e-12)
    if gpu.emulated:
        devices = {re.search(r"device=(\d)", line).group(1) for line in gpu.emu.launch_log()}
        assert devices == {"1"}
    with pytest.raises(ValueError, match="device_id=7.*CUDA device"):
        Vi(x).sqdist(Vj(y)).min(dim=1, backend="GPU", device_id=7)


# ---------------------------------------------------------------- streams (emulator only)


def _emulator_only(gpu):
    if not gpu.emulated:
        pytest.skip("checks the fake driver's record of streams and launches")


def test_default_stream_launches_on_the_null_stream(gpu, rng):
    _emulator_only(gpu)
    x = torch.from_numpy(rng.random((300, 3)))
    Vi(x).sqdist(Vj(x)).sum(dim=1)
    assert all("stream=null" in line for line in gpu.emu.launch_log())
    assert not gpu.api.log  # no cross-stream waits needed


def test_own_stream_is_ordered_both_ways_with_torchs_stream(gpu, rng):
    """torch on a non-blocking stream s: the kernels run on our stream, after what s had
    queued (held here: the kernel must not run before it is released) and before what s
    queues next (s waits for our stream)."""
    _emulator_only(gpu)
    x = torch.from_numpy(rng.random((300, 3)))
    want = Vi(x).sqdist(Vj(x)).sum(dim=1, backend="cpu")
    s = gpu.Stream()
    count = gpu.emu.lib.fake_cuda_launch_count
    with gpu.stream(s):
        before = count(0)
        with gpu.held(s):
            got = Vi(x).sqdist(Vj(x)).sum(dim=1)
            assert count(0) == before  # still waiting for s
            ours = streams._devices[0].stream.handle
        assert count(0) == before + 1
    s.synchronize()
    torch.testing.assert_close(got, want)
    assert all("stream=null" not in line for line in gpu.emu.launch_log())
    assert gpu.api.log == [("wait", ours, s.cuda_stream), ("wait", s.cuda_stream, ours)]


# ---------------------------------------------------------------- errors


def test_kernel_fault_names_kernel_and_formula_at_the_next_call(gpu, monkeypatch, rng):
    _emulator_only(gpu)
    x = torch.from_numpy(rng.random((300, 3)))
    monkeypatch.setenv("FAKE_CUDA_FAULT", "lt_reduce")
    Vi(x).sqdist(Vj(x)).argmin(dim=1)  # queued; the fault is not known yet
    with pytest.raises(kernels.CudaKernelError,
                       match=r"illegal.*the argmin kernel of .*LAZYTENSOR_CUDA_SYNC"):
        Vi(x).sqdist(Vj(x)).min(dim=1)


def test_sync_mode_reports_the_fault_at_once(gpu, monkeypatch, rng):
    _emulator_only(gpu)
    x = torch.from_numpy(rng.random((300, 3)))
    monkeypatch.setenv("FAKE_CUDA_FAULT", "lt_reduce")
    monkeypatch.setenv("LAZYTENSOR_CUDA_SYNC", "1")
    with pytest.raises(kernels.CudaKernelError, match=r"^the max kernel of sum\(mul\(sub\(Vi.* failed: .*illegal"):
        Vi(x).sqdist(Vj(x)).max(dim=1)


def test_synchronize_reports_a_fault(gpu, monkeypatch, rng):
    import lazytensor.cuda

    _emulator_only(gpu)
    x = torch.from_numpy(rng.random((300, 3)))
    monkeypatch.setenv("FAKE_CUDA_FAULT", "lt_reduce")
    Vi(x).sqdist(Vj(x)).argmax(dim=1)
    with pytest.raises(kernels.CudaKernelError, match="the argmax kernel"):
        lazytensor.cuda.synchronize()


def test_no_build_or_load_during_graph_capture(gpu, rng):
    _emulator_only(gpu)
    x = torch.from_numpy(rng.random((300, 3)))
    want = (Vi(x) - Vj(x)).abs().sum(-1).sum(dim=1)  # built and loaded before the capture
    gpu.api.capturing = True
    try:
        got = (Vi(x) - Vj(x)).abs().sum(-1).sum(dim=1)  # launches: allowed
        with pytest.raises(kernels.CudaKernelError, match="capturing a graph.*once"):
            (Vi(x) - Vj(x)).abs().sum(-1).max(dim=1)  # a new kernel
    finally:
        gpu.api.capturing = False
    torch.testing.assert_close(got, want)


def test_a_refused_cubin_gives_nvcc_and_driver_versions(gpu, monkeypatch, rng):
    _emulator_only(gpu)
    monkeypatch.setenv("FAKE_CUDA_REFUSE_MODULES", "222")
    x = torch.from_numpy(rng.random((30, 3)))
    with pytest.raises(kernels.CudaKernelError,
                       match=r"refused .*UNSUPPORTED_PTX|refused .*toolchain.*nvcc \(Cuda "
                             r"compilation tools, release \d+\.\d.*driver supports CUDA 13\.0"):
        (Vi(x) * Vj(x)).sum(-1).logsumexp(dim=1)


# ---------------------------------------------------------------- kernel schemes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("N, M", [(600, 700), (5, 9000)], ids=["1d", "split"])
def test_wide_sum_k_at_v(gpu, N, M, dtype):
    """K @ V with 40 columns: several threads per row, each a slice of the outputs."""
    g = torch.Generator().manual_seed(N * M)
    x, y = torch.rand(N, 3, generator=g, dtype=dtype), torch.rand(M, 3, generator=g, dtype=dtype)
    v = torch.randn(M, 40, generator=g, dtype=dtype)

    def run(x, y, v, backend):
        return ((-Vi(x).sqdist(Vj(y)) * 3).exp() * Vj(v)).sum(dim=1, backend=backend)

    assert_gpu_close(gpu, run(gpu.to(x), gpu.to(y), gpu.to(v), "auto"), run(x, y, v, "cpu"), dtype)


@pytest.mark.parametrize("N, M", [(200, 300), (5, 9000)], ids=["1d", "split"])
def test_attention_and_weighted_logsumexp_with_wide_values(gpu, N, M):
    g = torch.Generator().manual_seed(N)
    q, k = torch.randn(N, 64, generator=g) / 8, torch.randn(M, 64, generator=g) / 8
    v = torch.randn(M, 40, generator=g)

    def attention(q, k, v, backend):
        return (Vi(q) | Vj(k)).sumsoftmaxweight(Vj(v), dim=1, backend=backend)

    def weighted_lse(q, k, v, backend):
        return (-Vi(q).sqdist(Vj(k))).logsumexp(dim=1, weight=Vj(v.abs() + 0.1),
                                                backend=backend)

    for fn in (attention, weighted_lse):
        assert_gpu_close(gpu, fn(gpu.to(q), gpu.to(k), gpu.to(v), "auto"), fn(q, k, v, "cpu"),
                 torch.float32)


def test_gradients_in_dimension_64(gpu):
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(200, 64, generator=g) / 8, torch.randn(300, 64, generator=g) / 8

    def grads(to, backend):
        x, y = to(q).requires_grad_(), to(k).requires_grad_()
        a = (-Vi(x).sqdist(Vj(y))).exp().sum(dim=1, backend=backend)
        return torch.autograd.grad((a ** 2).sum(), [x, y])

    for got, want in zip(grads(gpu.to, "auto"), grads(lambda t: t.clone(), "cpu")):
        assert_gpu_close(gpu, got, want, torch.float32)


def test_float32_logsumexp_to_cpu_accuracy(gpu):
    """Per-tile partials: float32 log-sum-exp over many terms as accurate as the CPU's."""
    n = 200_000 if gpu.emulated else 2_000_000
    g = torch.Generator().manual_seed(11)
    x, y = torch.rand(4, 1, generator=g), torch.rand(n, 1, generator=g)

    def lse(x, y, backend):
        return (-Vi(x).sqdist(Vj(y))).logsumexp(dim=1, backend=backend)

    exact = lse(x.double(), y.double(), "cpu")
    err_gpu = (lse(gpu.to(x), gpu.to(y), "auto").cpu().double() - exact).abs().max().item()
    err_cpu = (lse(x, y, "cpu").double() - exact).abs().max().item()
    assert err_gpu <= max(4 * err_cpu, 2e-6), (err_gpu, err_cpu)
