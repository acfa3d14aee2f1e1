"""Sums to a tolerance (``K @ b`` with ``tol=``) against our exact kernel, and FMM3D.

``python -m benchmarks.bench_fast_sums [--n 1000000] [--rounds 3] [--quick] [--write FILE]
[--plot PNG] [--calibrate]``

Method. Points uniform in the unit cube, weights uniform in [0, 1) (so that no
cancellation hides an error), float32 inputs for both contenders. Each row runs, in
turns within each round, our exact float32 kernel on a subsample of ``--rows`` target rows
(all M sources; its time scaled by N / rows, which is exact for a brute-force sum: its
cost is linear in the rows) and the full sum with ``tol=`` (planning included, the
plan cache cleared before each call). Reported: medians of both times and the median of
the per-round ratios. Error: the largest ``|s̃_i − s_i| / Σ_j |b_j|`` (``sup|K| = 1``)
over ``--check`` random rows against the exact float64 sum of those rows (the same
formula, tol=None); for Coulomb the relative ℓ2 error on those rows. ``fmm3dpy``
(``pip install fmm3dpy``, the bench extra) gets the same points and charges at
``eps = tol`` (its precision is a relative ℓ2 error), timed alternately with ours.

Sections: the Gaussian ``exp(-|x - y|²/h²)``, D = 3, h = 0.05, 0.2, 1.0, tol 1e-3 and 1e-6;
the Laplacian ``exp(-|x - y|/h)`` (not smooth at 0: the near/far split), D = 3 and D = 2;
Coulomb ``1/|x - y|`` beside FMM3D; time against N (the crossover with brute force and a
log-log plot). ``--calibrate`` measures the constants of ``lazytensor/fastsum/costs.py``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

import lazytensor
from lazytensor import Vi, Vj
from lazytensor.fastsum import run as methods_run


def gaussian(h):
    return lambda a, b: (-a.sqdist(b) / (h * h)).exp()


def laplacian(h):
    return lambda a, b: (-(a - b).norm2() / h).exp()


def coulomb(_h=None):
    return lambda a, b: 1 / (a - b).norm2()


def timed(f, *args, **kwargs):
    t0 = time.perf_counter()
    out = f(*args, **kwargs)
    return time.perf_counter() - t0, out


def matmul(K, b):
    return K @ b


def exact_rows(kernel, x, y, b, rows):
    K = kernel(Vi(x[rows].astype(np.float64)), Vj(y.astype(np.float64)))
    return K @ b.astype(np.float64)


def fast_sum(kernel, x, y, b, tol):
    methods_run._PLANS.clear()  # plan every call: the first call's cost
    return kernel(Vi(x), Vj(y)).__matmul__(b, tol=tol)


def error(approx, exact, b, relative_l2: bool) -> float:
    approx = np.asarray(approx, dtype=np.float64)
    if relative_l2:
        return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))
    return float(np.abs(approx - exact).max() / np.abs(b).sum())


def row(kernel, name, x, y, b, tol, args, rng, reference=None, relative=False, rounds=None):
    """One table row: exact (subsample, scaled) and tol=, alternated; error on random rows."""
    N = len(x)
    sub = np.sort(rng.choice(N, min(args.rows, N), replace=False))
    Kx = kernel(Vi(x[sub]), Vj(y))
    Kx @ b  # compile and warm up
    choice = lazytensor.explain(kernel(Vi(x), Vj(y)), b, tol=tol)
    exact_t, fast_t, ratios = [], [], []
    out = None
    for r in range(rounds or args.rounds):
        order = ("exact", "fast") if r % 2 == 0 else ("fast", "exact")
        got = {}
        for who in order:
            if who == "exact":
                t, _ = timed(matmul, Kx, b)
                got["exact"] = t * N / len(sub)
            else:
                t, out = timed(fast_sum, kernel, x, y, b, tol)
                got["fast"] = t
        exact_t.append(got["exact"])
        fast_t.append(got["fast"])
        ratios.append(got["exact"] / got["fast"])
    check = reference if reference is not None else None
    err = error(out[check[0]], check[1], b, relative) if check is not None else float("nan")
    return {"name": name, "tol": tol, "exact": statistics.median(exact_t),
            "fast": statistics.median(fast_t), "ratio": statistics.median(ratios),
            "error": err, "method": choice.method, "params": choice.params}


def reference_for(kernel, x, y, b, args, rng):
    rows = np.sort(rng.choice(len(x), min(args.check, len(x)), replace=False))
    return rows, exact_rows(kernel, x, y, b, rows)


def fmt_row(r) -> str:
    p = r["params"]
    what = r["method"]
    if "modes" in p:
        what += f", modes {'×'.join(map(str, p['modes']))}"
    if "radius" in p:
        what += f", radius {p['radius']:.3g}"
    if "sigma" in p:
        what += f", σ {p['sigma']:.3g}"
    return (f"| {r['name']} | {r['tol']:g} | {r['exact']:.4g} s | {r['fast']:.3g} s | "
            f"×{r['ratio']:.0f} | {r['error']:.1e} | {what} |")


HEADER = ("| kernel | tol | exact (float32, scaled) | `tol=` | × faster | max error / Σ|b| "
          "| method |\n|---|---|---|---|---|---|---|")


def gaussian_section(args, rng, lines):
    N, D = args.n, 3
    x, y = rng.random((N, D)).astype(np.float32), rng.random((N, D)).astype(np.float32)
    b = rng.random((N, 1)).astype(np.float32)
    lines += [f"### Gaussian exp(-|x − y|²/h²), D = 3, N = M = {N:,}", "", HEADER]
    for h in args.bandwidths:
        kernel = gaussian(h)
        ref = reference_for(kernel, x, y, b, args, rng)
        for tol in args.tols:
            r = row(kernel, f"Gaussian h = {h}", x, y, b, tol, args, rng, ref)
            lines.append(fmt_row(r))
            print(lines[-1], flush=True)
    lines.append("")


def laplacian_section(args, rng, lines):
    for D, tols, n, rounds in ((3, args.tols[:1], args.n, 1), (2, args.tols, args.n, args.rounds)):
        x, y = rng.random((n, D)).astype(np.float32), rng.random((n, D)).astype(np.float32)
        b = rng.random((n, 1)).astype(np.float32)
        lines += [f"### Laplacian exp(-|x − y|/h), h = 0.2, D = {D}, N = M = {n:,}", "", HEADER]
        kernel = laplacian(0.2)
        ref = reference_for(kernel, x, y, b, args, rng)
        for tol in tols:
            r = row(kernel, f"Laplacian D = {D}", x, y, b, tol, args, rng, ref, rounds=rounds)
            lines.append(fmt_row(r))
            print(lines[-1], flush=True)
        lines.append("")


def coulomb_section(args, rng, lines):
    try:
        import fmm3dpy
    except ImportError:
        lines += ["### Coulomb beside FMM3D", "", "fmm3dpy is not installed (pip install fmm3dpy).",
                  ""]
        return
    n = args.coulomb_n
    x, y = rng.random((n, 3)), rng.random((n, 3))
    b = rng.random((n, 1))
    kernel = coulomb()
    rows = np.sort(rng.choice(n, min(args.check, n), replace=False))
    exact = exact_rows(kernel, x, y, b, rows)
    lines += [f"### Coulomb 1/|x − y|, D = 3, N = M = {n:,}, float64, beside FMM3D "
              f"(fmm3dpy {getattr(fmm3dpy, '__version__', '')})", "",
              "| tol | exact (scaled) | `tol=` | FMM3D | FMM3D / ours | error ours | error FMM3D "
              "| method |", "|---|---|---|---|---|---|---|---|"]
    for tol in args.tols:
        r = row(kernel, "Coulomb", x, y, b, tol, args, rng, (rows, exact), relative=True,
                rounds=1)
        src, tgt, q = np.ascontiguousarray(y.T), np.ascontiguousarray(x.T), np.ascontiguousarray(b[:, 0])
        ts, outs = [], None
        for _ in range(1):
            t, outs = timed(fmm3dpy.lfmm3d, eps=tol, sources=src, charges=q, targets=tgt,
                            pgt=1)
            ts.append(t)
        fmm_err = error(4 * np.pi * outs.pottarg[rows][:, None], exact, b, True)  # FMM3D: 1/(4π r)
        t_fmm = statistics.median(ts)
        p = r["params"]
        lines.append(f"| {tol:g} | {r['exact']:.4g} s | {r['fast']:.3g} s | {t_fmm:.3g} s | "
                     f"×{t_fmm / r['fast']:.2f} | {r['error']:.1e} | {fmm_err:.1e} | "
                     f"{r['method']}, modes {'×'.join(map(str, p.get('modes', ())))}, radius "
                     f"{p.get('radius', float('nan')):.3g} |")
        print(lines[-1], flush=True)
    lines.append("")


def scaling_section(args, rng, lines):
    tol, h, D = 1e-6, 0.2, 3
    kernel = gaussian(h)
    sizes = [n for n in (1000, 3000, 10000, 30000, 100000, 300000, 1000000) if n <= args.n]
    results = []
    for n in sizes:
        x, y = rng.random((n, D)).astype(np.float32), rng.random((n, D)).astype(np.float32)
        b = rng.random((n, 1)).astype(np.float32)
        sub = np.arange(min(n, args.rows))
        Kx = kernel(Vi(x[sub]), Vj(y))
        Kx @ b
        fast_sum(kernel, x, y, b, tol)
        te, tf = [], []
        for _ in range(args.rounds):
            te.append(timed(matmul, Kx, b)[0] * n / len(sub))
            tf.append(timed(fast_sum, kernel, x, y, b, tol)[0])
        results.append((n, statistics.median(te), statistics.median(tf),
                        lazytensor.explain(kernel(Vi(x), Vj(y)), b, tol=tol).method))
        print(results[-1], flush=True)
    cross = next((n for n, te, tf, m in results if m != "exact" and tf < te), None)
    lines += [f"### Time against N: Gaussian h = {h}, D = {D}, tol = {tol:g}", "",
              "| N = M | exact | `tol=` (auto) | chosen |", "|---|---|---|---|"]
    lines += [f"| {n:,} | {te:.3g} s | {tf:.3g} s | {m} |" for n, te, tf, m in results]
    lines += ["", f"Crossover: the first N = M where a method other than brute force is chosen "
              f"and faster: {cross:,}." if cross else "No crossover in range.", ""]
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.6))
        ns = [r[0] for r in results]
        ax.loglog(ns, [r[1] for r in results], "o-", label="exact (float32)")
        ax.loglog(ns, [r[2] for r in results], "s-", label=f"tol={tol:g}")
        ax.set_xlabel("N = M")
        ax.set_ylabel("seconds")
        ax.set_title(f"Gaussian h={h}, D={D}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        lines += [f"![time against N]({os.path.relpath(args.plot, os.path.dirname(args.write or '.') or '.')})", ""]


def calibrate():
    """The constants of lazytensor/fastsum/costs.py on this machine."""
    from lazytensor.fastsum import coefficients, near, spectral

    rng = np.random.default_rng(0)
    n = 20000
    for dt in (np.float32, np.float64):
        x, b = rng.random((n, 3)).astype(dt), rng.random((n, 1)).astype(dt)
        K = (-Vi(x).sqdist(Vj(x)) / 0.04).exp()
        K @ b
        best = min(timed(matmul, K, b)[0] for _ in range(3))
        print(f"PAIR_S[{dt.__name__}] = {best / n / n:.3g}")
    x, b = rng.random((200000, 3)), rng.random((200000, 1))
    K = (-Vi(x).sqdist(Vj(x)) / 0.04).exp() * Vj(b)
    t, cells = timed(near.neighbour_ranges, x, x, np.zeros(3), 0.05, 1)
    print(f"SORT_S = {t / 4e5:.3g}")
    near.ranged_sum(K.formula, K.variables, cells, "auto")
    t = min(timed(near.ranged_sum, K.formula, K.variables, cells, "auto")[0] for _ in range(3))
    print(f"RANGED_PAIR_S = {t / cells.pairs:.3g}")
    xx, ww = rng.random((1000000, 3)), rng.random((1000000, 1))
    for modes, eps in (((25,) * 3, 1e-4), ((25,) * 3, 1e-8), ((121,) * 3, 1e-6)):
        coef = coefficients.Coefficients(np.full(3, 2.0), modes, np.ones(modes), 0, np.zeros(3))
        far = spectral.FarField(coef, eps, np.full(3, 0.5), 0)
        t = timed(spectral.apply, far, xx, xx, ww)[0]
        print(f"NUFFT modes {modes} eps {eps:g}: {t:.3g} s, model "
              f"{spectral.transform_cost(10 ** 6, 10 ** 6, 1, modes, eps):.3g} s")


def environment() -> str:
    try:
        cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines()
                      if ln.startswith("Model name")), platform.processor())
    except OSError:
        model = platform.processor()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    import finufft

    return (f"{model}, {os.cpu_count()} cores, load average {load:.1f} at the start; "
            f"finufft {finufft.__version__}, numpy {np.__version__}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000000)
    ap.add_argument("--coulomb-n", type=int, default=100000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", type=int, default=2000, help="rows of the timed exact subsample")
    ap.add_argument("--check", type=int, default=1000, help="rows checked against float64")
    ap.add_argument("--sections", default="gaussian,laplacian,coulomb,scaling")
    ap.add_argument("--quick", action="store_true", help="N = M = 100,000, one round")
    ap.add_argument("--write", help="append the tables to this Markdown file")
    ap.add_argument("--plot", help="the log-log plot of time against N (PNG)")
    ap.add_argument("--calibrate", action="store_true")
    args = ap.parse_args(argv)
    if args.calibrate:
        return calibrate()
    if args.quick:
        args.n, args.coulomb_n, args.rounds = 100000, 30000, 1
    args.bandwidths, args.tols = (0.05, 0.2, 1.0), (1e-3, 1e-6)
    rng = np.random.default_rng(2026)
    command = "python -m benchmarks.bench_fast_sums " + " ".join(argv or sys.argv[1:])
    lines = [f"## {datetime.date.today().isoformat()}: sums to a tolerance "
             f"(`{command.strip()}`)", "", environment(), ""]
    started = time.time()
    for name in args.sections.split(","):
        {"gaussian": gaussian_section, "laplacian": laplacian_section,
         "coulomb": coulomb_section, "scaling": scaling_section}[name](args, rng, lines)
    lines.append(f"(whole run: {(time.time() - started) / 60:.0f} min)")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        with open(args.write, "a") as f:
            f.write("\n" + text)


if __name__ == "__main__":
    main()
