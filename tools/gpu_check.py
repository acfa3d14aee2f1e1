"""GPU check: CUDA results against the CPU backend, with timings (``make gpu-check``).

For a machine with an NVIDIA GPU. For each case (Gaussian sums in D=3 and D=64, argKmin
K=10, logsumexp, min_argmin, a batched case, the split-j scheme, a D=784 K-NN, gradients
through autograd; float32 and float64) it runs the reduction on the GPU and with the CPU
backend, and prints one line: case, max relative error (normwise: max |gpu - cpu| / max
|cpu|; for indices, the error of the values they attain), GPU time, CPU time, and the
time of the same computation written densely in torch on the GPU. Then it times the
Gaussian sum with N = M = 10^6 on the GPU (checked on its first rows against the CPU).
Exit status: 0 when every case is within tolerance, 1 on a mismatch or error, 2 when no
GPU (or no C++ compiler for the CPU reference) is usable.

    python -m tools.gpu_check [--quick | --scale S] [--out results.json]

Requirements, and how a GPU session runs it
-------------------------------------------
Nothing beyond lazytensor's own dependencies: kernels are compiled with ``nvcc`` and
launched through the NVIDIA driver's ``libcuda`` via ctypes (:mod:`lazytensor.cuda_driver`).
pycuda is not used: it cannot launch on an external stream (torch's), its ``Function``
exposes no handle to launch otherwise, and it is an sdist that must be compiled against
the CUDA headers (minutes of device time on an offline machine). So:

* On a GPU workstation with internet: ``make gpu-check`` (the Makefile's venv installs
  ``torch==2.13.0``; from PyPI on Linux x86-64 that is a CUDA build). Needs the NVIDIA
  driver, ``nvcc`` (CUDA toolkit matching or older than the driver) and ``g++``.
* On the project's lent H200 machine (offline; its image has python3 with a CUDA torch,
  numpy, sympy, scipy, filelock, nvcc 13.0 and g++, but not platformdirs, which this
  script avoids by setting ``LAZYTENSOR_CACHE_DIR``): nothing to install or carry. From
  the repository root, as one command with a timeout of about 8 minutes::

      PYTHONPATH=. PYTHONUNBUFFERED=1 python3 -m tools.gpu_check --out $OUT/gpu_check.json
      PYTHONPATH=. python3 -m pytest -q -p no:cacheprovider -m cuda tests/test_cuda_runtime.py

  ``make gpu-check`` there would try to build the venv from a registry it cannot reach.
  The first call of each kernel compiles it with nvcc (a few seconds each; about 20
  kernels here), which the warm-up runs absorb.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

TOL = {"float32": 1e-4, "float64": 1e-9}  # float32 kernels use fast math


@dataclass
class Case:
    """A reduction checked on the GPU against the CPU backend."""

    name: str
    dtype: str
    inputs: Callable  # (torch, generator) -> dict of tensors, on the CPU
    lazy: Callable  # (inputs, backend) -> tensor or tuple of tensors
    dense: Callable | None = None  # (inputs) -> the same, densely in torch
    index_value: Callable | None = None  # (inputs, index tensor) -> values the indices attain
    grad: bool = False  # lazy/dense return gradients (inputs must require grad)
    pairs: int = 0


@dataclass
class Row:
    case: str
    error: float = math.nan
    ok: bool = False
    gpu_ms: float = math.nan
    cpu_ms: float = math.nan
    dense_ms: float = math.nan
    note: str = ""
    extra: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------- cases


def _points(torch, g, dtype, *shape, scale=1.0):
    return torch.rand(*shape, generator=g, dtype=getattr(torch, dtype)) * scale


def _gauss_case(name, dtype, N, M, D, Db=2):
    from lazytensor import Vi, Vj

    s = 2.0 / math.sqrt(D)

    def inputs(torch, g):
        return {"x": _points(torch, g, dtype, N, D, scale=s), "y": _points(torch, g, dtype, M, D, scale=s),
                "b": _points(torch, g, dtype, M, Db) - 0.5}

    def lazy(t, backend):
        return ((-Vi(t["x"]).sqdist(Vj(t["y"]))).exp() * Vj(t["b"])).sum(dim=1, backend=backend)

    def dense(t):
        import torch

        return torch.exp(-torch.cdist(t["x"], t["y"]) ** 2) @ t["b"]

    return Case(name, dtype, inputs, lazy, dense if N * M <= 2e9 else None, pairs=N * M)


def _sqdist_index_value(t, idx):
    x, y = t["x"], t["y"]
    flat = idx.reshape(idx.shape[0], -1)
    return ((x[:, None, :] - y[flat]) ** 2).sum(-1)


def _argkmin_case(name, dtype, N, M, D, K=10):
    from lazytensor import Vi, Vj

    def inputs(torch, g):
        return {"x": _points(torch, g, dtype, N, D), "y": _points(torch, g, dtype, M, D)}

    def lazy(t, backend):
        return Vi(t["x"]).sqdist(Vj(t["y"])).argKmin(K, dim=1, backend=backend)

    def dense(t):
        import torch

        return torch.cdist(t["x"], t["y"]).topk(K, dim=1, largest=False).indices

    return Case(name, dtype, inputs, lazy, dense if N * M <= 4e9 else None,
                index_value=_sqdist_index_value, pairs=N * M)


def _lse_case(name, dtype, N, M, D):
    from lazytensor import Vi, Vj

    def inputs(torch, g):
        return {"x": _points(torch, g, dtype, N, D, scale=4), "y": _points(torch, g, dtype, M, D, scale=4)}

    def lazy(t, backend):
        return (-Vi(t["x"]).sqdist(Vj(t["y"]))).logsumexp(dim=1, backend=backend)

    def dense(t):
        import torch

        return torch.logsumexp(-torch.cdist(t["x"], t["y"]) ** 2, dim=1, keepdim=True)

    return Case(name, dtype, inputs, lazy, dense, pairs=N * M)


def _min_argmin_case(name, dtype, N, M, D):
    from lazytensor import Vi, Vj

    def inputs(torch, g):
        return {"x": _points(torch, g, dtype, N, D), "y": _points(torch, g, dtype, M, D)}

    def lazy(t, backend):
        return Vi(t["x"]).sqdist(Vj(t["y"])).min_argmin(dim=1, backend=backend)

    def dense(t):
        import torch

        v, i = (torch.cdist(t["x"], t["y"]) ** 2).min(dim=1, keepdim=True)
        return v, i

    return Case(name, dtype, inputs, lazy, dense, index_value=_sqdist_index_value, pairs=N * M)


def _batched_case(name, dtype, B, N, M, D):
    from lazytensor import LazyTensor

    def inputs(torch, g):
        return {"x": _points(torch, g, dtype, B, N, 1, D), "y": _points(torch, g, dtype, 1, 1, M, D),
                "s": _points(torch, g, dtype, B, 1, 1, 1) + 0.5,
                "b": _points(torch, g, dtype, B, 1, M, 1)}

    def lazy(t, backend):
        K = (-LazyTensor(t["x"]).sqdist(LazyTensor(t["y"])) * LazyTensor(t["s"])).exp()
        return (K * LazyTensor(t["b"])).sum(dim=2, backend=backend)

    def dense(t):
        d2 = ((t["x"] - t["y"]) ** 2).sum(-1)  # (B, N, M)
        return (d2.mul(-t["s"][..., 0]).exp() * t["b"][..., 0]).sum(-1, keepdim=True)

    return Case(name, dtype, inputs, lazy, dense, pairs=B * N * M)


def _grad_case(name, dtype, N, M, D):
    from lazytensor import Vi, Vj

    def inputs(torch, g):
        return {"x": _points(torch, g, dtype, N, D), "y": _points(torch, g, dtype, M, D),
                "b": _points(torch, g, dtype, M, 1) - 0.5}

    def lazy(t, backend):
        import torch

        x, y, b = (t[k].detach().requires_grad_() for k in ("x", "y", "b"))
        a = ((-Vi(x).sqdist(Vj(y)) * 4).exp() * Vj(b)).sum(dim=1, backend=backend)
        lse = (-Vi(x).sqdist(Vj(y))).logsumexp(dim=1, backend=backend)
        return torch.autograd.grad((a ** 2).sum() + lse.sum(), [x, y, b])

    def dense(t):
        import torch

        x, y, b = (t[k].detach().requires_grad_() for k in ("x", "y", "b"))
        d2 = torch.cdist(x, y) ** 2
        a = torch.exp(-4 * d2) @ b
        lse = torch.logsumexp(-d2, dim=1)
        return torch.autograd.grad((a ** 2).sum() + lse.sum(), [x, y, b])

    return Case(name, dtype, inputs, lazy, dense, grad=True, pairs=3 * N * M)


def cases(scale: float = 1.0) -> list[Case]:
    """The checked cases; ``scale`` multiplies the numbers of points."""

    def n(k):
        return max(16, int(k * scale))

    return [
        _gauss_case("gauss D=3", "float32", n(50_000), n(50_000), 3),
        _gauss_case("gauss D=3", "float64", n(50_000), n(50_000), 3),
        _gauss_case("gauss D=64", "float32", n(20_000), n(20_000), 64),
        _gauss_case("gauss split-j N=100", "float32", 100, n(1_000_000), 3),
        _argkmin_case("argKmin K=10 D=3", "float32", n(50_000), n(50_000), 3),
        _argkmin_case("argKmin K=10 D=784", "float32", n(2_000), n(20_000), 784),
        _lse_case("logsumexp D=3", "float32", n(50_000), n(50_000), 3),
        _lse_case("logsumexp D=3", "float64", n(50_000), n(50_000), 3),
        _min_argmin_case("min_argmin D=3", "float64", n(50_000), n(50_000), 3),
        _batched_case("batched B=8 gauss", "float32", 8, n(5_000), n(5_000), 3),
        _grad_case("grad gauss+lse", "float32", n(20_000), n(20_000), 3),
        _grad_case("grad gauss+lse", "float64", n(10_000), n(10_000), 3),
    ]


# ---------------------------------------------------------------------------- measuring


def _timed(fn, sync, repeat: int, budget_s: float = 5.0) -> tuple[object, float]:
    """(result, median ms over ``repeat`` runs after one warm-up; fewer runs if slow)."""
    out = fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
        if sum(times) > budget_s:
            break
    return out, 1e3 * statistics.median(times)


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _error(case: Case, t_cpu: dict, got, want) -> float:
    """Normwise relative error; indices through the values they attain."""
    import torch

    worst = 0.0
    for g, w in zip(_as_tuple(got), _as_tuple(want)):
        g = g.detach().cpu()
        w = w.detach()
        if g.shape != w.shape or g.dtype != w.dtype:
            return math.inf
        if w.dtype == torch.int64:
            if case.dtype == "float64" and case.index_value is None:
                worst = max(worst, float((g != w).any()))
                continue
            g, w = case.index_value(t_cpu, g), case.index_value(t_cpu, w)
        if not torch.equal(g.isnan(), w.isnan()):
            return math.inf
        g, w = g.nan_to_num(), w.nan_to_num()
        scale = max(float(w.abs().max()), 1e-30)
        worst = max(worst, float((g - w).abs().max()) / scale)
    return worst


def run_case(case: Case, torch, seed: int = 0) -> Row:
    row = Row(f"{case.name} {case.dtype}")
    try:
        g = torch.Generator().manual_seed(seed)
        t_cpu = case.inputs(torch, g)
        t_gpu = {k: v.cuda() for k, v in t_cpu.items()}
        gpu_sync = torch.cuda.synchronize
        got, row.gpu_ms = _timed(lambda: case.lazy(t_gpu, "cuda"), gpu_sync, 10)
        want, row.cpu_ms = _timed(lambda: case.lazy(t_cpu, "cpu"), lambda: None, 3)
        row.error = _error(case, t_cpu, got, want)
        row.ok = row.error <= TOL[case.dtype]
        if case.dense is not None:
            try:
                _, row.dense_ms = _timed(lambda: case.dense(t_gpu), gpu_sync, 5)
            except torch.cuda.OutOfMemoryError:
                row.note = "dense: out of memory"
            torch.cuda.empty_cache()
        if case.pairs and row.gpu_ms > 0:
            row.extra["gpu_pairs_per_s"] = case.pairs / (row.gpu_ms / 1e3)
    except Exception as e:  # noqa: BLE001  (one failing case must not hide the others)
        row.note = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        row.ok = False
    return row


def run_million(torch, scale: float = 1.0) -> Row:
    """N = M = 10^6 Gaussian sum (D=3, float32) on the GPU; its first rows against the CPU."""
    from lazytensor import Vi, Vj

    n = max(1000, int(1_000_000 * scale))
    row = Row(f"gauss D=3 N=M={n:.0e} float32")
    try:
        g = torch.Generator().manual_seed(1)
        x, y = torch.rand(n, 3, generator=g), torch.rand(n, 3, generator=g)
        b = torch.rand(n, 1, generator=g) - 0.5
        xg, yg, bg = x.cuda(), y.cuda(), b.cuda()

        def fn(x, y, b, backend):
            return ((-Vi(x).sqdist(Vj(y)) * 100).exp() * Vj(b)).sum(dim=1, backend=backend)

        got, row.gpu_ms = _timed(lambda: fn(xg, yg, bg, "cuda"), torch.cuda.synchronize, 3, 20)
        rows = min(2_000, n)
        want, row.cpu_ms = _timed(lambda: fn(x[:rows], y, b, "cpu"), lambda: None, 1)
        row.error = float((got[:rows].cpu() - want).abs().max() / want.abs().max())
        row.ok = row.error <= TOL["float32"]
        row.note = f"CPU time for the first {rows} rows only"
        row.extra["gpu_pairs_per_s"] = n * n / (row.gpu_ms / 1e3)
    except Exception as e:  # noqa: BLE001
        row.note = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return row


# ---------------------------------------------------------------------------- report


def environment(torch) -> dict:
    from lazytensor.codegen.cuda.nvcc import nvcc_path, nvcc_version

    from lazytensor.cuda import driver

    dev = torch.cuda.current_device()
    info = driver.device_info(dev)
    version = nvcc_version() if nvcc_path() else ""
    return {
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(dev),
        "compute_capability": info.arch,
        "multiprocessors": info.sm_count,
        "driver_cuda_version": driver.driver_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "nvcc": version or "not found",
        "host": platform.node(),
        "cpu_threads": torch.get_num_threads(),
    }


def _fmt(v: float, digits=1) -> str:
    return "-" if math.isnan(v) else f"{v:.{digits}f}"


def table(rows: list[Row]) -> str:
    lines = [f"{'case':34} {'max rel err':>11} {'GPU ms':>9} {'CPU ms':>9} {'dense ms':>9}  ok"]
    for r in rows:
        err = "-" if math.isnan(r.error) else f"{r.error:.1e}"
        lines.append(f"{r.case:34} {err:>11} {_fmt(r.gpu_ms, 2):>9} {_fmt(r.cpu_ms):>9} "
                     f"{_fmt(r.dense_ms, 2):>9}  {'ok' if r.ok else 'FAIL'}"
                     + (f"  ({r.note})" if r.note else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="sizes divided by 5")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the sizes")
    parser.add_argument("--out", help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    os.environ.setdefault("LAZYTENSOR_CACHE_DIR", tempfile.mkdtemp(prefix="lazytensor-gpu-check-"))

    import torch

    if not torch.cuda.is_available():
        print("gpu-check: torch.cuda.is_available() is False: no usable NVIDIA GPU, driver, "
              f"or CUDA build of torch (torch {torch.__version__}, CUDA {torch.version.cuda})")
        return 2
    from lazytensor.codegen.compilers import cpu_compiler

    if not cpu_compiler().available:
        print("gpu-check: no C++ compiler for the CPU reference backend (install g++)")
        return 2
    env = environment(torch)
    print("lazytensor gpu-check  " + "  ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    rows = []
    scale = args.scale * (0.2 if args.quick else 1.0)
    for case in cases(scale):
        rows.append(run_case(case, torch))
        print(table(rows[-1:]).splitlines()[1], flush=True)
    rows.append(run_million(torch, scale))
    print(table(rows[-1:]).splitlines()[1], flush=True)
    print()
    print(f"lazytensor gpu-check, {env['time']}, {env['device']} ({env['compute_capability']}, "
          f"{env['multiprocessors']} SMs), torch {env['torch']}, {env['nvcc']}")
    print(table(rows))
    big = rows[-1]
    if "gpu_pairs_per_s" in big.extra:
        print(f"{big.case}: {big.gpu_ms / 1e3:.3f} s on the GPU, "
              f"{big.extra['gpu_pairs_per_s'] / 1e12:.2f} x 10^12 pairs/s")
    failed = [r.case for r in rows if not r.ok]
    print("all cases within tolerance" if not failed else f"FAILED: {', '.join(failed)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"environment": env, "tolerance": TOL,
                       "rows": [r.__dict__ for r in rows]}, f, indent=1, default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
