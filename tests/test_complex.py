"""Complex LazyTensors against dense complex128 NumPy and torch: every operation, mixed
real/complex operands, both reduction axes, gradients, dtypes, and the errors."""

import numpy as np
import pytest
import torch

from lazytensor import ComplexLazyTensor, LazyTensor, Vi, Vj


def crand(rng, *shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


def close(got, want, rtol=1e-10, atol=1e-12):
    got = got.detach().numpy() if isinstance(got, torch.Tensor) else got
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else want
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


# (lazy function, dense function) of z_i (N, 1, 3), w_j (1, M, 3), r_j (1, M, 3) real
CASES = {
    "mul": (lambda z, w, r: z * w, lambda z, w, r: z * w),
    "div": (lambda z, w, r: z / w, lambda z, w, r: z / w),
    "add_sub": (lambda z, w, r: z + w - 2 * z, lambda z, w, r: z + w - 2 * z),
    "conj": (lambda z, w, r: z.conj() * w, lambda z, w, r: z.conj() * w),
    "exp": (lambda z, w, r: (z - w).exp(), lambda z, w, r: np.exp(z - w)),
    "real_imag": (lambda z, w, r: (z * w).real * w.imag + r,
                  lambda z, w, r: (z * w).real * w.imag + r),
    "abs_angle": (lambda z, w, r: abs(z * w) + (z / w).angle(),
                  lambda z, w, r: np.abs(z * w) + np.angle(z / w)),
    "real_operands": (lambda z, w, r: r * z + r - z / r + (r - z) + r / z,
                      lambda z, w, r: r * z + r - z / r + (r - z) + r / z),
    "numbers": (lambda z, w, r: (2 - 1j) * z + 0.5j - w / (1 + 2j) + 3,
                lambda z, w, r: (2 - 1j) * z + 0.5j - w / (1 + 2j) + 3),
    "exp1j": (lambda z, w, r: r.exp1j() * z, lambda z, w, r: np.exp(1j * r) * z),
    "to_complex": (lambda z, w, r: r.real2complex() * z + r.imag2complex(),
                   lambda z, w, r: r * z + 1j * r),
    "power": (lambda z, w, r: (z - w) ** 3, lambda z, w, r: (z - w) ** 3),
    "vector_sum": (lambda z, w, r: (z * w).sum(-1) * z, lambda z, w, r: (z * w).sum(-1, keepdims=True) * z),
    "scalar_broadcast": (lambda z, w, r: z.sum(-1) * w + r.sum(-1) * z,
                         lambda z, w, r: z.sum(-1, keepdims=True) * w + r.sum(-1, keepdims=True) * z),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dim", [0, 1])
def test_complex_operations_match_numpy(case, dim, rng):
    z, w = crand(rng, 5, 1, 3), crand(rng, 1, 6, 3)
    r = rng.uniform(0.5, 1.5, (1, 6, 3))
    lazy, dense = CASES[case]
    got = lazy(LazyTensor(z), LazyTensor(w), LazyTensor(r)).sum(dim=dim)
    want = dense(z, w, r).sum(axis=dim)
    assert got.dtype == want.dtype  # complex128, or float64 for real parts, moduli, angles
    close(got, want)


def test_complex64_in_complex64_out_in_torch_and_numpy(rng):
    z, w = crand(rng, 40, 1, 2), crand(rng, 1, 50, 2)
    want = (z * w).sum(1)
    for lib in (np.asarray, torch.from_numpy):
        got = (LazyTensor(lib(z.astype(np.complex64))) * LazyTensor(lib(w.astype(np.complex64))))\
            .sum(dim=1)
        assert str(got.dtype).endswith("complex64")
        close(got, want, rtol=1e-5, atol=1e-5)


def test_torch_gradients_of_complex_inputs_match_dense_torch(rng):
    z = torch.tensor(crand(rng, 4, 1, 2), requires_grad=True)
    w = torch.tensor(crand(rng, 1, 5, 2), requires_grad=True)
    p = torch.tensor(rng.uniform(0.5, 1.0, (1, 5, 2)), requires_grad=True)

    def loss(lazy):
        Z, W, P = (LazyTensor(t) for t in (z, w, p)) if lazy else (z, w, p)
        out = (Z * (-1j * P * W).exp() / (W + 3)).sum(dim=1)
        return (out.real ** 2 + out.imag * out.real).sum() + out.abs().sum()

    got = torch.autograd.grad(loss(True), [z, w, p])
    want = torch.autograd.grad(loss(False), [z, w, p])
    for g, h in zip(got, want):
        close(g, h)
    assert got[0].dtype == torch.complex128 and got[2].dtype == torch.float64


def test_gradcheck_through_a_complex_reduction(rng):
    z = torch.tensor(crand(rng, 3, 2), requires_grad=True)
    w = torch.tensor(crand(rng, 4, 2), requires_grad=True)
    assert torch.autograd.gradcheck(lambda z, w: (Vi(z) * Vj(w).conj()).exp().sum(dim=1),
                                    (z, w))


def test_matmul_and_reduction_over_i(rng):
    z, w = crand(rng, 5, 1, 1), crand(rng, 1, 6, 1)
    v = crand(rng, 6, 2)
    K = (LazyTensor(z) * LazyTensor(w)).exp()
    dense = np.exp(z * w)[..., 0]
    close(K @ v, dense @ v)
    close(K @ v[:, 0], dense @ v[:, 0])
    close(K.sum(dim=0), dense.sum(0)[:, None])


def test_structure_of_a_complex_lazytensor(rng):
    z = LazyTensor(crand(rng, 5, 1, 3))
    assert isinstance(z, ComplexLazyTensor) and z.is_complex and not z.real.is_complex
    assert z.ndim == 3 and z.shape == (5, 1, 3) and z.dtype == np.complex128
    assert (z * LazyTensor(crand(rng, 1, 4, 3))).sum(-1).shape == (5, 4)
    assert LazyTensor(torch.zeros(1, 4, 2, dtype=torch.complex64)).dtype == torch.complex64
    assert isinstance(ComplexLazyTensor(Vi(np.ones((3, 2)))), ComplexLazyTensor)
    assert isinstance(ComplexLazyTensor(1j), ComplexLazyTensor)


def test_what_complex_lazytensors_do_not_support_raises_clearly(rng):
    z, w = LazyTensor(crand(rng, 5, 1, 2)), LazyTensor(crand(rng, 1, 4, 2))
    x = Vi(rng.standard_normal((5, 2)))
    with pytest.raises(NotImplementedError, match="only sums"):
        (z * w).sum(-1).min(dim=1)
    with pytest.raises(NotImplementedError, match="complex LazyTensor"):
        z.log()
    with pytest.raises(NotImplementedError, match="complex LazyTensor"):
        z.sqdist(w)
    with pytest.raises(NotImplementedError, match="real and complex"):
        x | z
    with pytest.raises(NotImplementedError, match="integer powers"):
        z ** 0.5
    with pytest.raises(ValueError, match="exp1j"):
        z.exp1j()


def test_numpy_and_torch_complex_part_functions_match_the_methods(rng):
    zx = rng.normal(size=(6, 2)) + 1j * rng.normal(size=(6, 2))
    zy = rng.normal(size=(5, 2)) + 1j * rng.normal(size=(5, 2))
    dense = zx[:, None] * zy[None]
    z = Vi(zx) * Vj(zy)
    for f in (np.conj, np.conjugate, np.real, np.imag, np.angle):
        np.testing.assert_allclose(f(z).sum(1), f(dense).sum(1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.conj(z).sum(1), z.conj().sum(1), rtol=1e-12)
    zt = Vi(torch.tensor(zx)) * Vj(torch.tensor(zy))
    for f in (torch.conj, torch.real, torch.imag, torch.angle):
        np.testing.assert_allclose(f(zt).sum(1).numpy(), f(torch.tensor(dense)).sum(1).numpy(),
                                   rtol=1e-12, atol=1e-12)
    K = Vi(zx.real).sqdist(Vj(zy.real))
    assert np.real(K) is K and np.conj(K) is K
    with pytest.raises(TypeError, match="imag of a real LazyTensor"):
        np.imag(K)
