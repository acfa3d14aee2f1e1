"""Real clients of pykeops, unchanged, on lazytensor through the alias: geomloss, GPyTorch.

The alias is installed before they are imported (they probe for pykeops on import); each
KeOps path is compared with the same library's dense path on small data: geomloss's
``backend="online"``/``"multiscale"`` against ``"tensorized"``, GPyTorch's KeOps kernels
(forced with ``max_cholesky_size(0)``) against its dense kernels. float32 throughout,
except where the dense side is inexact (the energy distance's gradient at coincident
points); NaN fails everywhere.
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from lazytensor.compat import pykeops as alias

geomloss_missing = importlib.util.find_spec("geomloss") is None
gpytorch_missing = importlib.util.find_spec("gpytorch") is None


@pytest.fixture(scope="module")
def clients():
    """geomloss and gpytorch imported after the alias (or already imported through it)."""
    alias.install()
    try:
        mods = {name: importlib.import_module(name) for name in ("geomloss", "gpytorch")
                if importlib.util.find_spec(name) is not None}
        import lazytensor

        if "gpytorch" in mods:
            keops_kernel = sys.modules["gpytorch.kernels.keops.keops_kernel"]
            assert getattr(keops_kernel, "LazyTensor", None) is lazytensor.LazyTensor, \
                "gpytorch was imported before the alias: its KeOps kernels do not use lazytensor"
        if "geomloss" in mods:
            backend = sys.modules["geomloss._legacy.sinkhorn_samples"]
            assert backend.LazyTensor is lazytensor.LazyTensor, \
                "geomloss was imported before the alias: its KeOps backends do not use lazytensor"
        yield mods
    finally:
        alias.uninstall()


def _loss_and_grads(clients, loss, backend, x, y, **kw):
    x, y = x.clone().requires_grad_(), y.clone().requires_grad_()
    value = clients["geomloss"].SamplesLoss(loss, backend=backend, **kw)(x, y)
    grads = torch.autograd.grad(value.sum(), (x, y))
    assert torch.isfinite(value).all() and all(torch.isfinite(g).all() for g in grads)
    return value.detach(), grads


def _close(got, want, rtol):
    """Within ``rtol`` of the largest entry of ``want`` (losses and gradients are sums)."""
    scale = want.abs().max().item()
    err = (got - want).abs().max().item()
    assert err <= rtol * scale, f"error {err:.3g} > {rtol} x {scale:.3g}"


@pytest.fixture
def kept_fractions(monkeypatch):
    """The fraction of the (i, j) pairs that each block-sparse reduction visits."""
    import numpy as np

    from lazytensor.scale import ranges as ranges_mod

    fractions, reduce = [], ranges_mod.reduce

    def spy(formula, variables, reduction, axis, opts, backend, grad_mode, ranges):
        r = [np.asarray(a.cpu() if torch.is_tensor(a) else a) for a in ranges]
        rows, slices, intervals = r[0:3] if axis == 1 else r[3:6]
        starts = np.concatenate([[0], slices[:-1]])
        visited = sum((e - s) * (intervals[a:b, 1] - intervals[a:b, 0]).sum()
                      for (s, e), a, b in zip(rows, starts, slices))
        fractions.append(visited / (rows[-1, 1] * intervals[:, 1].max()))
        return reduce(formula, variables, reduction, axis, opts, backend, grad_mode, ranges)

    monkeypatch.setattr(ranges_mod, "reduce", spy)
    return fractions


def _clouds(generator, B, N, M, dtype=torch.float32, shared=0):
    x = torch.rand(B, N, 2, generator=generator, dtype=dtype)
    y = torch.rand(B, M, 2, generator=generator, dtype=dtype) * 0.8 + 0.1
    y[:, :shared] = x[:, :shared]  # coincident points: |x - y| has a kink there
    return x, y


@pytest.mark.skipif(geomloss_missing, reason="geomloss is not installed (pip install -e '.[test]')")
@pytest.mark.parametrize("loss, kw, dtype, rtol", [
    # against the float64 dense path: float32 kernels reach ~1e-8 on values, ~4e-7 on gradients
    ("sinkhorn", {"p": 2, "blur": 0.05}, torch.float32, 1e-5),
    # the dense |x - y| is clamped at 1e-4: the diagonal of the x-x and y-y terms is off by
    # that (about 1e-4 (1/N + 1/M) / 2 on the energy distance)
    ("sinkhorn", {"p": 1, "blur": 0.1}, torch.float32, 1e-3),
    ("energy", {}, torch.float32, 1e-3),
    ("gaussian", {"blur": 0.1}, torch.float32, 1e-5)])
def test_geomloss_online_matches_tensorized_batched(clients, loss, kw, dtype, rtol, rng):
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    x, y = _clouds(g, 3, 150, 120, dtype)
    got, got_grads = _loss_and_grads(clients, loss, "online", x, y, **kw)
    # the reference is the dense path in float64: in float32 its own gradient error reaches
    # 1e-3 to 2e-2 of the largest entry (the p = 1 cost's sqrt and the dense softmin)
    want, want_grads = _loss_and_grads(clients, loss, "tensorized", x.double(), y.double(),
                                       **kw)
    assert got.shape == want.shape == (3,) and got.dtype == dtype
    _close(got.double(), want, rtol)
    for a, b in zip(got_grads, want_grads):
        _close(a.double(), b, 10 * rtol)


@pytest.mark.skipif(geomloss_missing, reason="geomloss is not installed (pip install -e '.[test]')")
def test_geomloss_energy_gradient_at_coincident_points(clients, rng):
    """-|x - y| has a kink at x = y: KeOps's rsqrt(0) = 0 gives the 0 subgradient there (a
    NaN before); float64, where the dense path's sqrt of a rounded zero is accurate."""
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    x, y = _clouds(g, 2, 80, 70, torch.float64, shared=20)
    got, got_grads = _loss_and_grads(clients, "energy", "online", x, y)
    want, want_grads = _loss_and_grads(clients, "energy", "tensorized", x, y)
    _close(got, want, 1e-3)  # the dense path clamps |x - y|² at 1e-8: |x - y| >= 1e-4
    for a, b in zip(got_grads, want_grads):
        _close(a, b, 1e-6)


@pytest.mark.skipif(geomloss_missing, reason="geomloss is not installed (pip install -e '.[test]')")
def test_geomloss_multiscale_sinkhorn_uses_ranges_correctly(clients, rng, kept_fractions):
    """Multiscale Sinkhorn prunes blocks of the cost matrix (block-sparse ``ranges``): it
    must give what the same scheme gives without pruning (``truncate=None``), and stay
    within geomloss's own multiscale approximation of the tensorized result."""
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    x, y = (c[0] for c in _clouds(g, 1, 1000, 800))
    # clusters of side 0.1 > blur: the fine scale is reached, and blocks are pruned there
    kw = {"p": 2, "blur": 0.02, "scaling": 0.7, "cluster_scale": 0.1}
    pruned, pruned_grads = _loss_and_grads(clients, "sinkhorn", "multiscale", x, y, **kw)
    assert kept_fractions and min(kept_fractions) < 0.8, kept_fractions  # blocks were pruned
    full, full_grads = _loss_and_grads(clients, "sinkhorn", "multiscale", x, y, truncate=None,
                                       **kw)
    _close(pruned, full, 1e-4)
    for a, b in zip(pruned_grads, full_grads):
        _close(a, b, 1e-3)
    # geomloss's coarse-to-fine scheme differs from the tensorized one by ~0.5% (values) and
    # ~10% (gradients) here, with pykeops too (the same digits): a sanity bound only
    kw.pop("cluster_scale")
    dense, dense_grads = _loss_and_grads(clients, "sinkhorn", "tensorized", x, y, **kw)
    _close(pruned, dense, 2e-2)
    for a, b in zip(pruned_grads, dense_grads):
        _close(a, b, 0.3)


@pytest.mark.skipif(geomloss_missing, reason="geomloss is not installed (pip install -e '.[test]')")
def test_geomloss_multiscale_gaussian_matches_tensorized(clients, rng, kept_fractions):
    """Kernel truncation at 5 blurs drops terms below exp(-12.5): the ranges' result is the
    dense one to float32 accuracy."""
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    x, y = (c[0] for c in _clouds(g, 1, 800, 700))
    kw = {"blur": 0.03, "cluster_scale": 3.0}  # in blurs: 0.09
    got, got_grads = _loss_and_grads(clients, "gaussian", "multiscale", x, y, **kw)
    assert kept_fractions and max(kept_fractions) < 0.8, kept_fractions
    want, want_grads = _loss_and_grads(clients, "gaussian", "tensorized", x, y, blur=0.03)
    _close(got, want, 1e-4)
    for a, b in zip(got_grads, want_grads):
        _close(a, b, 1e-3)


# ------------------------------------------------------------------ GPyTorch


def _gp_fit(gpytorch, kernel, X, Y, iters=10):
    """An ExactGP fit with Adam (the loss at each step), then predictive means."""

    class GP(gpytorch.models.ExactGP):
        def __init__(self):
            super().__init__(X, Y, gpytorch.likelihoods.GaussianLikelihood())
            self.mean = gpytorch.means.ConstantMean()
            self.cov = gpytorch.kernels.ScaleKernel(kernel)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean(x), self.cov(x))

    torch.manual_seed(0)  # CG's probe vectors: the same for both kernels
    model = GP()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    losses = []
    with gpytorch.settings.max_cholesky_size(0), gpytorch.settings.eval_cg_tolerance(1e-5):
        model.train()
        for _ in range(iters):
            opt.zero_grad()
            loss = -mll(model(X), Y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        model.eval()
        with torch.no_grad():
            mean = model.likelihood(model(X[:40])).mean
    return torch.tensor(losses), mean, model


@pytest.mark.skipif(gpytorch_missing, reason="gpytorch is not installed (pip install -e '.[test]')")
@pytest.mark.parametrize("kernel", ["rbf", "matern0.5", "matern2.5"])
def test_gpytorch_keops_kernels_fit_like_the_dense_kernels(clients, kernel, rng, monkeypatch):
    gpytorch = clients["gpytorch"]
    g = torch.Generator().manual_seed(int(rng.integers(2**31)))
    X = torch.rand(200, 2, generator=g)
    Y = torch.sin(6 * X[:, 0]) * torch.cos(4 * X[:, 1]) + 0.05 * torch.randn(200, generator=g)
    keops, dense = gpytorch.kernels.keops, gpytorch.kernels
    if kernel == "rbf":
        pair = keops.RBFKernel(), dense.RBFKernel()
    else:
        nu = float(kernel[6:])
        pair = keops.MaternKernel(nu=nu), dense.MaternKernel(nu=nu)
    # the KeOps path really runs: K @ v of the KeOps kernel is a lazytensor reduction
    from lazytensor.engine import plans as engine

    calls, reduce = [], engine.reduce
    monkeypatch.setattr(engine, "reduce", lambda *a, **k: calls.append(a[2]) or reduce(*a, **k))
    v = torch.randn(200, 3, generator=g)
    with gpytorch.settings.max_cholesky_size(0):
        kv = pair[0](X, X) @ v
    assert calls == ["sum"]
    monkeypatch.undo()
    _close(kv, pair[1](X, X).to_dense() @ v, 1e-5)
    got_losses, got_mean, _ = _gp_fit(gpytorch, pair[0], X, Y)
    want_losses, want_mean, _ = _gp_fit(gpytorch, pair[1], X, Y)
    assert torch.isfinite(got_losses).all() and torch.isfinite(got_mean).all()
    _close(got_losses, want_losses, 1e-3)
    _close(got_mean, want_mean, 5e-3)
