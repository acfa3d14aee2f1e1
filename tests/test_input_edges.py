"""Edge inputs that used to fail obscurely or give silently wrong results: empty point sets
with gradients, ``out=`` arrays of the wrong shape or dtype, torch's negated views,
non-integer slice and one-hot parameters, and K larger than the number of points."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lazytensor import Genred, LazyTensor, Pm, Vi, Vj

# ------------------------------------------------------------------ empty point sets


@pytest.mark.parametrize("grad_mode", ["auto", "symbolic", "dual"])
@pytest.mark.parametrize("reduction", ["sum", "logsumexp"])
@pytest.mark.parametrize("N,M", [(0, 4), (5, 0), (0, 0)])
def test_empty_point_sets_have_zero_gradients(rng, grad_mode, reduction, N, M):
    x = torch.from_numpy(rng.standard_normal((N, 3))).requires_grad_()
    y = torch.from_numpy(rng.standard_normal((M, 3))).requires_grad_()
    F = -Vi(x).sqdist(Vj(y))
    out = getattr(F.exp() if reduction == "sum" else F, reduction)(dim=1, grad_mode=grad_mode)
    assert out.shape == (N, 1)
    out.sum().backward()
    # no pair at all: nothing depends on the other side's points
    assert x.grad.shape == (N, 3) and y.grad.shape == (M, 3)
    assert torch.equal(x.grad, torch.zeros_like(x)) and torch.equal(y.grad, torch.zeros_like(y))


def test_empty_i_side_with_a_parameter_and_batch_dims(rng):
    x = torch.from_numpy(rng.standard_normal((2, 0, 3))).requires_grad_()
    y = torch.from_numpy(rng.standard_normal((2, 4, 3))).requires_grad_()
    s = torch.tensor([0.5], dtype=torch.float64, requires_grad=True)
    F = -(LazyTensor(x[:, :, None, :]).sqdist(LazyTensor(y[:, None, :, :])) * Pm(s)).exp()
    F.sum(dim=2, grad_mode="dual").sum().backward()
    assert torch.equal(y.grad, torch.zeros_like(y)) and torch.equal(s.grad, torch.zeros_like(s))


# ------------------------------------------------------------------ out=


def _xy(rng, lib):
    x, y = rng.standard_normal((5, 3)), rng.standard_normal((4, 3))
    return (torch.from_numpy(x).float(), torch.from_numpy(y).float()) if lib == "torch" else (
        x.astype(np.float32), y.astype(np.float32))


@pytest.mark.parametrize("lib", ["torch", "numpy"])
def test_out_of_the_right_shape_and_dtype_receives_the_result(rng, lib):
    x, y = _xy(rng, lib)
    out = torch.empty(5, 3) if lib == "torch" else np.empty((5, 3), np.float32)
    res = (Vi(x) * Vj(y)).sum(dim=1, out=out)
    assert res is out
    xn, yn = np.asarray(x), np.asarray(y)
    np.testing.assert_allclose(np.asarray(out), (xn[:, None] * yn[None]).sum(1), rtol=1e-6)
    g = Genred("x*y", ["x=Vi(3)", "y=Vj(3)"], "Sum", axis=1)
    out2 = torch.empty(5, 3) if lib == "torch" else np.empty((5, 3), np.float32)
    assert g(x, y, out=out2) is out2
    np.testing.assert_array_equal(np.asarray(out2), np.asarray(out))


@pytest.mark.parametrize("lib", ["torch", "numpy"])
@pytest.mark.parametrize("bad", ["shape", "broadcastable", "dtype", "library"])
def test_out_of_another_shape_dtype_or_library_is_refused(rng, lib, bad):
    """Refused, not broadcast or cast: the message names what was expected."""
    x, y = _xy(rng, lib)
    shapes = {"shape": (5, 2), "broadcastable": (5, 1), "dtype": (5, 3), "library": (5, 3)}
    dtype = np.float64 if bad == "dtype" else np.float32
    out = np.zeros(shapes[bad], dtype)
    if (lib == "torch") != (bad == "library"):
        out = torch.from_numpy(out)
    before = out.clone() if torch.is_tensor(out) else out.copy()
    err = TypeError if bad == "library" else ValueError
    with pytest.raises(err, match=r"out: expected") as info:
        (Vi(x) * Vj(y)).sum(dim=1, out=out)
    if bad != "library":
        assert "shape (5, 3), dtype float32" in str(info.value)
    with pytest.raises(err, match=r"out: expected"):
        Genred("x*y", ["x=Vi(3)", "y=Vj(3)"], "Sum", axis=1)(x, y, out=out)
    assert (out == before).all()  # left untouched


def test_out_with_several_outputs_is_refused(rng):
    x, y = _xy(rng, "torch")
    with pytest.raises(TypeError, match="2 outputs"):
        Vi(x).sqdist(Vj(y)).min_argmin(dim=1, out=torch.empty(5, 1))


# ------------------------------------------------------------------ negated views


def test_negated_views_are_read_with_their_sign(rng):
    """``torch._neg_view`` and ``t.conj().imag`` are views whose sign torch applies on
    reading; a kernel reading their memory must see the negated values."""
    base = torch.from_numpy(rng.standard_normal((6, 3)))
    neg = torch._neg_view(base)
    z = torch.complex(torch.from_numpy(rng.standard_normal((6, 3))),
                      torch.from_numpy(rng.standard_normal((6, 3))))
    imag = z.conj().imag
    y = torch.from_numpy(rng.standard_normal((4, 3)))
    assert neg.is_neg() and neg.is_contiguous() and imag.is_neg()
    for v, plain in ((neg, -base), (imag, -z.imag)):
        want = (plain[:, None] * y[None]).sum(1)
        for backend in ("auto", "numpy"):
            got = (Vi(v) * Vj(y)).sum(dim=1, backend=backend)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        got = (Vj(v) * Vi(y)).sum(dim=1)
        torch.testing.assert_close(got, (y[:, None] * plain[None]).sum(1), rtol=1e-12, atol=1e-12)
        got = (Pm(v[0]) * Vj(y)).sum().sum(dim=1)  # Σ_j <p, y_j>
        torch.testing.assert_close(got.reshape(()), (y @ plain[0]).sum(), rtol=1e-12, atol=1e-12)


def test_gradients_through_a_negated_view(rng):
    base = torch.from_numpy(rng.standard_normal((6, 3))).requires_grad_()
    y = torch.from_numpy(rng.standard_normal((4, 3)))
    (-(Vi(torch._neg_view(base)).sqdist(Vj(y)))).exp().sum(dim=1).sum().backward()
    ref_base = base.detach().clone().requires_grad_()
    torch.exp(-((-ref_base[:, None] - y[None]) ** 2).sum(-1)).sum().backward()
    torch.testing.assert_close(base.grad, ref_base.grad, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ integer parameters


@pytest.mark.parametrize("call,match", [
    (lambda v: v.extract(0.5, 1), "slice: start must be an integer, got 0.5"),
    (lambda v: v.extract(1, 1.5), "slice: length must be an integer, got 1.5"),
    (lambda v: v.extract(True, 1), "slice: start must be an integer, got True"),
    (lambda v: v[:, :1].one_hot(2.5), "one_hot: dimension must be an integer, got 2.5"),
    (lambda v: v[:, :1]._op("expand", params=(3.0,)), "expand: dimension must be an integer"),
])
def test_non_integer_slices_and_dimensions_are_type_errors(call, match):
    x = np.ones((3, 4))
    with pytest.raises(TypeError, match=match):
        call(Vi(x))


def test_numpy_integers_are_integers():
    x = np.arange(12.0).reshape(3, 4)
    got = Vi(x).extract(np.int64(1), np.int32(2)).sum(dim=1)
    np.testing.assert_array_equal(got, x[:, 1:3])


# ------------------------------------------------------------------ K and M


def test_k_larger_than_the_points_is_refused_with_or_without_ranges(rng):
    x, y = rng.standard_normal((6, 2)), rng.standard_normal((4, 2))
    D = Vi(x).sqdist(Vj(y))
    with pytest.raises(ValueError, match=r"K=5 is larger than the number of reduced points \(4\)"):
        D.argKmin(5, dim=1)
    ranges = (np.array([[0, 3], [3, 6]]), np.array([1, 2]), np.array([[0, 2], [0, 4]]),
              np.array([[0, 2], [2, 4]]), np.array([1, 2]), np.array([[0, 3], [0, 6]]))
    with pytest.raises(ValueError, match=r"K=5 is larger than the number of reduced points \(4\)"):
        D.argKmin(5, dim=1, ranges=ranges)
    # K <= M: a block that sees fewer than K points pads (+inf, index -1)
    vals, idx = D.Kmin_argKmin(3, dim=1, ranges=ranges)
    assert np.isinf(vals[:3, 2]).all() and (idx[:3, 2] == -1).all()
    full = np.sort(((x[3:, None] - y[None]) ** 2).sum(-1), 1)[:, :3]
    np.testing.assert_allclose(vals[3:], full, rtol=1e-12)


@pytest.mark.parametrize("bound", [0.5, float("inf"), float("nan"), "1", True])
def test_clampint_refuses_bounds_that_are_not_integers(rng, bound):
    x = Vi(rng.standard_normal((5, 1)))
    with pytest.raises(TypeError, match="clampint: bound a="):
        x.clampint(bound, 2)


def test_clampint_takes_integer_valued_bounds(rng):
    data = 3 * rng.standard_normal((7, 2))
    got = (Vi(data).clampint(np.int64(-1), 2.0) * Vj(np.ones((3, 1)))).sum(1)
    np.testing.assert_allclose(got, 3 * np.clip(data, -1, 2), rtol=1e-12)
