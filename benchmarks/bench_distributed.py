"""Scaling of distributed reductions over 1, 2 and 4 gloo ranks of this machine.

``python -m benchmarks.bench_distributed [--rounds 3] [--quick] [--write FILE]``

Method. Each round starts, for each number of ranks R in turn, R processes (spawn) with
``OMP_NUM_THREADS = max(1, cores // R)`` (so R ≤ cores uses each core once; R > cores is
*oversubscribed*: several ranks share a core and the table says so), warms every case up
once (kernel compiles, connections), then times one call per case: the slowest rank's
wall time (all ranks start together after a barrier). Rounds alternate the rank counts,
so that a machine whose speed drifts slows them alike; a row reports the median time
and the median over rounds of the per-round speedup ``T(1) / T(R)``.

- strong scaling: N = M fixed, rank r holds N/R rows of x and M/R rows of y, b;
- weak scaling: each rank holds a fixed number of rows of x (N grows with R) against
  a fixed M (sharded): the work per rank stays constant.

Every row runs on the same cores (one rank with all of them, or R ranks sharing them),
so adding ranks adds no compute here: *efficiency* is the ideal time over the measured
one, the ideal being T(1) times the work ratio (1 for strong scaling, R for weak
scaling). It measures what distributing costs (transfers not hidden, merges, waiting,
oversubscription), not a speedup; docs/scaling.md models machines that add compute.
The backward rows' kernel and wait seconds add those of both passes (ring only: the
all-gather's backward is torch's autograd through the gathered arrays, not timed apart).

``ring`` forces the ring of j-blocks, ``allgather`` the gathering of all j-blocks (the
mode "auto" picks below 4 MiB). The ring's *kernel s* and *wait s* are rank 0's seconds in
block kernels and in waiting for transfers after them; *comm s* is the time the same
transfers take alone (the ring with no kernels); *overlap* = 1 − wait / comm, the share
of the communication hidden behind the kernels (wait also counts waiting for a slower
neighbour, so load imbalance lowers it).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import tempfile
import time

import numpy as np
import torch

CASES = {  # name: (D, kind); sizes come from the arguments
    "Gaussian K @ b, D = 3": (3, "strong"),
    "Gaussian K @ b, D = 64": (64, "strong"),
    "Gaussian K @ b, D = 3, forward + backward": (3, "strong-grad"),
    "Gaussian K @ b, D = 3 (weak)": (3, "weak"),
}


def _sizes(kind: str, D: int, R: int, quick: bool) -> tuple:
    """(N total, M total) of a case on R ranks."""
    base = {3: 40_000, 64: 12_000}[D] // (2 if quick else 1)
    if kind == "weak":
        return base // 2 * R, base
    if kind == "strong-grad":
        return base // 2, base // 2
    return base, base


def _shard(n: int, R: int, r: int) -> slice:
    cuts = np.linspace(0, n, R + 1).astype(int)
    return slice(cuts[r], cuts[r + 1])


def _rank_main(rank: int, R: int, store: str, out: str, quick: bool):
    import torch.distributed as dist

    import lazytensor.distributed as ltd

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=R,
                            timeout=datetime.timedelta(seconds=600))
    rng = np.random.default_rng(0)
    results = {}
    for name, (D, kind) in CASES.items():
        N, M = _sizes(kind, D, R, quick)
        x = rng.random((N, D), dtype=np.float32) / D ** 0.5
        y = rng.random((M, D), dtype=np.float32) / D ** 0.5
        b = rng.standard_normal((M, 1)).astype(np.float32)
        rows, cols = _shard(N, R, rank), _shard(M, R, rank)
        grad = kind == "strong-grad"
        xs = torch.from_numpy(x[rows]).requires_grad_(grad)
        ys = torch.from_numpy(y[cols]).requires_grad_(grad)
        bs = torch.from_numpy(b[cols])
        for mode in ("ring", "allgather") if R > 1 else ("local",):
            sharding = ltd.Sharding(mode=mode if R > 1 else "auto")
            _gauss_call(xs, ys, bs, sharding, grad)  # warm-up: compiles, connections
            dist.barrier()
            start = time.perf_counter()
            _gauss_call(xs, ys, bs, sharding, grad)
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            stats = ltd.last_stats()  # ring: both passes; else the forward only
            phases = [st for ph, st in stats.items() if grad or ph == "forward"]
            if grad and "backward" not in stats:
                phases = []
            comm = _comm_only(R, rank, cols, D, M) if mode == "ring" else None
            results[f"{name}|{mode}"] = {
                "N": N, "M": M, "time": elapsed.item(), "comm": comm,
                "kernel": sum(st["compute_s"] for st in phases) if phases else None,
                "wait": sum(st["wait_s"] for st in phases) if phases else None}
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def _gauss_call(xs, ys, bs, sharding, grad: bool):
    from lazytensor import Vi, Vj

    a = ((-Vi(xs).sqdist(Vj(ys))).exp() * Vj(bs)).sum(dim=1, group=sharding)
    if grad:
        a.sum().backward()


def _comm_only(R: int, rank: int, cols: slice, D: int, M: int) -> float:
    """Seconds for the ring's R-1 forward transfers alone (the same buffers, no kernels)."""
    import torch.distributed as dist

    sizes = [(_shard(M, R, k).stop - _shard(M, R, k).start) * (D + 1) for k in range(R)]
    cur = torch.zeros(sizes[rank], dtype=torch.float32)
    dist.barrier()
    start = time.perf_counter()
    for t in range(R - 1):
        nxt = torch.empty(sizes[(rank - t - 1) % R], dtype=torch.float32)
        ops = [dist.P2POp(dist.isend, cur, (rank + 1) % R, tag=t),
               dist.P2POp(dist.irecv, nxt, (rank - 1) % R, tag=t)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        cur = nxt
    return time.perf_counter() - start


def run_ranks(R: int, quick: bool) -> dict:
    ctx = torch.multiprocessing.get_context("spawn")
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = str(max(1, cores // R))
        try:
            procs = [ctx.Process(target=_rank_main, args=(r, R, os.path.join(tmp, "store"),
                                                          os.path.join(tmp, "out.json"), quick))
                     for r in range(R)]
            for p in procs:
                p.start()
        finally:
            if saved is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = saved
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            raise RuntimeError(f"a rank of {R} failed: exit codes {[p.exitcode for p in procs]}")
        with open(os.path.join(tmp, "out.json")) as f:
            return json.load(f)


def _fmt(t) -> str:
    if t is None:
        return "–"
    return f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.2f} s"


def table(rounds: list, ranks: list) -> str:
    cores = os.cpu_count() or 1
    lines = ["| case | ranks × threads | mode | N | M | time | T(1) / T(R) | efficiency | "
             "kernel s | wait s | comm s | overlap |", "|" + "---|" * 12]
    for name, (_, kind) in CASES.items():
        for R in ranks:
            for mode in ("ring", "allgather") if R > 1 else ("local",):
                key = f"{name}|{mode}"
                per = [rd[R][key] for rd in rounds]
                base = [rd[1][f"{name}|local"]["time"] for rd in rounds]
                ratios = [b / p["time"] for b, p in zip(base, per)]
                speed = statistics.median(ratios)
                # every row uses all the cores: the ideal time is T(1) times the work ratio
                eff = speed * (R if kind == "weak" else 1)
                wait = statistics.median(p["wait"] for p in per) if per[0]["wait"] is not None \
                    else None
                comm = statistics.median(p["comm"] for p in per) if per[0]["comm"] else None
                overlap = (f"{max(0.0, 1 - wait / comm):.0%}" if comm and wait is not None
                           and mode == "ring" else "–")
                threads = max(1, cores // R)
                label = f"{R} × {threads}" + (" (oversubscribed)" if R > cores else "")
                lines.append(
                    f"| {name} | {label} | {mode} | {per[0]['N']:,} | {per[0]['M']:,} | "
                    f"{_fmt(statistics.median(p['time'] for p in per))} | ×{speed:.2f} | "
                    f"{eff:.0%} | {_fmt(statistics.median(p['kernel'] for p in per)) if per[0]['kernel'] is not None else '–'} | "
                    f"{_fmt(wait)} | {_fmt(comm)} | {overlap} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--quick", action="store_true", help="half the sizes")
    ap.add_argument("--write", metavar="FILE", help="append the table to FILE")
    args = ap.parse_args(argv)
    ranks = [int(r) for r in args.ranks.split(",")]
    if ranks[0] != 1:
        ranks = [1, *ranks]
    load_before = os.getloadavg()
    rounds = []
    for k in range(args.rounds):
        order = ranks if k % 2 == 0 else ranks[::-1]
        rounds.append({R: run_ranks(R, args.quick) for R in order})
        print(f"round {k + 1}/{args.rounds} done", flush=True)
    load_after = os.getloadavg()
    head = (f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
            f"torch {torch.__version__}; gloo on loopback; {args.rounds} rounds; load average "
            f"{load_before[0]:.1f} before, {load_after[0]:.1f} after.")
    text = head + "\n\n" + table(rounds, ranks) + "\n"
    print(text)
    if args.write:
        with open(args.write, "a") as f:
            f.write(f"\n## {datetime.date.today()}: `python -m benchmarks.bench_distributed "
                    f"--rounds {args.rounds}{' --quick' if args.quick else ''}`\n\n" + text)


if __name__ == "__main__":
    main()
