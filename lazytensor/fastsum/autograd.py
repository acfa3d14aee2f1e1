"""The spectral sum as a ``torch.autograd.Function``: values and first gradients.

``SpectralSum.apply(far, x, y, w)`` is ``s = Σ_j g̃(x_i − y_j) w_j`` for a
:class:`lazytensor.fastsum.spectral.FarField`. Its backward, for the output gradient g:

- weights: ``∂/∂w_j = Σ_i g̃(y_j − x_i) g_i``, the same transform with the roles of x and y
  exchanged (the kernel is even, the period and box are shared);
- targets: ``∂/∂x_i = Σ_e g_ie Σ_j ∇g̃(x_i − y_j) w_je``, the transform of ``i ω_m c_m``;
- sources: ``∂/∂y_j = Σ_e w_je Σ_i ∇g̃(y_j − x_i) g_ie``, the same with x and y exchanged.

Tensors may live on any device: the transforms run on the CPU (finufft), the results
come back to the inputs' device. Second derivatives are not provided.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from . import spectral


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float64).numpy()


def _back(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(like.device, like.dtype)


class SpectralSum(torch.autograd.Function):
    """``(far, x (N, D), y (M, D), w (M, E)) -> (N, E)``, float64 tensors."""

    @staticmethod
    def forward(ctx, far, x, y, w):
        ctx.far = far
        ctx.save_for_backward(x, y, w)
        return _back(spectral.apply(far, _numpy(x), _numpy(y), _numpy(w)), w)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        far = ctx.far
        x, y, w = ctx.saved_tensors
        xn, yn, wn, gn = _numpy(x), _numpy(y), _numpy(w), _numpy(g)
        gx = gy = gw = None
        if ctx.needs_input_grad[1]:
            gx = _back(spectral.apply_gradient(far, xn, yn, wn, gn), x)
        if ctx.needs_input_grad[2]:
            gy = _back(spectral.apply_gradient(far, yn, xn, gn, wn), y)
        if ctx.needs_input_grad[3]:
            gw = _back(spectral.apply(far, yn, xn, gn), w)
        return None, gx, gy, gw
