"""float16 and bfloat16 inputs: computed in float32, returned in the input's dtype, with
gradients in that dtype too; against float64 references at half-precision tolerances."""

import numpy as np
import pytest
import torch

from lazytensor import Genred, LazyTensor, Vi, Vj

# relative tolerances the rounding of the inputs and outputs allows
TOL = {"float16": 4e-3, "bfloat16": 3e-2}


def rel_err(got, want) -> float:
    got, want = (np.asarray(a.detach().double() if torch.is_tensor(a) else a, np.float64)
                 for a in (got, want))
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_half_values_and_gradients(dtype, rng):
    dt = getattr(torch, dtype)
    x = torch.tensor(rng.uniform(0, 1, (40, 3)), dtype=dt, requires_grad=True)
    y = torch.tensor(rng.uniform(0, 1, (50, 3)), dtype=dt)
    b = torch.tensor(rng.standard_normal((50, 2)), dtype=dt)
    out = (-Vi(x).sqdist(Vj(y))).exp() @ b
    g = torch.tensor(rng.standard_normal(out.shape), dtype=dt)
    (gx,) = torch.autograd.grad(out, x, g)
    x64 = x.detach().double().requires_grad_(True)
    ref = torch.exp(-((x64[:, None] - y.double()) ** 2).sum(-1)) @ b.double()
    (ref_gx,) = torch.autograd.grad(ref, x64, g.double())
    assert out.dtype == dt and gx.dtype == dt
    assert rel_err(out, ref) < TOL[dtype] and rel_err(gx, ref_gx) < 2 * TOL[dtype]


def test_numpy_float16_reductions_and_genred(rng):
    x = rng.uniform(0, 1, (30, 1, 2)).astype(np.float16)
    y = rng.uniform(0, 1, (1, 20, 2)).astype(np.float16)
    d2 = ((x.astype(np.float64) - y) ** 2).sum(-1)
    D = LazyTensor(x).sqdist(LazyTensor(y))
    lse = (-D).logsumexp(dim=1)
    assert lse.dtype == np.float16 and LazyTensor(x).dtype == np.float16
    assert rel_err(lse[:, 0], np.log(np.exp(-d2).sum(1))) < TOL["float16"]
    idx = D.argmin(dim=1)
    assert idx.dtype == np.int64
    # the float32 kernel sees the float16 values, so ties break as in float64 on them
    np.testing.assert_array_equal(idx[:, 0], d2.argmin(1))
    red = Genred("Exp(-SqDist(x, y)) * b", ["x = Vi(2)", "y = Vj(2)", "b = Vj(1)"], axis=1)
    b = rng.standard_normal((20, 1)).astype(np.float16)
    got = red(x[:, 0], y[0], b)
    assert got.dtype == np.float16
    assert rel_err(got, np.exp(-d2) @ b.astype(np.float64)) < TOL["float16"]


def test_half_mixed_with_another_dtype_is_refused(rng):
    x = rng.uniform(0, 1, (5, 2))
    with pytest.raises(TypeError, match=r"mixed dtypes.*float16.*float64"):
        (Vi(x.astype(np.float16)) * Vj(x)).sum(dim=1)
    with pytest.raises(TypeError, match="mixed dtypes"):
        (Vi(torch.tensor(x, dtype=torch.bfloat16)) * Vj(torch.tensor(x, dtype=torch.float16)))\
            .sum(dim=1)
