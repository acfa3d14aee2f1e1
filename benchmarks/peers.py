"""The peers suite: this engine against what a demanding user would write instead.

``python -m benchmarks.bench --suite peers [--quick] [--rounds R] [--budget S]``

Workloads (float32; x, y uniform in the unit cube, b standard normal, s2 = 0.01 D):
Gaussian sum ``a_i = sum_j exp(-|x_i - y_j|^2 / s2) b_j`` at D = 3 (N = M = 30,000) and
D = 64 (N = M = 10^4 and 3 * 10^4); k-NN (K = 10) at the same sizes; log-sum-exp at D = 3;
forward + backward in x of the D = 3 Gaussian sum (the value and the gradient of
``(a * g).sum()``).

Contenders (:mod:`benchmarks.peer_contenders`, :mod:`benchmarks.expert`): lazytensor;
dense torch (blocks of rows, ``|x|^2 + |y|^2 - 2 x y^T`` by BLAS); torch.compile
(inductor) of the sum-over-j form; the expert C loop (D = 3 sum, and its fused value +
gradient); where installed (the ``bench`` extra) numba loops written by hand, JAX
(``lax.map`` over row blocks, jit) and faiss (``IndexFlatL2``, k-NN). A contender whose
package is missing is skipped with a note.

Method: as the other suites (:func:`benchmarks.bench.compare`): one call each per round,
the order rotating, medians of times and of the per-round ratio contender / lazytensor.
Every result is checked against float64 on a subsample of rows (all M columns): sums by
relative 2-norm error, log-sum-exp by its largest absolute error (the relative error of
the sum), k-NN by the largest error of the K chosen distances (float64, sorted) against
the K smallest, relative to the K-th. All contenders run on the same number of threads
(``--threads``, default 2): torch.set_num_threads (which our kernels follow), numba's
set_num_threads, OpenMP for the expert loop and faiss; JAX uses its own pool.

Limit (:mod:`benchmarks.floor`): the measured vector throughput of FMAs, adds and both
(one core, in CPU time, times the threads), and the operations per pair of our generated
loop (and of the expert loop), give a floor in Gpairs/s; rows show their pairs/s as a %
of our loop's floor. On a machine shared with other jobs the contenders' wall times, and
so these percentages, are lowered by the others' load; the floor is not.
"""

from __future__ import annotations

import dataclasses

from . import peer_contenders as pc
from .bench import Table, _fmt_time, _start, compare

TOLERANCE = {"gauss": 1e-4, "grad": 1e-4, "lse": 1e-4, "knn": 1e-3}
TITLES = {"gauss": "Gaussian sum", "knn": "k-NN, K = 10", "lse": "log-sum-exp",
          "grad": "Gaussian sum, forward + backward in x"}


@dataclasses.dataclass(frozen=True)
class Workload:
    kind: str  # gauss, knn, lse, grad
    D: int
    N: int
    M: int

    @property
    def title(self) -> str:
        return f"{TITLES[self.kind]}, D = {self.D}, N = M = {self.N:,}" if self.N == self.M \
            else f"{TITLES[self.kind]}, D = {self.D}, N = {self.N:,}, M = {self.M:,}"


WORKLOADS = (Workload("gauss", 3, 30_000, 30_000), Workload("gauss", 64, 10_000, 10_000),
             Workload("gauss", 64, 30_000, 30_000), Workload("knn", 3, 30_000, 30_000),
             Workload("knn", 64, 10_000, 10_000), Workload("knn", 64, 30_000, 30_000),
             Workload("lse", 3, 30_000, 30_000), Workload("grad", 3, 30_000, 30_000))


# ------------------------------------------------------------------ data and float64


def make_data(w: Workload, seed: int = 0) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    return {"x": torch.rand(w.N, w.D, generator=g), "y": torch.rand(w.M, w.D, generator=g),
            "b": torch.randn(w.M, 1, generator=g), "g": torch.randn(w.N, generator=g),
            "s2": 0.01 * w.D}


def reference(w: Workload, data: dict, rows: int = 256, seed: int = 1) -> dict:
    """float64 results on a subsample of rows (all columns): {"rows", kind's values}."""
    import torch

    idx = torch.randperm(w.N, generator=torch.Generator().manual_seed(seed))[:rows].sort().values
    x, y = data["x"][idx].double(), data["y"].double()
    b, s2 = data["b"].double(), data["s2"]
    d2 = ((x * x).sum(1)[:, None] + (y * y).sum(1)[None, :] - 2 * x @ y.T).clamp_(min=0)
    ref = {"rows": idx}
    if w.kind == "knn":
        ref["d2"] = d2
        ref["best"] = d2.topk(pc.KNN_K, dim=1, largest=False).values
    elif w.kind == "lse":
        ref["lse"] = torch.logsumexp(-d2 / s2, dim=1)
    else:
        e = torch.exp(-d2 / s2)
        ref["a"] = (e @ b)[:, 0]
        if w.kind == "grad":
            wgt = e * b[:, 0][None, :]
            gi = data["g"][idx].double()
            ref["gx"] = (-2 / s2) * gi[:, None] * (x * wgt.sum(1)[:, None] - wgt @ y)
    return ref


def _f64(v):
    import numpy as np
    import torch

    if isinstance(v, torch.Tensor):
        return v.detach().double()
    return torch.from_numpy(np.array(v, dtype=np.float64))


def error(w: Workload, result, ref: dict) -> float:
    """The contender's error against float64 (see the module's docstring)."""
    import torch

    rows = ref["rows"]
    if w.kind == "knn":
        import numpy as np

        ind = torch.from_numpy(np.asarray(result, dtype=np.int64)) if not isinstance(
            result, torch.Tensor) else result.long()
        ind = ind.reshape(w.N, pc.KNN_K)[rows]
        if ind.min() < 0 or ind.max() >= w.M:
            return float("inf")
        got = ref["d2"].gather(1, ind).sort(dim=1).values
        return ((got - ref["best"]).abs().max(1).values / ref["best"][:, -1]).max().item()
    if w.kind == "lse":
        return (_f64(result).reshape(-1)[rows] - ref["lse"]).abs().max().item()

    def rel(a, r):
        return ((a - r).norm() / r.norm()).item()

    if w.kind == "grad":
        a, gx = result
        return max(rel(_f64(a).reshape(-1)[rows], ref["a"]),
                   rel(_f64(gx).reshape(w.N, w.D)[rows], ref["gx"]))
    return rel(_f64(result).reshape(-1)[rows], ref["a"])


# ------------------------------------------------------------------ contenders


def ours(w: Workload, data: dict):
    from lazytensor import Vi, Vj

    x, y, b, s2, g = (data[k] for k in ("x", "y", "b", "s2", "g"))
    if w.kind == "gauss":
        return lambda: (-Vi(x).sqdist(Vj(y)) / s2).exp() @ b
    if w.kind == "knn":
        return lambda: Vi(x).sqdist(Vj(y)).argKmin(pc.KNN_K, dim=1)
    if w.kind == "lse":
        return lambda: (-Vi(x).sqdist(Vj(y)) / s2).logsumexp(dim=1)

    def fb():
        xs = x.clone().requires_grad_(True)
        a = (-Vi(xs).sqdist(Vj(y)) / s2).exp() @ b
        (a[:, 0] * g).sum().backward()
        return a.detach(), xs.grad
    return fb


def contenders(w: Workload, data: dict, threads: int, expert=None,
               compile_backend: str = "inductor", primers: dict | None = None) -> dict:
    """{name: function of no argument returning the result, or a note why it is skipped};
    ``primers`` receives {name: a call that compiles it} for the JIT-compiled ones."""
    primers = {} if primers is None else primers
    x, y, b, s2, g = (data[k] for k in ("x", "y", "b", "s2", "g"))
    kind = w.kind
    gg = g if kind == "grad" else None
    out = {"lazytensor": ours(w, data),
           "torch dense": lambda: pc.torch_dense(kind, x, y, b, s2, gg)}
    comp = pc.torch_compiled(kind, s2, backend=compile_backend)
    name = f"torch.compile ({compile_backend})"
    out[name] = lambda: comp(x, y, b, gg)
    # compiled once for the shape of a block of rows (y whole), before the timings
    primers[name] = lambda: comp(x[:pc.COMPILE_BLOCK], y, b,
                                 None if gg is None else gg[:pc.COMPILE_BLOCK])
    if expert is not None and w.D == 3 and kind in ("gauss", "grad"):
        out["expert C loop"] = ((lambda: expert.gauss3(x, y, b, s2, threads)) if kind == "gauss"
                                else (lambda: expert.gauss3_grad(x, y, b, s2, g, threads)))
    elif w.D == 3 and kind in ("gauss", "grad"):
        out["expert C loop"] = "skipped: no C compiler"
    why = pc.missing("numba")
    nb = None if why else pc.numba_contender(kind, w.D, threads)
    if why or nb is not None:
        out["numba"] = why or (lambda: nb(x, y, b, s2, gg))
        if not why:  # numba compiles for the argument types, whatever the sizes
            primers["numba"] = lambda: nb(x[:8], y[:32], b[:32], s2, None if gg is None else gg[:8])
    why = pc.missing("jax")
    jx = None if why else pc.jax_contender(kind, w.N, w.M, s2)
    out["JAX"] = why or (lambda: jx(x, y, b, gg))
    if kind == "knn":
        why = pc.missing("faiss")
        fs = None if why else pc.faiss_knn(threads)
        out["faiss IndexFlatL2"] = why or (lambda: fs(x, y))
    return out


def _keeping(fn, store: dict, name: str):
    def run():
        store[name] = fn()
    return run


def measure(w: Workload, rounds: int, budget: float, threads: int, expert=None,
            compile_backend: str = "inductor", seed: int = 0) -> dict:
    """{name: {"time", "ratio", "error", "ok"} or a note}: timed and checked."""
    import torch

    torch.set_num_threads(threads)
    data = make_data(w, seed)
    ref = reference(w, data)
    primers: dict = {}
    cont = contenders(w, data, threads, expert, compile_backend, primers)
    for name, prime in primers.items():  # compile times stay out of the timings
        try:
            prime()
        except Exception as e:  # noqa: BLE001 - a contender that fails is reported
            cont[name] = f"failed: {type(e).__name__}: {str(e)[:80]}"
    results: dict = {}
    live = {n: _keeping(f, results, n) for n, f in cont.items() if callable(f)}
    timed = compare(live, rounds, budget)
    out = {}
    for name, f in cont.items():
        if not callable(f):
            out[name] = f
            continue
        r = timed[name]
        if isinstance(r, str):
            out[name] = r
            continue
        err = error(w, results[name], ref)
        out[name] = {"time": r[0], "ratio": r[1], "error": err, "ok": err <= TOLERANCE[w.kind]}
    return out


# ------------------------------------------------------------------ limit and tables


def limits(threads: int, expert, workloads) -> dict:
    """{"rates": lane ops/s, (kind, D): {"ours": ops, "floor": pairs/s, "expert": ...}}."""
    from . import floor
    from .expert import EXPERT_OPS

    rates = {k: expert.rate(k) * threads for k in ("fma", "add", "mixed")}
    out: dict = {"rates": rates, "width": expert.width}
    for w in workloads:
        key = (w.kind, w.D)
        if key in out:
            continue
        try:
            ops = floor.workload_ops(w.kind, w.D)
        except Exception as e:  # noqa: BLE001 - reported in the table, not fatal
            out[key] = f"failed: {type(e).__name__}: {str(e)[:80]}"
            continue
        entry = {"ours": ops, "floor": floor.floor_pairs_per_s(ops, rates)}
        if w.D == 3 and w.kind in EXPERT_OPS:
            entry["expert"] = EXPERT_OPS[w.kind]
            entry["expert floor"] = floor.floor_pairs_per_s(EXPERT_OPS[w.kind], rates)
        out[key] = entry
    return out


def _ops(o: dict) -> str:
    return f"{o['fma'] + o['add']} ({o['fma']} fma + {o['add']} add)"


def limit_table(lim: dict, threads: int) -> Table:
    r = lim["rates"]
    t = _start(Table(
        "Limit: operations per pair and the floor they allow", [
            "workload", "our loop: ops/pair", "floor (Gpairs/s)", "expert loop: ops/pair",
            "its floor (Gpairs/s)"],
        f"{lim['width']} float32 lanes a vector; one core (timed in CPU time, so that other "
        f"jobs do not lower it) times {threads} threads: independent FMAs "
        f"{r['fma'] / 1e9:.1f} G/s, adds {r['add'] / 1e9:.1f} G/s, both mixed 1:1 "
        f"{r['mixed'] / 1e9:.1f} G/s (lane operations). Floor: a pair takes at least "
        "max(fma/F, add/A, (fma+add)/X); ops per pair and lane counted in the generated "
        "source (LAZYTENSOR_DEBUG=1), see benchmarks/floor.py."))
    for key, e in lim.items():
        if not isinstance(key, tuple):
            continue
        name = f"{TITLES[key[0]]}, D = {key[1]}"
        if isinstance(e, str):
            t.add(name, e, "—", "—", "—")
            continue
        t.add(name, _ops(e["ours"]), f"{e['floor'] / 1e9:.2f}",
              _ops(e["expert"]) if "expert" in e else "—",
              f"{e['expert floor'] / 1e9:.2f}" if "expert" in e else "—")
    return t


def workload_table(w: Workload, res: dict, lim: dict | None) -> Table:
    t = _start(Table(w.title, ["contender", "time", "Gpairs/s", "time / ours",
                               "error vs float64", "% of our loop's floor"],
                     "time / ours: median over rounds of the per-round ratio (> 1: we are "
                     f"faster); error: see the suite's method (tolerance {TOLERANCE[w.kind]:g})."))
    entry = (lim or {}).get((w.kind, w.D))
    fl = entry["floor"] if isinstance(entry, dict) else None
    pairs = w.N * w.M
    for name, r in res.items():
        if isinstance(r, str):
            t.add(name, r, "—", "—", "—", "—")
            continue
        ratio = "1.00" if name == "lazytensor" else (
            f"{r['ratio']:.2f}" if r["ratio"] is not None else "1 call (over budget)")
        err = f"{r['error']:.1e}" + ("" if r["ok"] else " ✗ over tolerance")
        pct = f"{100 * pairs / r['time'] / fl:.0f} %" if fl else "—"
        t.add(name, _fmt_time(r["time"]), f"{pairs / r['time'] / 1e9:.2f}", ratio, err, pct)
    return t


def plan(args) -> list:
    """(title, table-making function) pairs for benchmarks.bench's driver."""
    threads = getattr(args, "threads", None) or 2
    state: dict = {}

    def expert():
        if "expert" not in state:
            try:
                from .expert import ExpertLoops

                state["expert"] = ExpertLoops()
            except Exception:  # noqa: BLE001 - no compiler: the expert rows say so
                state["expert"] = None
        return state["expert"]

    def lim_table():
        ex = expert()
        state["lim"] = limits(threads, ex, WORKLOADS) if ex is not None else None
        if state["lim"] is None:
            return Table("Limit", ["—"], "no C compiler: no peak measured")
        return limit_table(state["lim"], threads)

    out = [("limit", lim_table)]
    for w in WORKLOADS:
        out.append((w.title, lambda w=w: workload_table(
            w, measure(w, args.rounds, args.budget, threads, expert()), state.get("lim"))))
    return out
