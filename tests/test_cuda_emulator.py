"""The CUDA execution-model emulator itself: barriers, shared memory, races, warps.

Hand-written kernels with known bugs (a missing barrier, a divergent barrier, two blocks
writing one word) must be reported; correct ones must run clean and give CUDA's results.
They go through the real path: nvcc builds the cubin, pycuda loads and launches it on the
fake driver, the emulator runs the same source compiled for the host.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.cuda

SOURCE = r"""
#include <stdint.h>
extern __shared__ __align__(16) unsigned char lt_smem[];
namespace demo {
struct Args { float* out; const float* in; int64_t n; int64_t variant; };

// Block sums by a tree in dynamic shared memory; variant 1 drops the barrier after the
// first store (a race), variant 2 puts a barrier inside `if (t < w)` (divergence).
extern "C" __global__ void __launch_bounds__(256) demo_tree(const Args a) {
  float* s = (float*)lt_smem;
  const int t = threadIdx.x;
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + t;
  s[t] = i < a.n ? a.in[i] : 0.0f;
  if (a.variant != 1) __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (t < w) {
      s[t] += s[t + w];
      if (a.variant == 2) __syncthreads();
    }
    if (a.variant != 2) __syncthreads();
  }
  if (t == 0) a.out[blockIdx.x] = s[0];
}

// A block-scope __shared__ array: each thread reads its neighbour's slot. Variant 1 reads
// before the barrier.
extern "C" __global__ void demo_static(const Args a) {
  __shared__ float slot[128];
  const int t = threadIdx.x;
  slot[t] = a.in[blockIdx.x * blockDim.x + t];
  float v = 0.0f;
  if (a.variant == 1) v = slot[(t + 1) % blockDim.x];
  __syncthreads();
  if (a.variant != 1) v = slot[(t + 1) % blockDim.x];
  a.out[blockIdx.x * blockDim.x + t] = v;
}

// Every block writes out[0] when variant 1 (blocks race on global memory).
extern "C" __global__ void demo_global(const Args a) {
  const int64_t i = a.variant == 1 ? 0 : (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (threadIdx.x == 0 || a.variant == 0) a.out[i] = a.in[i] * 2.0f;
}

// Warp sums with shuffles; lanes beyond the block size keep their own values.
extern "C" __global__ void demo_shfl(const Args a) {
  float v = a.in[threadIdx.x];
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  a.out[threadIdx.x] = v;
}
}  // namespace demo
"""


@pytest.fixture(scope="module")
def module(_gpu_device):
    if not _gpu_device.emulated:
        pytest.skip("emulator self-tests")
    from lazytensor.codegen.cuda.nvcc import compile_cuda

    from lazytensor.backends.cuda import driver

    with tempfile.TemporaryDirectory() as tmp:
        image = compile_cuda(SOURCE, Path(tmp), "sm_90", "demo").read_bytes()
    _gpu_device.emu.register(image, SOURCE)
    drv = driver.pycuda_driver()
    with driver.in_context(0):
        mod = drv.module_from_buffer(image)
    return mod


def _launch(emu, module, name, grid, block, x, out_size, variant, smem=0):
    from lazytensor.backends.cuda import driver

    drv = driver.pycuda_driver()
    emu.clear_failures()
    with driver.in_context(0):
        fn = module.get_function(name)
        fn.prepare("PPqq")
        din, dout = drv.to_device(x), drv.mem_alloc(out_size * 4)
        failed = None
        try:
            fn.prepared_call((grid, 1, 1), (block, 1, 1), dout, din, x.size, variant,
                             shared_size=smem)
            out = np.empty(out_size, np.float32)
            drv.memcpy_dtoh(out, dout)
        except drv.Error as e:
            failed, out = e, None
    report = emu.failures()
    emu.clear_failures()
    emu.lib.fake_cuda_reset()
    return out, report, failed


def test_tree_sum_with_barriers_is_clean_and_exact(_gpu_device, module, rng):
    x = rng.random(1000).astype(np.float32)
    out, report, failed = _launch(_gpu_device.emu, module, "demo_tree", 4, 256, x, 4, 0, 1024)
    assert not report and failed is None
    blocks = np.pad(x, (0, 24)).reshape(4, 256)
    np.testing.assert_allclose(out, blocks.sum(1), rtol=1e-6)


def test_a_missing_barrier_is_a_shared_memory_race(_gpu_device, module, rng):
    x = rng.random(512).astype(np.float32)
    _, report, _ = _launch(_gpu_device.emu, module, "demo_tree", 2, 256, x, 2, 1, 1024)
    assert re.search(r"shared-memory race on lt_smem\+\d+: thread \d+ (writes|reads) it and "
                     r"thread \d+ (wrote|read) it", report), report


def test_a_barrier_inside_a_branch_is_divergence(_gpu_device, module, rng):
    x = rng.random(256).astype(np.float32)
    _, report, failed = _launch(_gpu_device.emu, module, "demo_tree", 1, 256, x, 1, 2, 1024)
    assert "barrier divergence" in report and failed is not None


def test_block_scope_shared_arrays_are_per_block_and_checked(_gpu_device, module, rng):
    x = rng.random(3 * 128).astype(np.float32)
    out, report, _ = _launch(_gpu_device.emu, module, "demo_static", 3, 128, x, 3 * 128, 0)
    assert not report
    want = np.roll(x.reshape(3, 128), -1, axis=1).ravel()
    np.testing.assert_array_equal(out, want)
    _, report, _ = _launch(_gpu_device.emu, module, "demo_static", 3, 128, x, 3 * 128, 1)
    assert "shared-memory race on __shared__" in report, report


def test_blocks_writing_one_word_race_on_global_memory(_gpu_device, module, rng):
    x = rng.random(4 * 64).astype(np.float32)
    out, report, _ = _launch(_gpu_device.emu, module, "demo_global", 4, 64, x, 4 * 64, 0)
    assert not report
    np.testing.assert_array_equal(out, 2 * x)
    _, report, _ = _launch(_gpu_device.emu, module, "demo_global", 4, 64, x, 4 * 64, 1)
    assert "global-memory race" in report and "block 1" in report, report


def test_warp_shuffles(_gpu_device, module):
    x = np.arange(64, dtype=np.float32)
    out, report, _ = _launch(_gpu_device.emu, module, "demo_shfl", 1, 64, x, 64, 0)
    assert not report
    np.testing.assert_array_equal(out[:32], np.full(32, x[:32].sum()))
    np.testing.assert_array_equal(out[32:], np.full(32, x[32:].sum()))

