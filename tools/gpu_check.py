"""GPU check: the CUDA backend on real hardware, in one command (``make gpu-check``).

For a machine with an NVIDIA GPU, within ``--budget`` seconds (default 480), writing JSON
(``--out``):

1. the CUDA runtime tests on the GPU (``pytest -m cuda tests/test_cuda_runtime.py
   tests/test_cuda_ranges.py``: the tests CI runs on the emulator, here on hardware);
2. every reduction of the registry on a random formula, float32 and float64, GPU against
   the CPU backend, and fixed cases of interest (Gaussian sums in D = 3, 64, argKmin in
   D = 3 and 784, log-sum-exp, batches, split-j, gradients, block-sparse ranges with
   their gradients): max relative error (normwise; indices through the values they
   attain), GPU and CPU times, dense torch on the GPU;
3. Gaussian kernel D = 3 forward + backward (``(K @ b)`` and its gradients in x, y, b) for
   N = M = 10^4, 10^5, 10^6, against the same in dense torch (where it fits in memory).

Exit status: 0 when every check passed, 1 on a mismatch, error or failed test, 2 when no
GPU (or no C++ compiler for the CPU reference) is usable.

    python -m tools.gpu_check [--quick | --scale S] [--budget SECONDS] [--out results.json]

Requirements, and how to run it on an offline GPU machine
---------------------------------------------------------
lazytensor's dependencies, nvcc (CUDA toolkit no newer than the driver), g++, a CUDA
build of torch, and pycuda. pycuda is a source archive on the package index: build its
wheel where the registry is reachable, for the GPU machine's Python, and carry it:

    python -m tools.build_pycuda --python ~/.pyenv/versions/3.12.1/bin/python --no-install \
        --out build/gpu-wheels
    # -> pycuda-2026.1-cp312-*.whl and its dependencies' wheels (about 6 MB)

then there, from the repository root (no registry needed; carry build/gpu-wheels)::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site build/gpu-wheels/*.whl
    PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1 python3 -m tools.gpu_check --out gpu_check.json

(The wheel links to ``libcuda.so.1`` by name: the real driver there, the fake one in CI.)
With a registry, ``make gpu-check`` builds and installs everything itself.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.gpu_cases import Case, Row, cases, random_reduction_cases

TOL = {"float32": 1e-4, "float64": 1e-9}  # IEEE-accurate kernels (no use_fast_math)
ROOT = Path(__file__).resolve().parent.parent


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
        if not torch.equal(g.isnan(), w.isnan()) or not torch.equal(g.isinf(), w.isinf()) \
                or not torch.equal(g[g.isinf()], w[w.isinf()]):
            return math.inf
        finite = w.isfinite()
        g, w = g[finite], w[finite]
        if w.numel() == 0:
            continue
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


def run_scaling(torch, n: int) -> Row:
    """Gaussian kernel D=3, float32: ``K @ b`` and its gradients in x, y, b, N = M = n, on
    the GPU, against dense torch (where it fits); first rows checked against the CPU."""
    from lazytensor import Vi, Vj

    row = Row(f"gauss D=3 fwd+bwd N=M={n:.0e} float32")
    try:
        g = torch.Generator().manual_seed(n)
        x, y = torch.rand(n, 3, generator=g), torch.rand(n, 3, generator=g)
        b = torch.rand(n, 1, generator=g) - 0.5

        def lazy(x, y, b, backend):
            x, y, b = (t.detach().requires_grad_() for t in (x, y, b))
            a = ((-Vi(x).sqdist(Vj(y)) * 100).exp() * Vj(b)).sum(dim=1, backend=backend)
            return (a, *torch.autograd.grad((a ** 2).sum(), [x, y, b]))

        def dense(x, y, b):
            x, y, b = (t.detach().requires_grad_() for t in (x, y, b))
            a = torch.exp(-100 * torch.cdist(x, y) ** 2) @ b
            return (a, *torch.autograd.grad((a ** 2).sum(), [x, y, b]))

        xg, yg, bg = x.cuda(), y.cuda(), b.cuda()
        sync = torch.cuda.synchronize
        got, row.gpu_ms = _timed(lambda: lazy(xg, yg, bg, "cuda"), sync, 5, 20)
        rows = min(1000, n)
        want = lazy(x[:rows], y, b, "cpu")[0]
        row.error = float((got[0][:rows].cpu() - want).abs().max() / want.abs().max())
        row.ok = row.error <= TOL["float32"]
        row.extra["gpu_pairs_per_s"] = 3 * n * n / (row.gpu_ms / 1e3)
        free, _ = torch.cuda.mem_get_info()
        if 4 * n * n * 4 < free:  # the N x M matrix, its exp, their gradients
            try:
                _, row.dense_ms = _timed(lambda: dense(xg, yg, bg), sync, 3, 20)
            except torch.cuda.OutOfMemoryError:
                row.note = "dense: out of memory"
            torch.cuda.empty_cache()
        else:
            row.note = "dense: the N x M matrices do not fit"
    except Exception as e:  # noqa: BLE001
        row.note = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        row.ok = False
    return row


def run_tests(timeout: float) -> dict:
    """The CUDA runtime tests on this GPU (pytest -m cuda)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda",
           *(str(ROOT / "tests" / f) for f in ("test_cuda_runtime.py", "test_cuda_ranges.py"))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"ok": False, "summary": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    failures = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    return {"ok": proc.returncode == 0, "summary": lines[-1] if lines else proc.stderr[-500:],
            "failures": failures[:50]}


# ---------------------------------------------------------------------------- report


def environment(torch) -> dict:
    from lazytensor.codegen.cuda.nvcc import nvcc_path, nvcc_version

    from lazytensor.backends.cuda import driver

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
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for everything")
    parser.add_argument("--skip-tests", action="store_true", help="do not run the test suite")
    parser.add_argument("--out", help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    start = time.perf_counter()
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

    def left() -> float:
        return args.budget - (time.perf_counter() - start)

    tests = {"ok": True, "summary": "skipped (--skip-tests)"}
    if not args.skip_tests:
        tests = run_tests(min(180.0, 0.35 * args.budget))
        print(f"CUDA runtime tests: {tests['summary']}", flush=True)
    rows, skipped = [], []
    scale = args.scale * (0.2 if args.quick else 1.0)
    for case in random_reduction_cases(seed=int(time.time()) % 10_000, scale=scale) + \
            cases(scale):
        if left() < 90:  # keep time for the scaling runs
            skipped.append(f"{case.name} {case.dtype}")
            continue
        rows.append(run_case(case, torch))
        print(table(rows[-1:]).splitlines()[1], flush=True)
    for n in (10_000, 100_000, 1_000_000):
        n = max(1000, int(n * scale))
        if left() < 15:
            skipped.append(f"scaling N=M={n}")
            continue
        rows.append(run_scaling(torch, n))
        print(table(rows[-1:]).splitlines()[1], flush=True)
    print()
    print(f"lazytensor gpu-check, {env['time']}, {env['device']} ({env['compute_capability']}, "
          f"{env['multiprocessors']} SMs), torch {env['torch']}, {env['nvcc']}")
    print(table(rows))
    if skipped:
        print(f"not run (time budget of {args.budget:.0f} s): {', '.join(skipped)}")
    failed = [r.case for r in rows if not r.ok] + ([] if tests["ok"] else ["CUDA tests"])
    print("all checks passed" if not failed else f"FAILED: {', '.join(failed)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"environment": env, "tolerance": TOL, "tests": tests,
                       "skipped": skipped, "seconds": time.perf_counter() - start,
                       "rows": [r.__dict__ for r in rows]}, f, indent=1, default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
