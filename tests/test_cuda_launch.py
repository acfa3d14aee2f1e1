"""CUDA launch planning without a GPU: batch layout, the 1D / split-j grid, packed arguments,
the block size from occupancy, and the engine's choice of backend and device."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from lazytensor.codegen.cuda.render import MAX_BATCH_DIMS, args_fields

from lazytensor.backends.cuda import launch
from lazytensor.backends.cuda.driver import DeviceInfo
from lazytensor.backends.cuda.loader import occupancy_threads
from lazytensor.core import backend
from lazytensor.core.batch import batch_layout


def test_batch_layout_merges_and_drops_dims():
    shapes = [(2, 3, 4, 5, 3), (2, 3, 4, 7, 3), (1, 1, 1, 3)]
    bshape, vbs = batch_layout(shapes, ["i", "j", "p"], (2, 3, 4))
    assert bshape == [24] and vbs == [[15], [21], [0]]
    bshape, vbs = batch_layout([(2, 1, 4, 5, 3)], ["i"], (2, 1, 4))
    assert bshape == [8] and vbs == [[15]]


def test_batch_layout_too_many_dims():
    n = MAX_BATCH_DIMS + 1
    # alternate broadcasting so that no two neighbours merge
    a = tuple(2 if k % 2 else 1 for k in range(n)) + (5, 1)
    b = tuple(1 if k % 2 else 2 for k in range(n)) + (5, 1)
    with pytest.raises(ValueError, match="batch dimensions"):
        batch_layout([a, b], ["i", "j"], (2,) * n, MAX_BATCH_DIMS)
    bshape, _ = batch_layout([a, b], ["i", "i"], (2,) * (n - 1) + (1,), MAX_BATCH_DIMS)
    assert len(bshape) == n - 1


@pytest.mark.parametrize("N, M, B", [(1, 10**7, 1), (100, 10**6, 3), (10**6, 10**6, 1),
                                     (7, 100, 2), (0, 5, 1), (0, 10**7, 1), (5, 0, 1),
                                     (3000, 10**7, 1)])
def test_plan_launch_covers_every_pair(N, M, B):
    for acc in (16, 2400):
        p = launch.plan_launch(N, M, B, 132, 256, 256, acc)
        assert p.nJC >= 1 and p.JC * p.nJC >= M and p.JC * (p.nJC - 1) < max(M, 1)
        assert p.grid == B * -(-N // 256) * p.nJC
        assert p.part_bytes <= 256 << 20 or p.nJC == 1
        if p.nJC > 1:
            assert p.JC % 256 == 0 and p.merge_grid * 256 >= B * N


def test_pack_args_follows_the_struct_layout():
    args = launch.pack_args(2, 1, [11, 12], [21], 31, [4, 5], [[6, 7], [0, 8]], 9, 10,
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
    words = launch.pack_args(2, 1, [11, 12], [21], 0, [], [[], []], 9, 10, 1, 10,
                             (41, 42, 43))
    assert words[-3:] == [41, 42, 43]


def test_ranges_plan_is_one_block_per_piece_and_batch_element():
    class Kernel:
        threads, layout = 128, {"group": 4}

    assert launch.piece_rows(Kernel) == 32  # four threads per row of a wide sum
    plan = launch.ranges_plan(Kernel, 7, 3)
    assert (plan.grid, plan.threads, plan.nJC, plan.merge_grid, plan.part_bytes) == (
        21, 128, 1, 0, 0)
    with pytest.raises(ValueError, match="too many blocks"):
        launch.ranges_plan(Kernel, 2**30, 4)


def test_split_scheme_is_chosen_for_few_rows():
    few = launch.plan_launch(5, 3000, 1, 2, 32, 256, 64)
    many = launch.plan_launch(70, 50, 1, 2, 32, 256, 64)
    assert few.nJC > 1 and few.merge_grid == 1 and many.nJC == 1


H100 = DeviceInfo(0, "H100", "sm_90", 132, 1024, 49152, 232448, 233472, 65536, 2048, 32)


@pytest.mark.parametrize("regs, smem, want", [(32, 0, 256), (64, 0, 256), (128, 0, 256),
                                               (255, 0, 256), (40, 60000, 256),
                                               (40, 120000, 256)])
def test_block_size_keeps_the_most_threads_resident(regs, smem, want):
    layout = {"smem_fixed": smem, "smem_per_thread": 0}
    threads = occupancy_threads(H100, regs, 0, layout, 256)
    assert threads == want and threads % 32 == 0


def test_block_size_shrinks_when_shared_memory_grows_with_threads():
    layout = {"smem_fixed": 0, "smem_per_thread": 600}  # 256 threads: 153 KB, 1 block/SM
    threads = occupancy_threads(H100, 32, 0, layout, 512)
    assert threads * 600 <= H100.shared_per_block_optin
    resident = (H100.shared_per_sm // (threads * 600 + 1024)) * threads
    assert resident >= (H100.shared_per_sm // (256 * 600 + 1024)) * 256


def test_resolve_backend_for_cuda_tensors_and_numpy_on_the_gpu():
    assert backend.resolve("auto", "cuda:0") == "cuda"
    assert backend.resolve("cuda", "cuda:1") == "cuda"
    assert backend.resolve("gpu", "cuda:1") == "cuda"
    assert backend.resolve("numpy", "cuda:0") == "numpy"
    assert backend.resolve("cuda", "cpu", "numpy") == "cuda"  # copied to the GPU
    assert backend.resolve("cuda:1", "cpu", "numpy") == "cuda"
    with pytest.raises(ValueError, match="backend='cpu'"):
        backend.resolve("cpu", "cuda:0")
    with pytest.raises(ValueError, match="needs torch CUDA tensors"):
        backend.resolve("cuda", "cpu")
    with pytest.raises(ValueError, match="unknown backend"):
        backend.resolve("cuda:x", "cpu", "numpy")


def test_importing_lazytensor_loads_no_cuda_module():
    code = (
        "import sys, numpy as np, torch\n"
        "import lazytensor\n"
        "from lazytensor import Vi, Vj\n"
        "x = np.random.rand(20, 3)\n"
        "(Vi(x).sqdist(Vj(x))).sum(dim=1, backend='numpy')\n"
        "(Vi(x).sqdist(Vj(x))).sum(dim=1)\n"
        "bad = [m for m in sys.modules if m.startswith(('pycuda', 'lazytensor.cuda'))]\n"
        "assert not bad, bad\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("block, message", [
    ("sys.modules['pycuda'] = None", "pycuda is not installed"),
    ("", "NVIDIA driver could not be loaded|pycuda is not installed"),
])
def test_without_pycuda_or_driver_the_error_says_how_to_install(block, message):
    """NumPy arrays sent to the GPU where pycuda, or the driver, is missing (this process
    has no libcuda.so.1 loaded: the fake driver is never loaded in the child)."""
    code = (
        "import sys\n" + block + "\n"
        "import numpy as np\n"
        "from lazytensor import Vi, Vj\n"
        "x = np.random.rand(20, 3)\n"
        "try:\n"
        "    Vi(x).sqdist(Vj(x)).sum(dim=1, backend='GPU')\n"
        "except RuntimeError as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("LD_PRELOAD", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    import re

    assert "CudaUnavailable" in proc.stdout and re.search(message, proc.stdout), proc.stdout
    assert "pip install 'lazytensor-kernels[cuda]'" in proc.stdout
