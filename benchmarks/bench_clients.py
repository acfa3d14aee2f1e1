"""geomloss and GPyTorch on lazytensor (through the pykeops alias) against their dense paths.

``python -m benchmarks.bench_clients [--rounds 5] [--pykeops]``

Each case runs its KeOps path and the library's dense path (geomloss's
``backend="tensorized"``, GPyTorch's non-KeOps kernels) in turns, the order alternating
from round to round, after one warm-up call each (kernel compilation excluded); the table
gives the median time of each and the median over rounds of the per-round ratio
(KeOps path / dense path). ``--pykeops`` runs the same cases in a second process on the
real pykeops (when it imports and compiles), as one more column of ratios to the dense
path: lazytensor and pykeops are compared through the same dense baseline.
Every call includes the backward pass (values and gradients, as in training).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def _geomloss_case(loss, backend, n, m, dim, **kw):
    def make():
        import torch
        from geomloss import SamplesLoss

        g = torch.Generator().manual_seed(0)
        x = torch.rand(n, dim, generator=g).requires_grad_()
        y = (torch.rand(m, dim, generator=g) * 0.8 + 0.1).requires_grad_()
        fn = SamplesLoss(loss, backend=backend, **kw)

        def run():
            value = fn(x, y)
            torch.autograd.grad(value, (x, y))
        return run
    return make


def _gpytorch_case(kernel, keops, n):
    def make():
        import gpytorch
        import torch

        g = torch.Generator().manual_seed(0)
        X = torch.rand(n, 3, generator=g)
        Y = torch.sin(6 * X[:, 0]) + 0.05 * torch.randn(n, generator=g)
        module = gpytorch.kernels.keops if keops else gpytorch.kernels
        base = module.RBFKernel() if kernel == "rbf" else module.MaternKernel(nu=2.5)

        class GP(gpytorch.models.ExactGP):
            def __init__(self):
                super().__init__(X, Y, gpytorch.likelihoods.GaussianLikelihood())
                self.mean = gpytorch.means.ConstantMean()
                self.cov = gpytorch.kernels.ScaleKernel(base)

            def forward(self, x):
                return gpytorch.distributions.MultivariateNormal(self.mean(x), self.cov(x))

        model = GP()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)

        def run():  # one training step's loss and gradients (CG: the KeOps path)
            torch.manual_seed(0)
            with gpytorch.settings.max_cholesky_size(0):
                loss = -mll(model(X), Y)
                torch.autograd.grad(loss, list(model.parameters()))
        return run
    return make


def cases(quick: bool):
    s = 0.5 if quick else 1.0
    n, big = int(2000 * s), int(6000 * s)
    out = []
    for loss, kw in (("sinkhorn", {"p": 2, "blur": 0.05}), ("gaussian", {"blur": 0.1}),
                     ("energy", {})):
        out.append((f"geomloss {loss} online, N = M = {n}, D = 3",
                    _geomloss_case(loss, "online", n, n, 3, **kw),
                    _geomloss_case(loss, "tensorized", n, n, 3, **kw)))
    out.append((f"geomloss sinkhorn multiscale, N = M = {big}, D = 2, blur 0.01",
                _geomloss_case("sinkhorn", "multiscale", big, big, 2, p=2, blur=0.01,
                               scaling=0.7),
                _geomloss_case("sinkhorn", "tensorized", big, big, 2, p=2, blur=0.01,
                               scaling=0.7)))
    for kernel in ("rbf", "matern2.5"):
        out.append((f"GPyTorch ExactGP {kernel} loss + gradients, N = {n}",
                    _gpytorch_case(kernel, True, n), _gpytorch_case(kernel, False, n)))
    return out


def measure(rounds: int, quick: bool) -> dict:
    """{case: (median keops s, median dense s, median ratio)} in this process."""
    results = {}
    for name, make_keops, make_dense in cases(quick):
        fns = {"keops": make_keops(), "dense": make_dense()}
        for fn in fns.values():
            fn()  # warm-up: compilation, caches
        times = {"keops": [], "dense": []}
        for r in range(rounds):
            order = ("keops", "dense") if r % 2 == 0 else ("dense", "keops")
            for key in order:
                t0 = time.perf_counter()
                fns[key]()
                times[key].append(time.perf_counter() - t0)
        ratios = [a / b for a, b in zip(times["keops"], times["dense"])]
        results[name] = (statistics.median(times["keops"]), statistics.median(times["dense"]),
                         statistics.median(ratios))
        print(f"  {name}: {results[name]}", file=sys.stderr, flush=True)
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_clients",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="half the sizes")
    parser.add_argument("--pykeops", action="store_true", help="also on the real pykeops")
    parser.add_argument("--child", choices=["lazytensor", "pykeops"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        if args.child == "lazytensor":
            import lazytensor.compat.pykeops

            lazytensor.compat.pykeops.install()
        print(json.dumps(measure(args.rounds, args.quick)))
        return 0
    columns = ["lazytensor"] + (["pykeops"] if args.pykeops else [])
    found = {}
    for backend in columns:
        cmd = [sys.executable, "-m", "benchmarks.bench_clients", "--child", backend,
               "--rounds", str(args.rounds)] + (["--quick"] if args.quick else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{backend}: failed ({proc.stderr.strip().splitlines()[-1:]})")
            continue
        found[backend] = json.loads(proc.stdout.strip().splitlines()[-1])
    head = "| case | dense | " + " | ".join(f"{c} (× dense)" for c in found) + " |"
    print(head)
    print("|" + " --- |" * (2 + len(found)))
    for name, *_ in cases(args.quick):
        dense = next(r[name][1] for r in found.values())
        cells = [f"{r[name][0]:.3f} s ({r[name][2]:.2f}×)" for r in found.values()]
        print(f"| {name} | {dense:.3f} s | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
