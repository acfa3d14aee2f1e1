"""The cases of ``tools.gpu_check``: fixed kernels of interest, and every reduction on a
random formula (a random elementwise function of a squared distance, a dot product or an
L1 distance, times a random j-weight for the sums), each in float32 and float64."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Case:
    """A reduction checked on the GPU against the CPU backend."""

    name: str
    dtype: str
    inputs: Callable  # (torch, generator) -> dict of tensors, on the CPU
    lazy: Callable  # (inputs, backend) -> tensor or tuple of tensors
    dense: Callable | None = None  # (inputs) -> the same, densely in torch
    index_value: Callable | None = None  # (inputs, index tensor) -> values the indices attain
    grad: bool = False  # lazy/dense return gradients (inputs must require grad)
    pairs: int = 0


@dataclass
class Row:
    case: str
    error: float = math.nan
    ok: bool = False
    gpu_ms: float = math.nan
    cpu_ms: float = math.nan
    dense_ms: float = math.nan
    note: str = ""
    extra: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------- cases


def _points(torch, g, dtype, *shape, scale=1.0):
    return torch.rand(*shape, generator=g, dtype=getattr(torch, dtype)) * scale


def _gauss_case(name, dtype, N, M, D, Db=2):
    from lazytensor import Vi, Vj

    s = 2.0 / math.sqrt(D)

    def inputs(torch, g):
        return {"x": _points(torch, g, dtype, N, D, scale=s), "y": _points(torch, g, dtype, M, D, scale=s),
                "b": _points(torch, g, dtype, M, Db) - 0.5}

    def lazy(t, backend):
        return ((-Vi(t["x"]).sqdist(Vj(t["y"]))).exp() * Vj(t["b"])).sum(dim=1, backend=backend)

    def dense(t):
        import torch

        return torch.exp(-torch.cdist(t["x"], t["y"]) ** 2) @ t["b"]

    return Case(name, dtype, inputs, lazy, dense if N * M <= 2e9 else None, pairs=N * M)


def _sqdist_index_value(t, idx):
    x, y = t["x"], t["y"]
    flat = idx.reshape(idx.shape[0], -1)
    return ((x[:, None, :] - y[flat]) ** 2).sum(-1)


def _argkmin_case(name, dtype, N, M, D, K=10):
    from lazytensor import Vi, Vj

    def inputs(torch, g):
        return {"x": _points(torch, g, dtype, N, D), "y": _points(torch, g, dtype, M, D)}

    def lazy(t, backend):
        return Vi(t["x"]).sqdist(Vj(t["y"])).argKmin(K, dim=1, backend=backend)

    def dense(t):
        import torch

        return torch.cdist(t["x"], t["y"]).topk(K, dim=1, largest=False).indices

    return Case(name, dtype, inputs, lazy, dense if N * M <= 4e9 else None,
                index_value=_sqdist_index_value, pairs=N * M)


def _lse_case(name, dtype, N, M, D):
    from lazytensor import Vi, Vj

    def inputs(torch, g):
        return {"x": _points(torch, g, dtype, N, D, scale=4), "y": _points(torch, g, dtype, M, D, scale=4)}

    def lazy(t, backend):
        return (-Vi(t["x"]).sqdist(Vj(t["y"]))).logsumexp(dim=1, backend=backend)

    def dense(t):
        import torch

        return torch.logsumexp(-torch.cdist(t["x"], t["y"]) ** 2, dim=1, keepdim=True)

    return Case(name, dtype, inputs, lazy, dense, pairs=N * M)


def _min_argmin_case(name, dtype, N, M, D):
    from lazytensor import Vi, Vj

    def inputs(torch, g):
        return {"x": _points(torch, g, dtype, N, D), "y": _points(torch, g, dtype, M, D)}

    def lazy(t, backend):
        return Vi(t["x"]).sqdist(Vj(t["y"])).min_argmin(dim=1, backend=backend)

    def dense(t):
        import torch

        v, i = (torch.cdist(t["x"], t["y"]) ** 2).min(dim=1, keepdim=True)
        return v, i

    return Case(name, dtype, inputs, lazy, dense, index_value=_sqdist_index_value, pairs=N * M)


def _batched_case(name, dtype, B, N, M, D):
    from lazytensor import LazyTensor

    def inputs(torch, g):
        return {"x": _points(torch, g, dtype, B, N, 1, D), "y": _points(torch, g, dtype, 1, 1, M, D),
                "s": _points(torch, g, dtype, B, 1, 1, 1) + 0.5,
                "b": _points(torch, g, dtype, B, 1, M, 1)}

    def lazy(t, backend):
        K = (-LazyTensor(t["x"]).sqdist(LazyTensor(t["y"])) * LazyTensor(t["s"])).exp()
        return (K * LazyTensor(t["b"])).sum(dim=2, backend=backend)

    def dense(t):
        d2 = ((t["x"] - t["y"]) ** 2).sum(-1)  # (B, N, M)
        return (d2.mul(-t["s"][..., 0]).exp() * t["b"][..., 0]).sum(-1, keepdim=True)

    return Case(name, dtype, inputs, lazy, dense, pairs=B * N * M)


def _grad_case(name, dtype, N, M, D):
    from lazytensor import Vi, Vj

    def inputs(torch, g):
        return {"x": _points(torch, g, dtype, N, D), "y": _points(torch, g, dtype, M, D),
                "b": _points(torch, g, dtype, M, 1) - 0.5}

    def lazy(t, backend):
        import torch

        x, y, b = (t[k].detach().requires_grad_() for k in ("x", "y", "b"))
        a = ((-Vi(x).sqdist(Vj(y)) * 4).exp() * Vj(b)).sum(dim=1, backend=backend)
        lse = (-Vi(x).sqdist(Vj(y))).logsumexp(dim=1, backend=backend)
        return torch.autograd.grad((a ** 2).sum() + lse.sum(), [x, y, b])

    def dense(t):
        import torch

        x, y, b = (t[k].detach().requires_grad_() for k in ("x", "y", "b"))
        d2 = torch.cdist(x, y) ** 2
        a = torch.exp(-4 * d2) @ b
        lse = torch.logsumexp(-d2, dim=1)
        return torch.autograd.grad((a ** 2).sum() + lse.sum(), [x, y, b])

    return Case(name, dtype, inputs, lazy, dense, grad=True, pairs=3 * N * M)


def _clustered_ranges(torch, g, dtype, N, M, D, cell=0.1, radius=0.25):
    """Points sorted by grid cell and the ranges keeping pairs of cells whose centroids
    are within ``radius`` (and each row cell's nearest column cell: no row without pairs)."""
    from lazytensor.scale.cluster import (
        cluster_ranges_centroids,
        from_matrix,
        grid_cluster,
        sort_clusters,
    )

    pts = []
    for n in (N, M):
        p = torch.rand(n, D, generator=g, dtype=torch.float64)
        p, lab = sort_clusters(p, grid_cluster(p, cell))
        r, c, _ = cluster_ranges_centroids(p, lab)
        pts.append((p.to(getattr(torch, dtype)), r, c))
    (x, rx, cx), (y, ry, cy) = pts
    d = ((cx[:, None] - cy[None]) ** 2).sum(-1)
    keep = (d < radius ** 2) | (d == d.min(1, keepdim=True).values)
    return x, y, from_matrix(rx, ry, keep)


def _ranges_case(name, dtype, N, M, D):
    """Block-sparse Gaussian sum and log-sum-exp, forward and gradients (the gradient in y
    runs with the transposed ranges)."""
    from lazytensor import Vi, Vj

    kept = {}

    def inputs(torch, g):
        x, y, ranges = _clustered_ranges(torch, g, dtype, N, M, D)
        kept["ranges"] = ranges
        b = torch.rand(M, 2, generator=g, dtype=getattr(torch, dtype)) - 0.5
        return {"x": x, "y": y, "b": b}

    def lazy(t, backend):
        import torch

        ranges = kept["ranges"]
        x, y, b = (t[k].detach().requires_grad_() for k in ("x", "y", "b"))
        K = (-Vi(x).sqdist(Vj(y)) * 20).exp()
        a = (K * Vj(b)).sum(dim=1, ranges=ranges, backend=backend)
        lse = (-Vi(x).sqdist(Vj(y)) * 20).logsumexp(dim=1, ranges=ranges, backend=backend)
        grads = torch.autograd.grad((a ** 2).sum() + lse.sum(), [x, y, b])
        return (a, lse, *grads)

    return Case(name, dtype, inputs, lazy, grad=True, pairs=N * M)


def cases(scale: float = 1.0) -> list[Case]:
    """The checked cases; ``scale`` multiplies the numbers of points."""

    def n(k):
        return max(16, int(k * scale))

    return [
        _gauss_case("gauss D=3", "float32", n(50_000), n(50_000), 3),
        _gauss_case("gauss D=3", "float64", n(50_000), n(50_000), 3),
        _gauss_case("gauss D=64", "float32", n(20_000), n(20_000), 64),
        _gauss_case("gauss split-j N=100", "float32", 100, n(1_000_000), 3),
        _argkmin_case("argKmin K=10 D=3", "float32", n(50_000), n(50_000), 3),
        _argkmin_case("argKmin K=10 D=784", "float32", n(2_000), n(20_000), 784),
        _lse_case("logsumexp D=3", "float32", n(50_000), n(50_000), 3),
        _lse_case("logsumexp D=3", "float64", n(50_000), n(50_000), 3),
        _min_argmin_case("min_argmin D=3", "float64", n(50_000), n(50_000), 3),
        _batched_case("batched B=8 gauss", "float32", 8, n(5_000), n(5_000), 3),
        _grad_case("grad gauss+lse", "float32", n(20_000), n(20_000), 3),
        _grad_case("grad gauss+lse", "float64", n(10_000), n(10_000), 3),
        _ranges_case("ranges gauss+lse, grads", "float32", n(100_000), n(100_000), 3),
        _ranges_case("ranges gauss+lse, grads", "float64", n(50_000), n(50_000), 3),
    ]


_UNARY = {  # name -> (LazyTensor -> LazyTensor), on a non-negative argument
    "exp(-u)": lambda u: (-u).exp(),
    "1/(1+u)": lambda u: 1 / (1 + u),
    "sqrt(1+u)": lambda u: (1 + u).sqrt(),
    "log1p(u)": lambda u: u.log1p() if hasattr(u, "log1p") else (1 + u).log(),
    "cos(u)": lambda u: u.cos(),
    "u*exp(-u)": lambda u: u * (-u).exp(),
}
_BASES = {
    "sqdist": lambda x, y: x.sqdist(y),
    "l1": lambda x, y: (x - y).abs().sum(-1),
    "dot^2": lambda x, y: ((x * y).sum(-1)) ** 2,
}


def _reduce(name, F, w, backend):
    """``name`` of formula F (with weight w for the weighted ones)."""
    if name == "sum":
        return (F * w).sum(dim=1, backend=backend)
    if name in ("logsumexp", "max_sumshiftexp"):
        return getattr(-F, name)(dim=1, backend=backend)
    if name == "logsumexp_weight":
        return (-F).logsumexp(dim=1, weight=w.abs() + 0.1, backend=backend)
    if name == "sumsoftmaxweight":
        return (-F).sumsoftmaxweight(w, dim=1, backend=backend)
    if name in ("kmin", "argkmin", "kmin_argkmin"):
        fn = {"kmin": "Kmin", "argkmin": "argKmin", "kmin_argkmin": "Kmin_argKmin"}[name]
        return getattr(F, fn)(5, dim=1, backend=backend)
    return getattr(F, name)(dim=1, backend=backend)


def random_reduction_cases(seed: int, scale: float = 1.0) -> list[Case]:
    """Every reduction of the registry on a random formula, float32 and float64."""
    from lazytensor.codegen import reductions

    rng = random.Random(seed)
    names = sorted({r.name for r in reductions.REDUCTIONS.values()})
    out = []
    for name in names:
        unary, base = rng.choice(sorted(_UNARY)), rng.choice(sorted(_BASES))
        D, E = rng.choice([1, 2, 3, 5, 8]), rng.choice([1, 2, 3])
        N, M = max(16, int(rng.choice([300, 3000, 20_000]) * scale)), max(16, int(
            rng.choice([500, 4000, 30_000]) * scale))

        def inputs(torch, g, D=D, E=E, N=N, M=M, dtype="float32"):
            return {"x": torch.rand(N, D, generator=g), "y": torch.rand(M, D, generator=g),
                    "w": torch.rand(M, E, generator=g) - 0.5}

        for dtype in ("float32", "float64"):
            def typed(torch, g, inputs=inputs, dtype=dtype):
                return {k: v.to(getattr(torch, dtype)) for k, v in inputs(torch, g).items()}

            def lazy(t, backend, name=name, unary=unary, base=base):
                from lazytensor import Vi, Vj

                F = _UNARY[unary](_BASES[base](Vi(t["x"]), Vj(t["y"])))
                w = Vj(t["w"][:, :1] if name in ("logsumexp_weight",) else t["w"])
                return _reduce(name, F, w, backend)

            index_value = None
            if name in ("argmin", "argmax", "min_argmin", "max_argmax", "argkmin",
                        "kmin_argkmin"):
                def index_value(t, idx, unary=unary, base=base):
                    import torch

                    x, y = t["x"].double(), t["y"].double()
                    flat = idx.reshape(idx.shape[0], -1)
                    yy = y[flat]
                    u = {"sqdist": lambda: ((x[:, None] - yy) ** 2).sum(-1),
                         "l1": lambda: (x[:, None] - yy).abs().sum(-1),
                         "dot^2": lambda: ((x[:, None] * yy).sum(-1)) ** 2}[base]()
                    f = {"exp(-u)": lambda u: (-u).exp(), "1/(1+u)": lambda u: 1 / (1 + u),
                         "sqrt(1+u)": lambda u: (1 + u).sqrt(), "log1p(u)": torch.log1p,
                         "cos(u)": torch.cos, "u*exp(-u)": lambda u: u * (-u).exp()}[unary]
                    return f(u)
            out.append(Case(f"{name}: {unary} of {base}, D={D}", dtype, typed, lazy,
                            index_value=index_value, pairs=N * M))
    return out


__all__ = ["Case", "Row", "cases", "random_reduction_cases"]
