"""Benchmarks: this engine against dense torch, pykeops (when importable) and an expert loop.

``python -m benchmarks.bench [--suite core|grad|cpu|dual|gpytorch|peers|all] [--quick] [--write BENCHMARKS.md]``
(``--help`` lists what each suite measures).

Method. Every table row runs its contenders in turns, one call each per round, the
order rotating from round to round, so that a machine whose speed drifts (other jobs, a
core's clock) slows them alike; a row reports each contender's median time and the
median over rounds of the per-round ratio to this engine. A contender whose estimated
time exceeds the budget is skipped (its cell says so). Contenders:

- ``lazytensor``: ``(-Vi(x).sqdist(Vj(y)) / s2).exp() @ b`` and friends, float32;
- ``torch``: the dense matmul formulation ``|x|² + |y|² - 2 x yᵀ`` on chunks of rows
  (whole when it fits in ``--dense-mb``), then ``exp``, ``@ b`` / ``topk`` / ``logsumexp``;
- ``pykeops``: the same formula through ``pykeops.torch.LazyTensor`` (``pip install
  pykeops==2.3``, the ``bench`` extra), when it imports and compiles;
- ``expert loop``: the hand-written C loop of :mod:`benchmarks.expert` for the Gaussian
  D=3 product (base-2 scaled coordinates, a degree-6 polynomial exp, each loaded y_j
  serving 4 rows, float32 block accumulators flushed to float64), compiled here with the
  compiler and flags of the kernels; our pairs/s as a % of its pairs/s.

Peak memory: in a fresh process, after a warm-up call, the resident set size sampled every
0.5 ms during one call, minus its value before the call (inputs excluded).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

# ------------------------------------------------------------------ timing


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def compare(contenders: dict, rounds: int, budget: float, estimates: dict | None = None) -> dict:
    """{name: (median seconds, median ratio to the first contender) or a skip note}.

    Contenders run in turns, one call each per round, the order rotating every round.
    A contender whose ``estimates`` (seconds, from smaller sizes) exceed ``budget`` is
    skipped; the others are first called once (warm-up, and a time check): one that took
    more than ``budget`` seconds runs no further rounds.
    """
    names = list(contenders)
    times = {n: [] for n in names}
    for n in names:  # warm-up: compiles, caches, and tells how long a call takes
        est = (estimates or {}).get(n)
        if est is not None and est > budget and n != names[0]:  # never skip the reference
            times[n] = f"skipped (est. {_fmt_time(est)})"
            continue
        try:
            t = _timed(contenders[n])
        except Exception as e:  # noqa: BLE001 - a contender that fails is reported, not fatal
            times[n] = f"failed: {type(e).__name__}: {str(e)[:60]}"
            continue
        if t > budget:
            times[n] = [t]
    live = [n for n in names if isinstance(times[n], list) and not times[n]]
    for r in range(rounds):
        order = live[r % len(live):] + live[: r % len(live)] if live else []
        for n in order:
            times[n].append(_timed(contenders[n]))
    out = {}
    ref = names[0]
    for n in names:
        t = times[n]
        if isinstance(t, str):
            out[n] = t
        elif n not in live:
            out[n] = (t[0], None)  # one (warm-up) call only: over budget
        else:
            ratios = ([a / b for a, b in zip(t, times[ref])]
                      if isinstance(times[ref], list) and len(times[ref]) == len(t) else [])
            out[n] = (statistics.median(t), statistics.median(ratios) if ratios else None)
    return out


def _fmt_time(t: float) -> str:
    if t < 1e-3:
        return f"{t * 1e6:.0f} µs"
    if t < 1:
        return f"{t * 1e3:.1f} ms"
    return f"{t:.2f} s"


def _cell(res, pairs: int | None = None, ours: bool = False) -> str:
    if res is None:
        return "—"
    if isinstance(res, str):
        return res
    t, ratio = res
    text = _fmt_time(t)
    if pairs:
        text += f" ({pairs / t / 1e9:.2f} G/s)"
    if ratio is None and not ours:
        text += " (1 call, over budget)"
    elif ratio is not None and not ours:
        text += f" ×{ratio:.2f}"
    return text


class Table:
    def __init__(self, title: str, columns: list, note: str = ""):
        self.title, self.columns, self.note, self.rows = title, columns, note, []

    def add(self, *cells):
        self.rows.append([str(c) for c in cells])
        print("  " + " | ".join(self.rows[-1]), flush=True)

    def markdown(self) -> str:
        lines = [f"### {self.title}", ""]
        if self.note:
            lines += [self.note, ""]
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "---|" * len(self.columns))
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(lines) + "\n"


def _start(table: Table) -> Table:
    print(f"\n{table.title}\n  " + " | ".join(table.columns), flush=True)
    return table


# ------------------------------------------------------------------ contenders


def _data(N: int, M: int, D: int, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.rand(N, D, generator=g)
    y = torch.rand(M, D, generator=g)
    b = torch.randn(M, 1, generator=g)
    s2 = 0.01 * D  # unit cube: about 1/10 of the squared diameter
    return x, y, b, s2


def ours_gauss(x, y, b, s2):
    from lazytensor import Vi, Vj

    return (-Vi(x).sqdist(Vj(y)) / s2).exp() @ b


def _dense_chunks(x, y, dense_bytes: int, temps: int = 2):
    """Row chunks of x such that ``temps`` (rows x M) float32 matrices fit the budget."""
    rows = max(1, dense_bytes // (temps * 4 * max(1, y.shape[0])))
    return [(i, min(i + rows, x.shape[0])) for i in range(0, x.shape[0], rows)]


def _dense_d2(xc, y, y2):
    import torch

    d2 = torch.addmm(y2[None, :], xc, y.T, beta=1, alpha=-2)
    d2.add_((xc * xc).sum(1, keepdim=True)).clamp_(min=0)
    return d2


def torch_gauss(x, y, b, s2, dense_bytes):
    import torch

    y2 = (y * y).sum(1)
    out = torch.empty(x.shape[0], b.shape[1])
    for i0, i1 in _dense_chunks(x, y, dense_bytes):
        out[i0:i1] = _dense_d2(x[i0:i1], y, y2).mul_(-1 / s2).exp_() @ b
    return out


def torch_argkmin(x, y, K, dense_bytes):
    import torch

    y2 = (y * y).sum(1)
    out = torch.empty(x.shape[0], K, dtype=torch.int64)
    for i0, i1 in _dense_chunks(x, y, dense_bytes):
        out[i0:i1] = _dense_d2(x[i0:i1], y, y2).topk(K, dim=1, largest=False).indices
    return out


def torch_lse(x, y, s2, dense_bytes):
    import torch

    y2 = (y * y).sum(1)
    out = torch.empty(x.shape[0], 1)
    for i0, i1 in _dense_chunks(x, y, dense_bytes):
        out[i0:i1, 0] = torch.logsumexp(_dense_d2(x[i0:i1], y, y2).mul_(-1 / s2), dim=1)
    return out


def _pykeops():
    """pykeops's torch LazyTensor, or None (with the reason) when it is not usable."""
    try:
        from pykeops.torch import LazyTensor as KeopsLazyTensor
    except Exception as e:  # noqa: BLE001
        return None, f"not installed ({type(e).__name__})"
    return KeopsLazyTensor, ""


def keops_gauss(KLT, x, y, b, s2):
    return ((-((KLT(x[:, None, :]) - KLT(y[None, :, :])) ** 2).sum(-1) / s2).exp() @ b)


class Roofline:
    """The expert loop of :mod:`benchmarks.expert` (the D = 3 Gaussian product, compiled
    like the kernels), in the core suite's Gaussian D = 3 table."""

    def __init__(self):
        from .expert import ExpertLoops

        self.loops = ExpertLoops()

    def __call__(self, x, y, b, s2, threads):
        return self.loops.gauss3(x, y, b, s2, threads)


# ------------------------------------------------------------------ suites


def gauss_table(D: int, sizes: list, args, roofline=None) -> Table:
    from lazytensor.backends.cpu import runtime

    KLT, why = _pykeops()
    cols = ["N = M", "lazytensor", "torch dense (×: its time / ours)"]
    if roofline is not None:
        cols += ["expert loop", "ours / expert loop"]
    cols.append("pykeops")
    t = _start(Table(f"Gaussian kernel product, D = {D}, float32", cols,
                     f"{runtime.num_threads()} threads; time (billion pairs/s); ×: median over "
                     "rounds of the per-round time ratio to lazytensor (> 1: we are faster)."))
    if KLT is not None:  # compile pykeops's kernel before timing it
        t0 = time.perf_counter()
        keops_gauss(KLT, *_data(64, 64, D))
        t.note += (f" pykeops: first call {_fmt_time(time.perf_counter() - t0)} (its compile, "
                   "unless its cache had the kernel).")
    per_pair: dict = {}
    for n in sizes:
        estimates = {k: v * n * n for k, v in per_pair.items()}
        res = compare(_gauss_contenders(_data(n, n, D), args, roofline, KLT), args.rounds,
                      args.budget, estimates)
        per_pair.update({k: r[0] / (n * n) for k, r in res.items() if isinstance(r, tuple)})
        row = [f"{n:,}", _cell(res["ours"], n * n, True), _cell(res["torch"], n * n)]
        if roofline is not None:
            r = res["roof"]
            # r[1]: median of roofline time / our time = our pairs/s over the roofline's
            pct = (f"{100 * r[1]:.0f} %" if isinstance(r, tuple) and r[1] else "—")
            row += [_cell((r[0], None), n * n, True) if isinstance(r, tuple) else r, pct]
        row.append(_cell(res["keops"], n * n) if KLT is not None else why)
        t.add(*row)
    return t


def _gauss_contenders(data, args, roofline, KLT) -> dict:
    from lazytensor.backends.cpu import runtime

    x, y, b, s2 = data
    cont = {"ours": lambda: ours_gauss(x, y, b, s2),
            "torch": lambda: torch_gauss(x, y, b, s2, args.dense_mb << 20)}
    if roofline is not None:
        cont["roof"] = lambda: roofline(x, y, b, s2, runtime.num_threads())
    if KLT is not None:
        cont["keops"] = lambda: keops_gauss(KLT, x, y, b, s2)
    return cont


def _reduction_contenders(name: str, data, args, KLT=None) -> dict:
    from lazytensor import Vi, Vj

    x, y, _, s2 = data
    if name.startswith("argKmin"):
        cont = {"ours": lambda: Vi(x).sqdist(Vj(y)).argKmin(10, dim=1),
                "torch": lambda: torch_argkmin(x, y, 10, args.dense_mb << 20)}
        if KLT is not None:
            cont["keops"] = lambda: (((KLT(x[:, None, :]) - KLT(y[None, :, :])) ** 2).sum(-1)
                                     .argKmin(10, dim=1))
        return cont
    cont = {"ours": lambda: (-Vi(x).sqdist(Vj(y)) / s2).logsumexp(dim=1),
            "torch": lambda: torch_lse(x, y, s2, args.dense_mb << 20)}
    if KLT is not None:
        cont["keops"] = lambda: ((-((KLT(x[:, None, :]) - KLT(y[None, :, :])) ** 2).sum(-1) / s2)
                                 .logsumexp(dim=1))
    return cont


def reductions_table(args, sizes) -> Table:
    KLT, why = _pykeops()
    t = _start(Table("argKmin (K = 10) and LogSumExp, float32",
                     ["reduction", "D", "N = M", "lazytensor", "torch dense", "pykeops"],
                     "torch: chunked |x|²+|y|²-2xyᵀ then topk / logsumexp; pykeops: the same "
                     "formula as a pykeops LazyTensor" + (f" ({why})" if KLT is None else "")
                     + "; ×: its time / ours."))
    for name, D in (("argKmin K=10", 3), ("argKmin K=10", 64), ("LogSumExp", 3), ("LogSumExp", 64)):
        per_pair: dict = {}
        if KLT is not None:  # compile pykeops's kernel outside the timings
            small = _data(200, 200, D)
            _reduction_contenders(name, small, args, KLT)["keops"]()
        for n in sizes:
            res = compare(_reduction_contenders(name, _data(n, n, D), args, KLT), args.rounds,
                          args.budget, {k: v * n * n for k, v in per_pair.items()})
            per_pair.update({k: r[0] / (n * n) for k, r in res.items() if isinstance(r, tuple)})
            keops = _cell(res["keops"], n * n) if "keops" in res else "—"
            t.add(name, D, f"{n:,}", _cell(res["ours"], n * n, True), _cell(res["torch"], n * n),
                  keops)
    return t


def _wide_contenders(name: str, n: int, D: int, E: int, args, KLT=None) -> dict:
    import torch

    from lazytensor import Vi, Vj

    g = torch.Generator().manual_seed(n + D + E)
    x, y = torch.rand(n, D, generator=g), torch.rand(n, D, generator=g)
    v = torch.randn(n, E, generator=g)
    s2 = 0.01 * D
    dense = args.dense_mb << 20
    if name == "K @ V":
        cont = {"ours": lambda: (-Vi(x).sqdist(Vj(y)) / s2).exp() @ v,
                "torch": lambda: torch_gauss(x, y, v, s2, dense)}
        if KLT is not None:
            cont["keops"] = lambda: keops_gauss(KLT, x, y, v, s2)
        return cont
    q, k = x / D**0.5, y  # softmax(q kᵀ) v, one head

    def torch_attention():
        out = torch.empty(n, E)
        for i0, i1 in _dense_chunks(q, k, dense):
            out[i0:i1] = torch.softmax(q[i0:i1] @ k.T, dim=1) @ v
        return out

    cont = {"ours": lambda: (Vi(q) | Vj(k)).sumsoftmaxweight(Vj(v), dim=1),
            "torch": torch_attention}
    if KLT is not None:
        cont["keops"] = lambda: ((KLT(q[:, None, :]) | KLT(k[None, :, :]))
                                 .sumsoftmaxweight(KLT(v[None, :, :]), dim=1))
    return cont


def wide_table(args, sizes) -> Table:
    """Reductions whose terms are vectors: K @ V with E columns, softmax attention."""
    KLT, why = _pykeops()
    t = _start(Table("Vector-valued terms: K @ V (Gaussian) and softmax attention, float32",
                     ["what", "D", "E", "N = M", "lazytensor", "torch dense", "pykeops"],
                     "V has E columns; attention: Σ_j softmax_j(q_i·k_j) v_j (pykeops: "
                     "sumsoftmaxweight)" + (f"; pykeops {why}" if KLT is None else "")
                     + "; ×: its time / ours."))
    for name, D, E in (("K @ V", 3, 64), ("K @ V", 64, 64), ("attention", 64, 64)):
        per_pair: dict = {}
        if KLT is not None:
            _wide_contenders(name, 64, D, E, args, KLT)["keops"]()
        for n in sizes:
            res = compare(_wide_contenders(name, n, D, E, args, KLT), args.rounds, args.budget,
                          {k: v * n * n for k, v in per_pair.items()})
            per_pair.update({k: r[0] / (n * n) for k, r in res.items() if isinstance(r, tuple)})
            keops = _cell(res["keops"], n * n) if "keops" in res else "—"
            t.add(name, D, E, f"{n:,}", _cell(res["ours"], n * n, True),
                  _cell(res["torch"], n * n), keops)
    return t


OVERHEAD_N = 200  # points on each side in the call-overhead table


def overhead_table(args) -> Table:
    """First call (compile), cached small calls with and without gradients, disk-cache hit
    in a new process."""
    import torch

    from lazytensor import Vi, Vj
    from lazytensor.core import call as dispatch
    from lazytensor.engine import plans as engine

    n = OVERHEAD_N
    t = _start(Table(f"Call overheads, N = M = {n}, D = 3", ["what", "time", "how measured"]))
    # first call of a never-seen formula: a fresh private cache, so render + compile + load
    with tempfile.TemporaryDirectory(prefix="lazytensor-bench-cache-") as d:
        code = _NEW_PROCESS.format(cache=d, repeat=1, n=n)
        first = _run_json(code)
        hits = [_run_json(code) for _ in range(3)]
    t.add("first call of a new formula", _fmt_time(first["first"]),
          "new process, empty cache: build the formula, render, compile, load, run")
    t.add("disk-cache hit in a new process", _fmt_time(statistics.median(h["first"] for h in hits)),
          f"median of 3 processes (each: import {statistics.median(h['import'] for h in hits):.2f}"
          " s, not counted), first call with the kernel on disk")
    x, y, b = torch.rand(n, 3), torch.rand(n, 3), torch.rand(n, 1)
    K = (-Vi(x).sqdist(Vj(y))).exp()
    S = K * Vj(b)
    plan = engine.prepare(S.formula, S.variables, "sum", 1, {})
    arrays = [v.data for v in S.variables]
    dispatch.execute(plan.call, arrays)
    launch = plan.call.memo["executor"][1].launch
    outs = [torch.empty(n, 1)]
    args_ = launch.args_type(launch.N, launch.M, launch.nbd, 1, 0, *launch.tables,
                             *[a.data_ptr() for a in arrays], outs[0].data_ptr())
    addr = ctypes.addressof(args_)
    kernel_only = _median_call(lambda: launch.fn(addr), 3000)
    reduce_only = _median_call(lambda: S.sum(dim=1), 3000)
    matmul = _median_call(lambda: K @ b, 3000)
    t.add("kernel alone (C call, no Python)", _fmt_time(kernel_only), "median of 3000 calls")
    t.add("S.sum(dim=1), S = K * Vj(b) built once", _fmt_time(reduce_only),
          f"median of 3000 calls; overhead over the kernel {_fmt_time(reduce_only - kernel_only)}")
    t.add("K @ b (builds K * b, then reduces)", _fmt_time(matmul),
          f"median of 3000 calls; overhead over the kernel {_fmt_time(matmul - kernel_only)}")
    xg = x.clone().requires_grad_(True)
    Kg = (-Vi(xg).sqdist(Vj(y))).exp()
    for mode, what in (("auto", "grad_mode auto: the same kernel, through autograd (dual mode "
                                "only from 2^16 pairs on)"),
                       ("dual", 'grad_mode="dual": the fused kernel also sums 3 tangents')):
        tg, ratio = _median_ratio(lambda mode=mode: Kg.__matmul__(b, grad_mode=mode),
                                  lambda: K @ b)
        t.add(f"K @ b, x requires grad, {mode} (forward)", _fmt_time(tg),
              f"{what}; ×{ratio:.2f} the call without grad (median of per-round ratios)")
    xs, ys, bs = (v.clone().requires_grad_(True) for v in (x, y, b))

    def forward_backward():
        ((-Vi(xs).sqdist(Vj(ys))).exp() @ bs).sum().backward()

    t.add("forward + backward in x, y, b", _fmt_time(_median_call(forward_backward, 300)),
          "median of 300 calls, formula built each time; the backward's kernels and VJP "
          "formulas come from the call's plan")
    dense = _median_call(lambda: torch.exp(-torch.cdist(x, y) ** 2) @ b, 3000)
    t.add("torch dense, same size (reference)", _fmt_time(dense), "median of 3000 calls")
    return t


def _median_ratio(fa, fb, rounds: int = 15, n: int = 200) -> tuple:
    """(median time of ``fa``, median over rounds of its time / ``fb``'s), alternating."""
    ta, ratios = [], []
    for r in range(rounds):
        pair = [(0, fa), (1, fb)] if r % 2 == 0 else [(1, fb), (0, fa)]
        got = {}
        for k, fn in pair:
            got[k] = _median_call(fn, n)
        ta.append(got[0])
        ratios.append(got[0] / got[1])
    return statistics.median(ta), statistics.median(ratios)


def _median_call(fn, n: int) -> float:
    for _ in range(20):
        fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


_NEW_PROCESS = """
import os, sys, time, json
os.environ["LAZYTENSOR_CACHE_DIR"] = {cache!r}
t0 = time.perf_counter()
import torch
from lazytensor import Vi, Vj
t1 = time.perf_counter()
x, y, b = torch.rand({n}, 3), torch.rand({n}, 3), torch.rand({n}, 1)
t2 = time.perf_counter()
(-Vi(x).sqdist(Vj(y)) * 1.37).exp() @ b
t3 = time.perf_counter()
print(json.dumps({{"import": t1 - t0, "first": t3 - t2}}))
"""


def _run_json(code: str) -> dict:
    repo = str(Path(__file__).resolve().parents[1])  # the child imports benchmarks.bench
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def split_j_table(args) -> Table:
    import torch

    from lazytensor.backends.cpu import runtime

    M = args.splitj_m
    t = _start(Table(f"One query against M = {M:,} points (split-j), Gaussian D = 3",
                     ["threads", "time", "speed-up over 1 thread", "memory bound"],
                     "The M × 16 bytes of y and b are read once per call: the bound is that "
                     "traffic at the copy bandwidth measured here (torch sum of a 160 MB array)."))
    x, y, b, s2 = _data(1, M, 3)
    big = torch.rand(4 * 10**7)
    saved = torch.get_num_threads()
    nmax = runtime.num_threads()

    def with_threads(k):
        def run():
            torch.set_num_threads(k)
            ours_gauss(x, y, b, s2)
        return run

    def bw():
        torch.set_num_threads(nmax)
        big.sum()

    bw_t = compare({"bw": bw}, args.rounds, args.budget)["bw"][0]
    bound = M * 16 / (big.numel() * 4 / bw_t)
    res = compare({"1": with_threads(1), str(nmax): with_threads(nmax)}, args.rounds, args.budget)
    torch.set_num_threads(saved)
    t.add(1, _fmt_time(res["1"][0]), "1", _fmt_time(bound))
    r = res[str(nmax)]
    t.add(nmax, _fmt_time(r[0]), f"{1 / r[1]:.2f}" if r[1] else "—", _fmt_time(bound))
    return t


def memory_table(args) -> Table:
    t = _start(Table("Peak memory of one call (fresh process: resident set size sampled every "
                     "0.5 ms during the call, minus before it)",
                     ["contender", "D", "N = M", "peak RSS growth", "dense N×M float32 would be"]))
    for who, D, n in (("lazytensor", 3, args.mem_n), ("torch", 3, args.mem_n),
                      ("lazytensor", 64, args.mem_n // 4), ("torch", 64, args.mem_n // 4)):
        code = _MEMORY.format(who=who, D=D, n=n, dense=args.dense_mb << 20)
        try:
            grew = _run_json(code)["grew"]
            cell = f"{grew / 2**20:,.1f} MiB"
        except Exception as e:  # noqa: BLE001
            cell = f"failed ({type(e).__name__})"
        t.add(who, D, f"{n:,}", cell, f"{n * n * 4 / 2**30:,.1f} GiB")
    return t


_MEMORY = """
import json, os, threading, time, torch
from benchmarks.bench import _data, ours_gauss, torch_gauss
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
x, y, b, s2 = _data({n}, {n}, {D})
small = _data(64, 64, {D})
f = (lambda *a: ours_gauss(*a)) if {who!r} == "lazytensor" else (lambda *a: torch_gauss(*a, {dense}))
f(*small)  # libraries loaded, kernel compiled
peak, done = [0], [False]
def sample():
    while not done[0]:
        peak[0] = max(peak[0], rss())
        time.sleep(0.0005)
before = rss()
t = threading.Thread(target=sample); t.start()
f(x, y, b, s2)
done[0] = True; t.join()
print(json.dumps({{"grew": max(0, max(peak[0], rss()) - before)}}))
"""


def _grad_contenders(n: int, D: int):
    """Two functions, each running forward and backward once: (forward s, backward s)."""
    import torch

    from lazytensor import Pm, Vi, Vj

    x, y, b, _ = _data(n, n, D)
    g = torch.randn(n, 1)
    sig = torch.tensor([0.1 * D ** 0.5])

    def leaves():
        return [v.clone().requires_grad_(True) for v in (x, y, sig)]

    def ours_fb():
        xs, ys, ss = leaves()
        t0 = time.perf_counter()
        a = (-Vi(xs).sqdist(Vj(ys)) / Pm(ss * ss)).exp() @ b
        t1 = time.perf_counter()
        (a * g).sum().backward()
        return t1 - t0, time.perf_counter() - t1

    def torch_fb():
        xs, ys, ss = leaves()
        t0 = time.perf_counter()
        d2 = ((xs * xs).sum(1)[:, None] + (ys * ys).sum(1)[None, :] - 2 * xs @ ys.T)
        a = torch.exp(-d2.clamp(min=0) / (ss * ss)) @ b
        t1 = time.perf_counter()
        (a * g).sum().backward()
        return t1 - t0, time.perf_counter() - t1

    return ours_fb, torch_fb


def _one_sided(fn):
    """``fn`` run with the backward's two sides in two kernels (LAZYTENSOR_TWO_SIDED=0)."""
    def run():
        saved = os.environ.get("LAZYTENSOR_TWO_SIDED")
        os.environ["LAZYTENSOR_TWO_SIDED"] = "0"
        try:
            return fn()
        finally:
            if saved is None:
                os.environ.pop("LAZYTENSOR_TWO_SIDED")
            else:
                os.environ["LAZYTENSOR_TWO_SIDED"] = saved
    return run


def grad_table(D: int, sizes: list, args) -> Table:
    """Forward and backward of the Gaussian product's loss, ours against dense autograd;
    from D = 16 on (dot products: the two-sided gradient kernel) also ours with the
    backward's two sides in two kernels, as before it. Contenders alternate within each
    round; bwd/fwd columns are medians of the per-round ratios."""
    two = D >= 16
    cols = ["N = M", "ours forward", "ours backward", "ours bwd/fwd"]
    if two:
        cols += ["bwd/fwd, two kernels", "two kernels / one (bwd)"]
    cols += ["torch forward", "torch backward", "torch/ours (fwd+bwd)"]
    note = ("loss = (a * g).sum() with a the product; torch: dense autograd (whole N×M "
            "matrices, skipped past the memory budget).")
    if two:
        note += (" Two kernels: the x-and-σ and the y gradients as separate Sums "
                 "(LAZYTENSOR_TWO_SIDED=0), the distances computed twice.")
    t = _start(Table(f"Gradient of the Gaussian kernel product, D = {D}, float32 "
                     "(w.r.t. x, y and σ)", cols, note))
    load = os.getloadavg()[0]
    for n in sizes:
        ours_fb, torch_fb = _grad_contenders(n, D)
        fits = n * n * 4 * 6 <= 4 * (args.dense_mb << 20)  # ~6 N×M temporaries in autograd
        order = [("ours", ours_fb)] + ([("two", _one_sided(ours_fb))] if two else []) + (
            [("torch", torch_fb)] if fits else [])
        for _, fn in order:
            fn()
        rounds = {name: [] for name, _ in order}
        for r in range(args.rounds):
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                rounds[name].append(fn())
        ours = rounds["ours"]
        of = statistics.median(f for f, _ in ours)
        ob = statistics.median(b_ for _, b_ in ours)
        row = [f"{n:,}", _fmt_time(of), _fmt_time(ob),
               f"{statistics.median(b_ / f for f, b_ in ours):.2f}"]
        if two:
            row += [f"{statistics.median(b_ / f for f, b_ in rounds['two']):.2f}",
                    f"×{statistics.median(t_[1] / o[1] for t_, o in zip(rounds['two'], ours)):.2f}"]
        if fits:
            tf = statistics.median(f for f, _ in rounds["torch"])
            tb = statistics.median(b_ for _, b_ in rounds["torch"])
            ratio = statistics.median((a[0] + a[1]) / (c[0] + c[1])
                                      for a, c in zip(rounds["torch"], ours))
            row += [_fmt_time(tf), _fmt_time(tb), f"×{ratio:.2f}"]
        else:
            row += ["skipped (memory)"] * 2 + ["—"]
        t.add(*row)
    t.note += (f" Load average {load:.1f} before, {os.getloadavg()[0]:.1f} after, on "
               f"{os.cpu_count()} CPUs (other jobs' load makes times noisy: read the ratios).")
    return t


# ------------------------------------------------------------------ driver


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    flags = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        flags = "AVX-512" if " avx512f" in text else ("AVX2" if " avx2" in text else "")
    except OSError:
        pass
    import torch

    return (f"{model}, {os.cpu_count()} CPUs ({flags}); torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads; Python {platform.python_version()}")


SUITES = {
    "core": "Gaussian kernel product D = 3 (with the expert loop) and D = 64; argKmin and "
            "LogSumExp; call overheads; one query against many points (split-j); peak memory",
    "grad": "gradient of the Gaussian kernel product (w.r.t. x, y, sigma), D = 3 and D = 64",
    "cpu": "Gaussian kernel product D = 3, 64, 256; vector-valued terms (K @ V, attention)",
    "ranges": "block-sparse ranges at the README's setting; geomloss Sinkhorn (online, "
              "multiscale) against pykeops and geomloss's tensorized backend "
              "(benchmarks.bench_ranges)",
    "dual": "fused (dual) against symbolic gradients, Gaussian and a branchy gate, D = 3",
    "gpytorch": "K @ V with 1 to 64 columns (GPyTorch's CG), float32 and float64, vs dense torch",
    "peers": "against dense torch, torch.compile, an expert C loop and (where installed) numba, "
             "JAX, faiss: Gaussian sum D = 3 / 64, k-NN, log-sum-exp, forward + backward; "
             "the machine's limit (benchmarks.peers)",
    "all": "every table of core, grad, cpu, dual and gpytorch (ranges and peers run alone: "
           "their third-party calls take minutes)",
}


def _plan(args) -> list:
    """The tables of ``args.suite``, in order: (title, function making the table)."""
    quick, suite = args.quick, args.suite
    sizes3 = [1000, 10_000] if quick else [1000, 10_000, 100_000, 200_000]
    sizes64 = [1000, 4000] if quick else [1000, 10_000, 30_000, 100_000]
    plan = []
    if suite in ("core", "all", "cpu"):
        plan.append(("Gaussian D = 3", lambda: gauss_table(3, sizes3, args, Roofline())))
        plan.append(("Gaussian D = 64", lambda: gauss_table(64, sizes64, args)))
    if suite in ("cpu", "all"):
        sizes256 = [1000, 4000] if quick else [1000, 10_000, 30_000]
        plan.append(("Gaussian D = 256", lambda: gauss_table(256, sizes256, args)))
        plan.append(("vector-valued terms",
                     lambda: wide_table(args, [2000] if quick else [10_000, 30_000])))
    if suite in ("core", "all"):
        plan.append(("argKmin and LogSumExp",
                     lambda: reductions_table(args, [2000] if quick else [10_000, 50_000])))
        plan.append(("call overheads", lambda: overhead_table(args)))
        plan.append(("split-j", lambda: split_j_table(args)))
        plan.append(("peak memory", lambda: memory_table(args)))
    if suite in ("grad", "all"):
        gsizes = [1000, 4000] if quick else [1000, 4000, 10_000, 30_000]
        plan.append(("gradient D = 3", lambda: grad_table(3, gsizes, args)))
        plan.append(("gradient D = 64", lambda: grad_table(64, gsizes, args)))
    if suite == "ranges":
        from benchmarks import bench_ranges

        bench_ranges.configure(args)
        plan.append(("block-sparse ranges", lambda: bench_ranges.ranges_table(args)))
        plan.append(("geomloss Sinkhorn", lambda: bench_ranges.client_table(args)))
    if suite in ("dual", "all"):
        from .bench_dual import dual_table

        plan.append(("fused gradients", lambda: dual_table(args, 4000 if quick else 20000)))
    if suite in ("gpytorch", "all"):
        from .gpytorch_shapes import gpytorch_table

        plan.append(("GPyTorch-shaped products", lambda: gpytorch_table(args)))
    if suite == "peers":
        from .peers import plan as peers_plan

        plan += peers_plan(args)
    return plan


def _elapsed(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes} min {seconds:02d} s" if minutes else f"{seconds} s"


def main(argv=None) -> int:
    suites = "\n".join(textwrap.fill(text, 88, initial_indent=f"  {name:9s}",
                                      subsequent_indent=" " * 11) for name, text in SUITES.items())
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench", description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"suites (--suite):\n{suites}\n\nEach table prints a '[k/n]' progress line, "
               "then its rows as they are measured.")
    p.add_argument("--suite", choices=tuple(SUITES), default="core",
                   help="which tables to measure (default: core; see below)")
    p.add_argument("--quick", action="store_true", help="small sizes, few rounds")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--budget", type=float, default=None, help="seconds a contender call may take")
    p.add_argument("--dense-mb", type=int, default=1024, help="memory for torch's dense chunks")
    p.add_argument("--threads", type=int, default=None,
                   help="threads of every contender (peers suite; default 2)")
    p.add_argument("--write", metavar="FILE", help="also write the tables (Markdown) to FILE")
    args = p.parse_args(argv)
    quick = args.quick
    args.rounds = args.rounds or (3 if quick else 5)
    args.budget = args.budget or (5.0 if quick else 30.0)
    args.splitj_m = 10**6 if quick else 10**7
    args.mem_n = 20_000 if quick else 100_000
    import torch

    torch.manual_seed(0)
    tables = []
    print(f"machine: {machine()}")
    plan = _plan(args)
    started = time.perf_counter()
    for k, (name, make_table) in enumerate(plan, 1):
        print(f"\n[{k}/{len(plan)}] {name} ({_elapsed(time.perf_counter() - started)} "
              "elapsed)", flush=True)
        tables.append(make_table())
    print(f"\n{len(plan)} tables in {_elapsed(time.perf_counter() - started)}")
    if args.write:
        words = list(argv if argv is not None else sys.argv[1:])
        words = ["FILE" if w == args.write else w.replace(args.write, "FILE") for w in words]
        cmd = "python -m benchmarks.bench " + " ".join(words)  # no machine path in the file
        head = (f"## {datetime.date.today().isoformat()}: `{cmd}`\n\n"
                f"Machine: {machine()}.\n\n")
        Path(args.write).write_text(head + "\n".join(t.markdown() for t in tables))
        print(f"\nwrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
