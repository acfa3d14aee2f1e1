"""Sums over a formula's vector dimension (sqdist, sqnorm2, dot, sum) stay as accurate as
dense float32 torch at large D.

Added term by term, a float32 sum of D positive terms rounds each term to the ulp of the
running sum: at D = 1.1e6 a Gaussian sum was off by 1e-4 relative, where dense torch is
off by 1e-7. Long sums add blocks of terms and the blocks' sums pairwise (vector_ops.py);
squared distances through dot products (16 <= D <= 4096) sum their norms in double
(codegen/cpu/layout.py, rows.py).
"""

from __future__ import annotations

import pytest
import torch

from lazytensor import Vi, Vj

_FORMS = {
    "sqdist": (lambda x, y: x.sqdist(y), lambda x, y: ((x - y) ** 2).sum(-1)),
    "sqnorm2": (lambda x, y: (x - y).sqnorm2(), lambda x, y: ((x - y) ** 2).sum(-1)),
    "dot": (lambda x, y: (x * y).sum(), lambda x, y: (x * y).sum(-1)),
    "sum": (lambda x, y: (x + y).sum(), lambda x, y: (x + y).sum(-1)),
}


def _rel(a, b) -> float:
    return float(((a - b).abs() / b.abs()).max())


# 4096: the largest D of the dot products' GEMM; 2^16 + 5: the pairwise sums, with a
# partial last block (term by term, 2^16 was off by 30x dense torch's error)
@pytest.mark.parametrize("D", [4096, 2**16 + 5])
@pytest.mark.parametrize("form", sorted(_FORMS))
def test_float32_long_vector_sums_are_as_accurate_as_dense_torch(rng, form, D):
    """Σ_j exp(-F(x_i, y_j) / D) for x, y uniform in [0, 1): within 10x the error of
    dense float32 torch, against float64 on the same float32 inputs."""
    lazy, dense = _FORMS[form]
    x = torch.from_numpy(rng.random((4, D))).float()
    y = torch.from_numpy(rng.random((5, D))).float()
    sign = 1.0 if form in ("sqdist", "sqnorm2") else -1.0
    ref = torch.exp(-sign * dense(x.double()[:, None], y.double()[None]) / D).sum(1)
    yardstick = _rel(torch.exp(-sign * dense(x[:, None], y[None]) / D).sum(1).double(), ref)
    got = (-sign * lazy(Vi(x), Vj(y)) / D).exp().sum(dim=1)[:, 0].double()
    err = _rel(got, ref)
    print(f"{form} D={D}: {err:.1e} (dense float32: {yardstick:.1e})")
    assert err <= 10 * yardstick + 1e-7, (err, yardstick)


def test_sums_just_above_one_block_are_exact_on_integers(rng):
    """Integer terms are summed exactly in float32 (below 2^24) however the sum is split:
    a check of the blocks' bookkeeping (every term once) at D = 1 to 3 blocks + a tail."""
    for D in (63, 64, 65, 127, 128, 129, 200):
        x = torch.from_numpy(rng.integers(-50, 50, (3, D))).float()
        y = torch.from_numpy(rng.integers(-50, 50, (2, D))).float()
        got = (Vi(x) - Vj(y).abs()).sum().sum(dim=1)[:, 0]
        assert torch.equal(got, (x[:, None] - y[None].abs()).sum((1, 2))), D
