"""The headline job: a Gaussian kernel product on 100,000 × 100,000 points, on the CPU.

``a_i = Σ_j exp(-|x_i - y_j|² / σ²) b_j`` for N = M = 100,000 points in 3D, float32:
10^10 pairs, computed without the N × M matrix (which would take 40 GB in float32).
Run it with ``python -m examples.demo`` (or ``make demo``); ``--n`` changes the size.

What it prints, and how each figure is measured:

- the first call of the formula, in a fresh private kernel cache (so it renders and
  compiles the kernel; ``--keep-cache`` uses the normal cache instead), on a small
  problem, and the same call once the kernel is loaded;
- the big product: wall time of each call, pairs per second;
- memory: the growth of the process's peak resident set size (``ru_maxrss``) across the
  big calls — what the kernel and its output really took, inputs excluded — next to
  what the dense N × M matrix would need and the machine's memory;
- accuracy: 200 rows of the result against a float64 dense computation (chunked).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time


def _mib(n_bytes: float) -> str:
    return f"{n_bytes / 2**20:,.1f} MiB" if n_bytes < 2**30 else f"{n_bytes / 2**30:,.1f} GiB"


def _peak_rss() -> int:
    """Peak resident set size of this process so far, in bytes (Linux: KiB units)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _machine_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _dense_check(x, y, b, sigma2: float, rows: int = 200, chunk: int = 25):
    """float64 dense a_i for the first ``rows`` rows, ``chunk`` rows at a time."""
    import torch

    xd, yd, bd = x[:rows].double(), y.double(), b.double()
    out = []
    for i in range(0, xd.shape[0], chunk):
        d2 = ((xd[i:i + chunk, None, :] - yd[None, :, :]) ** 2).sum(-1)
        out.append(torch.exp(-d2 / sigma2) @ bd)
    return torch.cat(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="N = M (default 100,000)")
    parser.add_argument("--sigma", type=float, default=0.1, help="kernel width (default 0.1)")
    parser.add_argument("--repeat", type=int, default=2, help="timed calls of the big product")
    parser.add_argument("--keep-cache", action="store_true",
                        help="use the normal kernel cache (the first call may then be a disk hit)")
    args = parser.parse_args(argv)

    tmp_cache = None
    if not args.keep_cache:
        tmp_cache = tempfile.mkdtemp(prefix="lazytensor-demo-cache-")
        os.environ["LAZYTENSOR_CACHE_DIR"] = tmp_cache
    try:
        return _run(args)
    finally:
        if tmp_cache:
            shutil.rmtree(tmp_cache, ignore_errors=True)


def _run(args) -> int:
    import torch

    from lazytensor import Vi, Vj
    from lazytensor.backends.cpu import runtime

    N = M = args.n
    sigma2 = args.sigma ** 2
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(N, 3, generator=gen)
    y = torch.rand(M, 3, generator=gen)
    b = torch.randn(M, 1, generator=gen)

    def product(x, y, b):
        K = (-Vi(x).sqdist(Vj(y)) / sigma2).exp()  # symbolic N x M kernel: nothing computed
        return K @ b  # the reduction runs the compiled kernel

    print(f"lazytensor demo: Gaussian kernel product a_i = sum_j exp(-|x_i - y_j|^2 / {sigma2:g}) b_j")
    print(f"  N = M = {N:,} points in 3D, float32, {N * M:.3g} pairs; "
          f"{runtime.num_threads()} threads, {os.cpu_count()} CPUs")

    small = 100
    t = time.perf_counter()
    product(x[:small], y[:small], b[:small])
    first = time.perf_counter() - t
    t = time.perf_counter()
    reps = 200
    for _ in range(reps):
        product(x[:small], y[:small], b[:small])
    cached = (time.perf_counter() - t) / reps
    where = "normal cache: may be a disk hit" if args.keep_cache else "fresh cache: render + compile + load"
    print(f"\nfirst call of the formula ({where}), N = M = {small}: {first:.3f} s")
    print(f"same call once loaded (formula built + reduced, Python included):   {cached * 1e6:.0f} us")

    rss0 = _peak_rss()
    times = []
    for _ in range(max(1, args.repeat)):
        t = time.perf_counter()
        a = product(x, y, b)
        times.append(time.perf_counter() - t)
    rss1 = _peak_rss()
    best = min(times)
    print(f"\nbig product, {len(times)} calls: " + ", ".join(f"{s:.2f} s" for s in times))
    print(f"  best {best:.2f} s = {N * M / best / 1e9:.2f} billion pairs/s")

    inputs = sum(t.numel() * t.element_size() for t in (x, y, b))
    dense = N * M * 4
    mem = _machine_memory()
    print("\nmemory")
    print(f"  inputs x, y, b: {_mib(inputs)}; output a: {_mib(a.numel() * a.element_size())}")
    print(f"  peak resident set size grew by {_mib(max(0, rss1 - rss0))} during the big calls "
          f"(ru_maxrss; now {_mib(rss1)} for the whole process)")
    fits = "" if mem is None else (
        f" -- {'more than' if dense > mem else 'within'} this machine's {_mib(mem)} of memory")
    print(f"  a dense N x M float32 kernel matrix would take {_mib(dense)}{fits}")

    rows = min(200, N)
    ref = _dense_check(x, y, b, sigma2, rows)
    err = ((a[:rows].double() - ref).abs().max() / ref.abs().max()).item()
    print(f"\naccuracy: {rows} rows x all {M:,} columns against float64 dense: "
          f"max |error| / max |a| = {err:.2e}")
    ok = err < 1e-4
    print("OK" if ok else "ACCURACY CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
