"""The CUDA backend's part of ``python -m lazytensor doctor``: nvcc, pycuda, the NVIDIA
driver and the GPUs torch sees (found, not loaded: nothing here imports pycuda).

>>> [c.name for c in checks()]
['nvcc', 'pycuda', 'NVIDIA driver', 'GPU']
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import re
import subprocess

from ...core.checks import Check, run_tool

NAMES = ("nvcc", "pycuda", "NVIDIA driver", "GPU")  # its checks, in report order

def check_nvcc() -> Check:
    from ...codegen.cuda.nvcc import nvcc_path

    nvcc = nvcc_path()
    if nvcc is None:
        return Check("nvcc", "off", "not found (needed for CUDA tensors only)",
                     "install the CUDA toolkit and put its bin/ on PATH, or set $NVCC")
    try:
        text = run_tool([nvcc, "--version"]).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        return Check("nvcc", "warn", f"{nvcc}: --version failed ({error})",
                     "check the CUDA toolkit installation")
    found = re.search(r"release ([\d.]+)", text)
    return Check("nvcc", "ok", f"{nvcc} (CUDA {found.group(1) if found else 'version unknown'})")


def check_pycuda() -> Check:
    # Found, not imported: importing pycuda.driver loads libcuda.
    if importlib.util.find_spec("pycuda") is None:
        return Check("pycuda", "off", "not installed (needed for CUDA tensors only)",
                     "pip install pycuda (the `cuda` extra; it builds against the CUDA toolkit)")
    try:
        version = importlib.metadata.version("pycuda")
    except importlib.metadata.PackageNotFoundError:
        version = "version unknown"
    return Check("pycuda", "ok", f"pycuda {version}")


def check_driver() -> Check:
    """The NVIDIA driver's libcuda, and the CUDA version it supports (no GPU needed)."""
    names = [os.environ.get("LAZYTENSOR_LIBCUDA"), "libcuda.so.1", "libcuda.so", "nvcuda.dll"]
    for name in filter(None, names):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        version = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return Check("NVIDIA driver", "warn", f"{name} loads but does not answer",
                         "reinstall the NVIDIA driver (nvidia-smi should list the GPU)")
        major, minor = version.value // 1000, version.value % 1000 // 10
        return Check("NVIDIA driver", "ok", f"{name}, supports CUDA {major}.{minor}")
    return Check("NVIDIA driver", "off", "libcuda not found (needed for CUDA tensors only)",
                 "install the NVIDIA driver (nvidia-smi should then list the GPU)")


def check_gpu() -> Check:
    """The GPUs torch can use."""
    try:
        import torch
    except ImportError:
        return Check("GPU", "off", "torch is not installed", "pip install torch")
    if torch.version.cuda is None:
        return Check("GPU", "off", f"torch {torch.__version__} is a CPU-only build",
                     "for CUDA tensors install a CUDA build of torch (pytorch.org, 'Get started')")
    if not torch.cuda.is_available():
        return Check("GPU", "off", f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees "
                     "no GPU", "check `nvidia-smi` and $CUDA_VISIBLE_DEVICES")
    gpus = []
    for k in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(k)
        gpus.append(f"cuda:{k} {props.name} (sm_{props.major}{props.minor}, "
                    f"{props.total_memory / 2**30:.0f} GiB)")
    return Check("GPU", "ok", "; ".join(gpus))


def checks(kernel: bool = True) -> list:
    """The CUDA backend's checks, in report order."""
    return [check_nvcc(), check_pycuda(), check_driver(), check_gpu()]


def summary(found: list) -> str:
    """``CUDA backend: ready``, or what is missing."""
    missing = [c.name for c in found if c.status != "ok"]
    return ("CUDA backend: ready" if not missing else
            f"CUDA backend: unavailable (missing: {', '.join(missing)})")
