"""torch.func transforms (grad, vjp, jvp, jacrev, jacfwd, hessian, vmap) and forward-mode
AD of reductions, against the same functions written densely in float64 torch."""

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import lazytensor.autodiff.autograd
from lazytensor import LazyTensor, Vi, Vj

func = torch.func
# torch's forward-mode decompositions load through torch.jit.script, which warns
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
TOL = dict(rtol=1e-9, atol=1e-11)


def tensors(rng, *shapes, positive=()):
    out = []
    for k, s in enumerate(shapes):
        a = rng.uniform(0.2, 1.0, s) if k in positive else rng.standard_normal(s)
        out.append(torch.tensor(a, dtype=torch.float64))
    return out


def gauss_lazy(x, y, b, p):
    K = (-LazyTensor(p) * ((LazyTensor(x) - LazyTensor(y)) ** 2).sum(-1)).exp()
    return (K * LazyTensor(b)).sum(dim=-2)


def gauss_dense(x, y, b, p):
    K = (-p[..., 0] * ((x - y) ** 2).sum(-1)).exp()[..., None]
    return (K * b).sum(-2)


def lse_lazy(x, y, b):
    D2 = ((LazyTensor(x) - LazyTensor(y)) ** 2).sum(-1)
    return D2.logsumexp(dim=-2, weight=LazyTensor(b))


def lse_dense(x, y, b):
    D2 = ((x - y) ** 2).sum(-1)[..., None]
    return torch.logsumexp(D2 + b.log(), dim=-2)


def allclose(a, b, **tol):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    assert len(a) == len(b)
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, **(tol or TOL))


@pytest.fixture
def gauss_args(rng):
    """x_i (3, 6, 1, 2), y_j (1, 7, 2), b_j (3, 1, 7, 1), p (1, 1, 1): batch (3,)."""
    return tensors(rng, (3, 6, 1, 2), (1, 7, 2), (3, 1, 7, 1), (1, 1, 1), positive=(3,))


def scalar(f):
    return lambda *a: f(*a).norm()


@pytest.mark.parametrize("transform", ["grad", "jacrev", "jacfwd", "hessian"])
def test_gradients_of_every_input_match_dense_torch(transform, gauss_args):
    argnums = (0, 1, 2, 3)
    t = getattr(func, transform)
    allclose(t(scalar(gauss_lazy), argnums)(*gauss_args), t(scalar(gauss_dense), argnums)(*gauss_args))


def test_vjp_and_jvp_match_dense_torch(gauss_args, rng):
    out, pullback = func.vjp(gauss_lazy, *gauss_args)
    ref, ref_pullback = func.vjp(gauss_dense, *gauss_args)
    allclose(out, ref)
    cot = tensors(rng, tuple(ref.shape))[0]
    allclose(pullback(cot), ref_pullback(cot))
    tangents = tuple(tensors(rng, *[tuple(a.shape) for a in gauss_args]))
    allclose(func.jvp(gauss_lazy, tuple(gauss_args), tangents),
             func.jvp(gauss_dense, tuple(gauss_args), tangents))


def test_jvp_with_some_tangents_only(gauss_args, rng):
    x, y, b, p = gauss_args
    (dx,) = tensors(rng, tuple(x.shape))
    allclose(func.jvp(lambda x: gauss_lazy(x, y, b, p), (x,), (dx,)),
             func.jvp(lambda x: gauss_dense(x, y, b, p), (x,), (dx,)))
    (db,) = tensors(rng, tuple(b.shape))  # the formula is linear in b
    allclose(func.jvp(lambda b: gauss_lazy(x, y, b, p), (b,), (db,)),
             func.jvp(lambda b: gauss_dense(x, y, b, p), (b,), (db,)))


@pytest.mark.parametrize("transform", ["vmap", "jvp", "jacfwd", "jacrev", "hessian"])
def test_weighted_logsumexp_under_transforms(transform, rng):
    x, y, b = tensors(rng, (2, 5, 1, 2), (2, 1, 6, 2), (2, 1, 6, 1), positive=(2,))
    if transform == "vmap":
        allclose(func.vmap(lse_lazy)(x, y, b), func.vmap(lse_dense)(x, y, b))
    elif transform == "jvp":
        tangents = tuple(tensors(rng, (2, 5, 1, 2), (2, 1, 6, 2), (2, 1, 6, 1)))
        allclose(func.jvp(lse_lazy, (x, y, b), tangents), func.jvp(lse_dense, (x, y, b), tangents))
    else:
        t = getattr(func, transform)
        allclose(t(scalar(lse_lazy), (0, 1, 2))(x, y, b), t(scalar(lse_dense), (0, 1, 2))(x, y, b))


def test_logsumexp_and_softmax_weighted_sum_forward_mode(rng):
    x, y, v = tensors(rng, (5, 2), (6, 2), (6, 3))
    dx, dy, dv = tensors(rng, (5, 2), (6, 2), (6, 3))

    def lazy(x, y, v):
        S = -Vi(x).sqdist(Vj(y))
        return S.logsumexp(dim=1), S.sumsoftmaxweight(Vj(v), dim=1)

    def dense(x, y, v):
        S = -((x[:, None] - y[None]) ** 2).sum(-1)
        return torch.logsumexp(S, 1, keepdim=True), torch.softmax(S, 1) @ v

    allclose(func.jvp(lazy, (x, y, v), (dx, dy, dv)), func.jvp(dense, (x, y, v), (dx, dy, dv)))
    allclose(func.jacfwd(lazy, (0, 1))(x, y, v), func.jacrev(dense, (0, 1))(x, y, v))


def test_reduction_over_i_under_jvp_and_vmap(rng):
    x, y = tensors(rng, (4, 5, 3), (4, 6, 3))
    dx, dy = tensors(rng, (5, 3), (6, 3))

    def lazy(x, y):
        return (Vi(x) * Vj(y)).sum(-1).sin().sum(dim=0)

    def dense(x, y):
        return (x[..., :, None, :] * y[..., None, :, :]).sum(-1).sin().sum(-2)[..., None]

    allclose(func.vmap(lazy)(x, y), func.vmap(dense)(x, y))
    allclose(func.jvp(lazy, (x[0], y[0]), (dx, dy)), func.jvp(dense, (x[0], y[0]), (dx, dy)))


def test_min_argmin_under_vmap_and_jvp(rng):
    x, y = tensors(rng, (3, 5, 2), (3, 8, 2))
    (dx,) = tensors(rng, (5, 2))

    def lazy_min(x, y):
        return Vi(x).sqdist(Vj(y)).min(dim=1)

    def dense_min(x, y):
        return ((x[..., :, None, :] - y[..., None, :, :]) ** 2).sum(-1).min(-1, keepdim=True)[0]

    def lazy_arg(x, y):
        return Vi(x).sqdist(Vj(y)).argmin(dim=1)

    allclose(func.vmap(lazy_min)(x, y), func.vmap(dense_min)(x, y))
    expected = ((x[..., :, None, :] - y[..., None, :, :]) ** 2).sum(-1).argmin(-1, keepdim=True)
    assert torch.equal(func.vmap(lazy_arg)(x, y), expected)
    allclose(func.jvp(lambda x: lazy_min(x, y[0]), (x[0],), (dx,)),
             func.jvp(lambda x: dense_min(x, y[0]), (x[0],), (dx,)))
    allclose(func.jacrev(lambda x: lazy_min(x, y[0]))(x[0]),
             func.jacrev(lambda x: dense_min(x, y[0]))(x[0]))


def test_k_min_values_under_jvp(rng):
    x, y = tensors(rng, (5, 2), (9, 2))
    (dy,) = tensors(rng, (9, 2))

    def lazy(y):
        return Vi(x).sqdist(Vj(y)).Kmin(3, dim=1)

    def dense(y):
        return ((x[:, None] - y[None]) ** 2).sum(-1).topk(3, dim=1, largest=False)[0]

    allclose(func.jvp(lazy, (y,), (dy,)), func.jvp(dense, (y,), (dy,)))


def test_nested_vmap_and_in_dims_out_dims(rng):
    x, y, b = tensors(rng, (4, 3, 6, 2), (7, 3, 2), (4, 7, 1))
    p = torch.tensor([0.7], dtype=torch.float64)

    def lazy(x, y, b):
        return gauss_lazy(x[:, None, :], y[None], b[None], p)

    def dense(x, y, b):
        return gauss_dense(x[:, None, :], y[None], b[None], p)

    nested = func.vmap(func.vmap(lazy, in_dims=(0, 1, None)), in_dims=(0, None, 0), out_dims=2)
    nested_ref = func.vmap(func.vmap(dense, in_dims=(0, 1, None)), in_dims=(0, None, 0),
                           out_dims=2)
    allclose(nested(x, y, b), nested_ref(x, y, b))


def test_vmap_runs_one_kernel_for_the_whole_batch(rng, monkeypatch):
    x, y, b = tensors(rng, (7, 5, 2), (6, 2), (6, 1))
    calls = []
    real = lazytensor.autodiff.autograd.execute

    def counting(call, arrays, ranges=None):
        calls.append(call.batch)
        return real(call, arrays, ranges)

    monkeypatch.setattr(lazytensor.autodiff.autograd, "execute", counting)
    out = func.vmap(lambda x: (-Vi(x).sqdist(Vj(y))).exp().sum(dim=1))(x)
    assert calls == [(7,)]
    ref = (-((x[:, :, None] - y) ** 2).sum(-1)).exp().sum(-1, keepdim=True)
    allclose(out, ref)


def test_gradients_of_a_vmapped_reduction_flow_to_the_inputs(rng):
    x, y, b = tensors(rng, (3, 5, 2), (3, 6, 2), (3, 6, 1))
    x.requires_grad_(True)
    p = torch.full((1, 1, 1), 0.8, dtype=torch.float64)
    out = func.vmap(lambda x, y, b: gauss_lazy(x[:, None], y[None], b[None], p))(x, y, b)
    ref = func.vmap(lambda x, y, b: gauss_dense(x[:, None], y[None], b[None], p))(x, y, b)
    allclose(out, ref)
    (u,) = tensors(rng, tuple(out.shape))
    allclose(torch.autograd.grad(out, x, u), torch.autograd.grad(ref, x, u))


def test_forward_ad_dual_tensors_carry_their_tangent(rng):
    x, y = tensors(rng, (5, 2), (6, 2))
    (dx,) = tensors(rng, (5, 2))
    with fwAD.dual_level():
        out = (-Vi(fwAD.make_dual(x, dx)).sqdist(Vj(y))).exp().sum(dim=1)
        primal, tangent = fwAD.unpack_dual(out)
    ref, ref_tangent = func.jvp(lambda x: (-((x[:, None] - y) ** 2).sum(-1)).exp().sum(1, True),
                                (x,), (dx,))
    allclose((primal, tangent), (ref, ref_tangent))


def test_float32_transforms_meet_float32_tolerances(rng):
    x, y, b, p = (a.float() for a in tensors(rng, (2, 40, 1, 3), (1, 50, 3), (2, 1, 50, 1),
                                              (1, 1, 1), positive=(3,)))
    args64 = [a.double() for a in (x, y, b, p)]
    for t in (func.grad, func.jacfwd):
        got = t(scalar(gauss_lazy), (0, 1, 2, 3))(x, y, b, p)
        want = t(scalar(gauss_dense), (0, 1, 2, 3))(*args64)
        allclose(tuple(g.double() for g in got), want, rtol=1e-5, atol=1e-6)
