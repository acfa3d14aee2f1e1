"""Test configuration: a private kernel cache per test session (unless one is given)."""

import os
import tempfile

import numpy as np
import pytest

if not os.environ.get("LAZYTENSOR_CACHE_DIR"):
    os.environ["LAZYTENSOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="lazytensor-test-cache-")


@pytest.fixture
def rng(request):
    """A fresh random generator per test; the seed is printed on failure."""
    seed = int.from_bytes(os.urandom(4), "little")
    request.node.user_properties.append(("seed", seed))
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)


def _gpu_kind():
    """("hardware" | "emulator", None) or (None, why not)."""
    import torch
    from lazytensor.codegen.cuda.nvcc import nvcc_path

    if nvcc_path() is None:
        return None, "nvcc not found (CUDA toolkit): CUDA kernels can be neither built nor run"
    if torch.cuda.is_available() and os.environ.get("LAZYTENSOR_TEST_GPU") != "emulator":
        return "hardware", None
    try:
        import pycuda  # noqa: F401
    except ImportError:
        return None, "pycuda is not installed (`make .venv/.pycuda` builds it against the " \
                     "fake driver)"
    return "emulator", None


@pytest.fixture(scope="session")
def _gpu_device():
    kind, why = _gpu_kind()
    if kind is None:
        pytest.skip(why)
    if kind == "hardware":
        from cuda_emulator.gpu import Gpu

        return Gpu()
    from cuda_emulator.gpu import EmulatedGpu

    return EmulatedGpu()


@pytest.fixture
def gpu(_gpu_device, monkeypatch):
    """A GPU: the real one when torch sees one, else the emulator (see tests/cuda_emulator).
    After the test, races or divergent barriers the emulator saw fail it."""
    if _gpu_device.emulated:
        _gpu_device.install(monkeypatch)
    yield _gpu_device
    _gpu_device.check()
