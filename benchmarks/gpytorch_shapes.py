"""Client-shaped workloads: the products GPyTorch's KeOps kernels ask for, against dense torch.

GPyTorch's exact GPs solve ``K v = y`` by conjugate gradients and Lanczos with tens of
right-hand sides at once (the targets and the probe vectors of the trace estimates), so
one training step is a few dozen ``K @ V`` with ``V`` of 1 to 64 columns, and its
``RBFKernel`` is ``exp(-|x - y|² / 2ℓ²)``. Contenders, side by side (rounds alternate,
ratios are medians of per-round ratios, :func:`benchmarks.bench.compare`):

- ``lazytensor``: ``(-Vi(x).sqdist(Vj(y)) * (0.5 / ℓ²)).exp() @ V``;
- ``dense``: what GPyTorch's dense kernel does for one product: the N×M matrix from the
  matmul form ``|x|² + |y|² - 2 x yᵀ`` (in row chunks past the memory budget), ``exp``,
  then the product;
- ``dense, K kept``: the product alone with K already in memory, as CG's later iterations
  see it (skipped when K does not fit the budget).

``python -m benchmarks.bench --suite gpytorch [--quick]``.

>>> from benchmarks.gpytorch_shapes import gp_rows
>>> gp_rows(quick=True)[:2]
[(2000, 1), (2000, 16)]
"""

from __future__ import annotations

import torch

from lazytensor import Vi, Vj

LENGTHSCALE = 0.3  # unit cube in D = 3: a kernel matrix neither diagonal nor flat


def gp_rows(quick: bool) -> list:
    """(N = M, columns of V) of the table's rows."""
    sizes = [2000] if quick else [1000, 2000, 10_000, 20_000]
    return [(n, e) for n in sizes for e in (1, 16, 64)]


def _dense_matrix(x, y, scale: float, rows: slice) -> torch.Tensor:
    xc = x[rows]
    d2 = torch.addmm((y * y).sum(1)[None, :], xc, y.T, beta=1, alpha=-2)
    d2.add_((xc * xc).sum(1, keepdim=True)).clamp_(min=0)
    return d2.mul_(-scale).exp_()


def gp_contenders(n: int, E: int, dtype: torch.dtype, dense_bytes: int, D: int = 3) -> dict:
    """{name: call} for one row: K @ V with N = M = n points in D dimensions."""
    g = torch.Generator().manual_seed(n + E)
    x = torch.rand(n, D, generator=g).to(dtype)
    y = torch.rand(n, D, generator=g).to(dtype)
    v = torch.randn(n, E, generator=g).to(dtype)
    scale = 0.5 / LENGTHSCALE**2
    size = torch.finfo(dtype).bits // 8
    chunk = max(1, dense_bytes // (2 * size * n))

    def dense():
        out = torch.empty(n, E, dtype=dtype)
        for i0 in range(0, n, chunk):
            rows = slice(i0, min(i0 + chunk, n))
            out[rows] = _dense_matrix(x, y, scale, rows) @ v
        return out

    cont = {"ours": lambda: (-Vi(x).sqdist(Vj(y)) * scale).exp() @ v, "dense": dense}
    if n * n * size <= dense_bytes:
        K = _dense_matrix(x, y, scale, slice(0, n))
        cont["kept"] = lambda: K @ v
    return cont


def gpytorch_table(args):
    """The table of :mod:`benchmarks.gpytorch_shapes` (``args``: rounds, budget, dense_mb,
    quick)."""
    from .bench import Table, _cell, _start, compare

    t = _start(Table("GPyTorch-shaped products: K @ V, RBF kernel, D = 3",
                     ["dtype", "N = M", "columns of V", "lazytensor", "dense (build + product)",
                      "dense, K kept (product only)"],
                     f"{torch.get_num_threads()} threads; ℓ = {LENGTHSCALE}; ×: median over rounds "
                     "of the per-round time ratio to lazytensor (> 1: we are faster). 'K kept': "
                     "CG's later iterations with the N×M matrix in memory (skipped past "
                     "--dense-mb)."))
    for dtype in (torch.float32, torch.float64):
        per_pair: dict = {}
        for n, E in gp_rows(args.quick):
            est = {k: v * n * n for k, v in per_pair.items()}
            res = compare(gp_contenders(n, E, dtype, args.dense_mb << 20), args.rounds,
                          args.budget, est)
            per_pair.update({k: r[0] / (n * n) for k, r in res.items() if isinstance(r, tuple)})
            t.add(str(dtype).replace("torch.", ""), f"{n:,}", E, _cell(res["ours"], None, True),
                  _cell(res["dense"]), _cell(res.get("kept"), None) if "kept" in res
                  else "skipped (memory)")
    return t
