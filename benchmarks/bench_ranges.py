"""Block-sparse ranges and a client (geomloss) against pykeops and dense torch.

``python -m benchmarks.bench_ranges [--quick] [--rounds 5] [--tables ranges,grad,client]
[--cases multiscale:2000,online:2000] [--client-budget S] [--write FILE]``, or the
``ranges`` suite of ``python -m benchmarks.bench``.

- **ranges table**: the README's setting (N = M = 10⁵ uniform points in the unit cube,
  D = 3, grid cells of 0.1: 1,000 clusters, pairs of clusters kept within 0.4: ~16 % of
  the pairs), Gaussian kernel product ``K @ b`` with σ = 0.05, float32: the full product,
  the same with ``K.ranges`` and pykeops 2.3 with the same ranges; the target is ranges
  time ≤ 1.4 × (kept fraction) × full time.
- **grad table**: log-sum-exp over the same clustering at N = M = 20,000 with x requiring
  grad, forward + backward in each gradient mode against the forward alone.
- **client table**: geomloss's ``SamplesLoss("sinkhorn")`` loss and gradients, backends
  ``online`` and ``multiscale`` (block-sparse ranges), on lazytensor (geomloss's pykeops
  imports served by lazytensor), on pykeops 2.3 and geomloss's dense ``tensorized``
  backend. lazytensor and pykeops cannot share a process, so each contender runs in a
  worker process of its own that the parent drives call by call.

Method as in :mod:`benchmarks.bench`: contenders in turns, one call each per round, the
order rotating; medians of times and of the per-round ratios to lazytensor.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import types

from benchmarks.bench import Table, _cell, _pykeops, _start, compare, machine


def clustered_problem(n: int, seed: int = 0):
    """The README's setting: sorted points, their ranges and the kept fraction."""
    import torch
    from lazytensor.torch.cluster import (
        cluster_ranges_centroids,
        from_matrix,
        grid_cluster,
        sort_clusters,
    )

    g = torch.Generator().manual_seed(seed)
    x, y, b = torch.rand(n, 3, generator=g), torch.rand(n, 3, generator=g), torch.randn(n, 1, generator=g)
    x, x_lab = sort_clusters(x, grid_cluster(x, 0.1))
    (y, b), y_lab = sort_clusters((y, b), grid_cluster(y, 0.1))
    rx, cx, _ = cluster_ranges_centroids(x, x_lab)
    ry, cy, _ = cluster_ranges_centroids(y, y_lab)
    keep = ((cx[:, None] - cy[None]) ** 2).sum(-1) < 0.4**2
    rows, cols = (rx[:, 1] - rx[:, 0]).double(), (ry[:, 1] - ry[:, 0]).double()
    kept = float((keep.double() * rows[:, None] * cols[None]).sum()) / (n * n)
    return x, y, b, from_matrix(rx, ry, keep), kept, len(rx)


def ranges_table(args) -> Table:
    from lazytensor import Vi, Vj
    from lazytensor.backends.cpu import runtime

    KLT, why = _pykeops()
    t = _start(Table("Block-sparse ranges: Gaussian K @ b, D = 3, σ = 0.05, float32",
                     ["N = M", "clusters", "kept", "full product", "with ranges",
                      "speed-up (target)", "pykeops with ranges"],
                     f"{runtime.num_threads()} threads. Points uniform in the unit cube, grid "
                     "cells of 0.1, pairs of clusters whose centroids are within 0.4 kept "
                     "(the README's recipe); speed-up: median over rounds of full / ranges "
                     "time, target 1 / (1.4 × kept); pykeops: ×, its time / ours with ranges"
                     + (f" ({why})" if KLT is None else "") + "."))
    for n in args.ranges_sizes:
        x, y, b, ranges, kept, C = clustered_problem(n)
        K = (-Vi(x).sqdist(Vj(y)) / 0.05**2).exp()
        Ks = (-Vi(x).sqdist(Vj(y)) / 0.05**2).exp()
        Ks.ranges = ranges
        cont = {"ranges": lambda Ks=Ks, b=b: Ks @ b, "full": lambda K=K, b=b: K @ b}
        if KLT is not None:
            def keops(x=x, y=y, b=b, ranges=ranges):
                Kk = (-((KLT(x[:, None]) - KLT(y[None])) ** 2).sum(-1) / 0.05**2).exp()
                Kk.ranges = tuple(r.int() for r in ranges)
                return Kk @ b
            cont["keops"] = keops
        res = compare(cont, args.rounds, args.budget)
        speed = res["full"][1] if isinstance(res["full"], tuple) else None
        speed_cell = (f"×{speed:.2f} ({1 / (1.4 * kept):.2f})" if speed else "—")
        t.add(f"{n:,}", C, f"{100 * kept:.1f} %", _cell((res["full"][0], None), ours=True)
              if isinstance(res["full"], tuple) else res["full"],
              _cell(res["ranges"], ours=True), speed_cell,
              _cell(res["keops"]) if "keops" in res else why)
    return t


def grad_table(args) -> Table:
    """Log-sum-exp over block-sparse ranges with x requiring grad: forward + backward in
    each gradient mode against the forward alone (what Sinkhorn's last step runs)."""
    import torch

    from lazytensor import Vi, Vj

    t = _start(Table("Block-sparse log-sum-exp with gradients, D = 3, float32",
                     ["N = M", "kept", "forward", "fwd + bwd, symbolic",
                      "fwd + bwd, dual", "dual / symbolic (medians)"],
                     "The README's clustering; (b_j - |x_i - y_j|² / σ²).logsumexp(dim=1) "
                     "with σ = 0.05, gradient w.r.t. x; ×: median over rounds of the time "
                     "over the forward's."))
    for n in args.grad_sizes:
        x, y, b, ranges, kept, _ = clustered_problem(n)
        x.requires_grad_(True)

        def run(mode, backward=True, x=x, y=y, b=b, ranges=ranges):
            out = (Vj(b) - Vi(x).sqdist(Vj(y)) / 0.05**2).logsumexp(dim=1, ranges=ranges,
                                                                    grad_mode=mode)
            if backward:
                torch.autograd.grad(out.sum(), x)
        res = compare({"forward": lambda: run("symbolic", False),
                       "symbolic": lambda: run("symbolic"), "dual": lambda: run("dual")},
                      args.rounds, args.budget)
        ratio = (f"×{res['dual'][0] / res['symbolic'][0]:.2f}"
                 if all(isinstance(res[k], tuple) for k in ("dual", "symbolic")) else "—")
        t.add(f"{n:,}", f"{100 * kept:.1f} %", _cell((res["forward"][0], None), ours=True),
              _cell(res["symbolic"]), _cell(res["dual"]), ratio)
    return t


# ------------------------------------------------------------------ geomloss, per process


def _alias_pykeops() -> None:
    """geomloss's ``import pykeops...`` served by lazytensor."""
    try:
        import lazytensor.compat.pykeops as alias  # the full drop-in, where it exists
    except ImportError:
        import lazytensor.numpy as ltn
        import lazytensor.torch as ltt

        pk = types.ModuleType("pykeops")
        pk.torch, pk.numpy = ltt, ltn
        sys.modules.update({"pykeops": pk, "pykeops.torch": ltt, "pykeops.numpy": ltn,
                            "pykeops.torch.cluster": ltt.cluster,
                            "pykeops.numpy.cluster": ltt.cluster})
    else:
        alias.install()


def _geomloss_case(backend: str, n: int):
    import torch
    from geomloss import SamplesLoss

    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 3, generator=g).requires_grad_()
    y = (torch.rand(n, 3, generator=g) * 0.8 + 0.1).requires_grad_()
    loss = SamplesLoss("sinkhorn", p=2, blur=0.05, scaling=0.5, backend=backend)

    def run():
        torch.autograd.grad(loss(x, y), (x, y))
    return run


def worker(which: str) -> int:
    """Runs geomloss cases named on stdin (``backend n``), prints each call's seconds."""
    reply = os.fdopen(os.dup(1), "w")  # the replies; anything printed goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    if which == "lazytensor":
        _alias_pykeops()
    cases = {}
    for line in sys.stdin:
        backend, n = line.split()
        key = (backend, int(n))
        try:
            if key not in cases:
                cases[key] = _geomloss_case(*key)
            t0 = time.perf_counter()
            cases[key]()
            print(json.dumps(time.perf_counter() - t0), file=reply, flush=True)
        except Exception as e:  # noqa: BLE001 - reported as the cell
            print(json.dumps(f"failed: {type(e).__name__}: {str(e)[:60]}"), file=reply,
                  flush=True)
    return 0


class _Worker:
    def __init__(self, which: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.bench_ranges",
                                      "--worker", which], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def __call__(self, backend: str, n: int):
        self.proc.stdin.write(f"{backend} {n}\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        if isinstance(out, str):
            raise RuntimeError(out)
        return out

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def client_table(args) -> Table:
    try:
        import geomloss  # noqa: F401
    except ImportError as e:
        t = Table("geomloss", ["case"], f"geomloss not installed ({e}); pip install geomloss")
        return t
    KLT, why = _pykeops()
    t = _start(Table("Client: geomloss SamplesLoss('sinkhorn', p=2, blur=0.05, scaling=0.5), "
                     "loss + gradients, D = 3",
                     ["backend", "N = M", "lazytensor", "pykeops 2.3", "geomloss tensorized"],
                     "Each contender in a worker process of its own, called in turns; ×: "
                     "median over rounds of its time / lazytensor's (> 1: we are faster). "
                     "tensorized: dense torch (N×M matrices), skipped past "
                     f"{args.dense_limit:,} points."))
    workers = {"lazytensor": _Worker("lazytensor")}
    if KLT is not None:
        workers["pykeops"] = _Worker("pykeops")
    try:
        for backend, n in args.client_cases:
            cont = {name: (lambda w=w, b=backend, n=n: w(b, n)) for name, w in workers.items()}
            if n <= args.dense_limit:
                cont["tensorized"] = lambda n=n: workers["lazytensor"]("tensorized", n)
            res = _compare_reported(cont, args.rounds, args.client_budget)
            t.add(backend, f"{n:,}", _cell(res["lazytensor"], ours=True),
                  _cell(res["pykeops"]) if "pykeops" in res else why,
                  _cell(res["tensorized"]) if "tensorized" in res else "skipped (memory)")
    finally:
        for w in workers.values():
            w.close()
    return t


def _compare_reported(contenders: dict, rounds: int, budget: float) -> dict:
    """:func:`benchmarks.bench.compare` on functions that return their own time (the
    worker's, without the pipe)."""
    names = list(contenders)
    times = {n: [] for n in names}
    for n in names:  # warm-up: compiles; a contender over budget gets that call only
        try:
            first = contenders[n]()
        except Exception as e:  # noqa: BLE001
            times[n] = f"failed: {str(e)[:70]}"
            continue
        if first > budget:
            times[n] = [first]
    live = [n for n in names if isinstance(times[n], list) and not times[n]]
    for r in range(rounds):
        for n in live[r % len(live):] + live[: r % len(live)] if live else []:
            times[n].append(contenders[n]())
    out = {}
    for n in names:
        t = times[n]
        if isinstance(t, str):
            out[n] = t
        elif n not in live:
            out[n] = (t[0], None)
        else:
            ref = times[names[0]]
            ratios = [a / b for a, b in zip(t, ref)] if names[0] in live else []
            out[n] = (statistics.median(t), statistics.median(ratios) if ratios else None)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--write", metavar="FILE")
    p.add_argument("--tables", default="ranges,client",
                   help="comma-separated: ranges, grad (log-sum-exp gradients), client")
    p.add_argument("--cases", help="client cases, e.g. multiscale:2000,online:2000")
    p.add_argument("--client-budget", type=float, default=None,
                   help="seconds a client call may take before its contender stops")
    p.add_argument("--worker", choices=("lazytensor", "pykeops"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    configure(args)
    if args.cases:
        args.client_cases = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases.split(",")]
    print(f"machine: {machine()}")
    which = args.tables.split(",")
    tables = ([ranges_table(args)] if "ranges" in which else []) + (
        [grad_table(args)] if "grad" in which else []) + (
        [client_table(args)] if "client" in which else [])
    if args.write:
        with open(args.write, "w") as f:
            f.write(f"Machine: {machine()}.\n\n" + "\n".join(t.markdown() for t in tables))
    return 0


def configure(args) -> None:
    """Sizes and budgets of the two tables (``args.quick``, ``args.rounds``)."""
    quick = getattr(args, "quick", False)
    args.rounds = getattr(args, "rounds", None) or (3 if quick else 5)
    args.budget = getattr(args, "budget", None) or (5.0 if quick else 60.0)
    args.ranges_sizes = [20_000] if quick else [100_000]
    args.grad_sizes = [5_000] if quick else [20_000]
    args.client_cases = ([("online", 2000), ("multiscale", 2000)] if quick else
                         [("online", 2000), ("multiscale", 2000), ("multiscale", 50_000)])
    args.dense_limit = 20_000
    args.client_budget = getattr(args, "client_budget", None) or (120.0 if quick else 600.0)


if __name__ == "__main__":
    sys.exit(main())
