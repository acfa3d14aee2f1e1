"""Formulas over long vectors compile to code whose size does not grow with the dimension.

The Gaussian's gradient at D = 4,096 (the weighted sums of j-vectors of
:mod:`lazytensor.codegen.cpu.wide`, one- and two-sided) is a loop over the vector, not a
pass per block of components: its kernels compile to the same machine code at any D, and
their values match dense float64 torch.
"""

from __future__ import annotations

import glob
import os

import pytest
import torch

from lazytensor import Vi, Vj
from lazytensor.backends.cpu import backward, runtime
from lazytensor.engine import plans as engine


def _gaussian_grads(D: int, rng, N: int = 40, M: int = 50, both: bool = True):
    """The Gaussian sum's forward and gradients (x; with ``both`` also y and b), and the
    same in float64 torch (the distances in matrix form: N x M memory)."""
    x = torch.tensor(rng.standard_normal((N, D)), dtype=torch.float32, requires_grad=True)
    y = torch.tensor(rng.standard_normal((M, D)), dtype=torch.float32, requires_grad=both)
    b = torch.tensor(rng.standard_normal((M, 1)), dtype=torch.float32, requires_grad=both)
    inputs = [x, y, b] if both else [x]
    s = ((-Vi(x).sqdist(Vj(y)) / D).exp() * Vj(b)).sum(dim=1)
    grads = torch.autograd.grad(s.sum(), inputs)
    xr, yr, br = (v.detach().double().requires_grad_() for v in (x, y, b))
    d = (xr ** 2).sum(1)[:, None] + (yr ** 2).sum(1)[None] - 2 * xr @ yr.T
    sr = (-d / D).exp() @ br
    refs = torch.autograd.grad(sr.sum(), [xr, yr, br] if both else [xr])
    return s.detach(), grads, sr.detach(), refs


@pytest.mark.parametrize("both", [False, True], ids=["x", "x_y_b"])
def test_gaussian_gradient_at_d_4096_matches_torch(both, rng):
    s, grads, sr, refs = _gaussian_grads(4096, rng, both=both)
    assert torch.allclose(s.double(), sr, rtol=1e-4, atol=1e-4 * float(sr.abs().max()))
    for g, r in zip(grads, refs):
        scale = float(r.abs().max())
        assert float((g.double() - r).abs().max()) <= 1e-4 * scale


def _kernel_sizes(tmp_path, monkeypatch, D: int, rng) -> dict:
    """The sizes of the shared objects built for the forward and backward at dimension D,
    by kind (the kernels with a two-sided or wide sum, and the others)."""
    cache = tmp_path / f"cache{D}"
    monkeypatch.setenv("LAZYTENSOR_CACHE_DIR", str(cache))  # nothing on disk yet
    monkeypatch.setattr(engine, "_plans", engine.PlanCache(8))  # nor in this process
    monkeypatch.setattr(runtime, "_table", {})
    monkeypatch.setattr(backward, "_table", {})  # the two-sided kernels
    runtime.planned_shape.cache_clear()
    _gaussian_grads(D, rng, N=12, M=15)
    sizes = {}
    for src in glob.glob(str(cache / "*" / "*" / "kernel.cpp")):
        with open(src) as f:
            kind = "wide" if "LtWsum" in f.read() else "plain"
        sizes.setdefault(kind, []).append(os.path.getsize(src[:-3] + "so"))
    return {k: sorted(v) for k, v in sizes.items()}


def test_kernels_do_not_grow_with_the_dimension(tmp_path, monkeypatch, rng):
    """The machine code of D = 4,096 is that of D = 256 (a loop over the vector; a pass
    per 64 components made it 4x larger, and 40 s to compile)."""
    small = _kernel_sizes(tmp_path, monkeypatch, 256, rng)
    big = _kernel_sizes(tmp_path, monkeypatch, 4096, rng)
    assert "wide" in big and small.keys() == big.keys()
    for kind in big:
        assert len(big[kind]) == len(small[kind])
        for b, s in zip(big[kind], small[kind]):
            assert b <= 1.25 * s, (kind, small, big)
