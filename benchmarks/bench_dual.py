"""Mixed-mode (dual) vs symbolic gradients vs dense torch: ``python -m benchmarks.bench_dual``.

Cases: (a) Gaussian kernel D=3, gradient w.r.t. x; (b) a formula with data-dependent
branches, an HM-LSTM-like gate ``ifelse(z - 0.5, sigmoid(u), tanh(u)) * v`` summed over j;
(c) the tangent count k = 1..16 (x of dimension k) to locate the crossover where the
fused forward stops paying. Contenders alternate round by round; each figure is the
median over rounds, ratios are medians of per-round ratios. Cases (a) and (b) are also the
table of ``python -m benchmarks.bench --suite dual`` (:func:`dual_table`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lazytensor import LazyTensor


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _gaussian(x, y, b):
    K = (-LazyTensor(x[:, None]).sqdist(LazyTensor(y[None]))).exp()
    return K * LazyTensor(b[None])


def _gate(x, y, b):
    xi, yj = LazyTensor(x[:, None]), LazyTensor(y[None])
    z = (xi * yj).sum(-1)
    u = (xi - yj).sum(-1)
    return (z - 0.5).ifelse(u.sigmoid(), u.tanh()) * LazyTensor(b[None])


def _dense_gaussian(x, y, b, chunk=2048):
    out = []
    for i in range(0, x.shape[0], chunk):
        D = ((x[i:i + chunk, None] - y[None]) ** 2).sum(-1)
        out.append((-D).exp() @ b)
    return torch.cat(out)


def _dense_gate(x, y, b, chunk=2048):
    out = []
    for i in range(0, x.shape[0], chunk):
        z = x[i:i + chunk] @ y.T
        u = x[i:i + chunk].sum(-1, keepdim=True) - y.sum(-1)[None]
        out.append(torch.where(z - 0.5 >= 0, torch.sigmoid(u), torch.tanh(u)) @ b)
    return torch.cat(out)


def measure(formula, dense, N, M, D, rounds):
    torch.manual_seed(0)
    x = torch.randn(N, D) * 0.5
    y = torch.randn(M, D) * 0.5
    b = torch.randn(M, 1)

    def fwd():
        with torch.no_grad():
            formula(x, y, b).sum(1)

    def run(mode):
        xr = x.clone().requires_grad_()
        out = formula(xr, y, b).sum(1, grad_mode=mode)
        torch.autograd.grad(out.sum(), [xr])

    def dense_run():
        xr = x.clone().requires_grad_()
        torch.autograd.grad(dense(xr, y, b).sum(), [xr])

    contenders = {"forward": fwd, "dual": lambda: run("dual"), "symbolic": lambda: run("symbolic")}
    if dense is not None:
        contenders["dense"] = dense_run
    for fn in contenders.values():  # compile and warm up
        fn()
    times = {k: [] for k in contenders}
    for _ in range(rounds):
        for k, fn in contenders.items():
            times[k].append(_time(fn))
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = {k: statistics.median(a / f for a, f in zip(times[k], times["forward"])) for k in times}
    sym_over_dual = statistics.median(s / d for s, d in zip(times["symbolic"], times["dual"]))
    return med, ratio, sym_over_dual


CASES = (("(a) gaussian D=3, d/dx", _gaussian, _dense_gaussian, 3),
         ("(b) branchy gate D=3, d/dx", _gate, _dense_gate, 3))


def dual_table(args, n: int = 20000, dense_max: int = 4000):
    """The bench's table (``python -m benchmarks.bench --suite dual``): the cases above at
    N = M = n, dense torch only up to ``dense_max`` (its N×M autograd takes minutes at
    20,000)."""
    from .bench import Table, _fmt_time, _start

    t = _start(Table(f"Fused (dual) vs symbolic gradients, N = M = {n:,}, float32",
                     ["case", "forward", "dual fwd+bwd / fwd", "symbolic fwd+bwd / fwd",
                      "symbolic / dual", "dense autograd / fwd"],
                     f"{torch.get_num_threads()} threads; the contenders alternate within each "
                     "round; ratios are medians over rounds of per-round ratios; dense torch "
                     f"only up to N = {dense_max:,}."))
    for name, formula, dense, D in CASES:
        med, ratio, sd = measure(formula, dense if n <= dense_max else None, n, n, D, args.rounds)
        t.add(name, _fmt_time(med["forward"]), f"{ratio['dual']:.2f}", f"{ratio['symbolic']:.2f}",
              f"{sd:.2f}", f"{ratio['dense']:.2f}" if "dense" in ratio else "—")
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kmax", type=int, default=16)
    ap.add_argument("--no-dense", action="store_true", help="leave dense torch out")
    args = ap.parse_args(argv)
    N = M = args.n
    print(f"N = M = {N}, float32, threads = {torch.get_num_threads()}, rounds = {args.rounds}")
    print(f"{'case':28s} {'fwd s':>8s} {'dual/fwd':>9s} {'sym/fwd':>8s} {'dense/fwd':>9s} {'sym/dual':>8s}")
    for name, formula, dense, D in CASES:
        med, ratio, sd = measure(formula, None if args.no_dense else dense, N, M, D, args.rounds)
        dense_ratio = f"{ratio['dense']:9.2f}" if "dense" in ratio else f"{'—':>9s}"
        print(f"{name:28s} {med['forward']:8.3f} {ratio['dual']:9.2f} {ratio['symbolic']:8.2f} "
              f"{dense_ratio} {sd:8.2f}")
    print("(c) crossover: gaussian, x of dimension k")
    for k in (1, 2, 3, 4, 6, 8, 12, 16):
        if k > args.kmax:
            break
        med, ratio, sd = measure(_gaussian, None, N, M, k, args.rounds)
        print(f"    k={k:<3d}{'':20s} {med['forward']:8.3f} {ratio['dual']:9.2f} {ratio['symbolic']:8.2f} "
              f"{'':9s} {sd:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
