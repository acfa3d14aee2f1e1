"""Softmax of a LazyTensor over i or j, kept symbolic until it is used.

``torch.softmax(K, dim=1) @ v`` is ``Σ_j softmax_j(K_ij) v_j``: one SumSoftMaxWeight
reduction, without the log-sum-exp of each row ever being computed apart. Any other use of
the softmax (``np.exp`` of it, a reduction, ``.dense()``) sees the explicit LazyTensor
``exp(K - logsumexp(K))``, whose log-sum-exp (a reduction) runs on first use.
"""

from __future__ import annotations

import numpy as np

from ..api.lazy import LazyTensor


def lse_leaf(K: LazyTensor, dim: int) -> LazyTensor:
    """``logsumexp`` of K over i or j, as an i- (over j) or j-variable (over i) to subtract."""
    lse = K.logsumexp(dim=dim)
    return LazyTensor(lse[..., :, None, :] if dim == K.nbatchdims + 1 else lse[..., None, :, :])


class SoftmaxLazyTensor(LazyTensor):
    """``softmax(K)`` over i or j: ``S @ v`` is one SumSoftMaxWeight reduction (softmax
    over j); any other use sees the explicit ``exp(K - logsumexp(K))``, whose
    log-sum-exp is computed on first use.

    >>> import numpy as np
    >>> from lazytensor import Vi, Vj
    >>> q, k, v = np.random.rand(5, 2), np.random.rand(6, 2), np.random.rand(6, 3)
    >>> (SoftmaxLazyTensor(Vi(q) | Vj(k), 1) @ v).shape
    (5, 3)
    """

    def __init__(self, scores: LazyTensor, dim: int):
        self.scores, self.softmax_dim = scores, dim
        self._explicit = None
        if scores.ranges is not None:
            self.ranges = scores.ranges

    def _form(self) -> LazyTensor:
        if self._explicit is None:
            self._explicit = (self.scores - lse_leaf(self.scores, self.softmax_dim)).exp()
        return self._explicit

    @property
    def formula(self):
        return self._form().formula

    @property
    def variables(self):
        return self._form().variables

    def __matmul__(self, v, **kwargs):
        scores = self.scores
        if (self.softmax_dim != scores.nbatchdims + 1 or scores.formula.dim != 1
                or isinstance(v, LazyTensor)):
            return LazyTensor.__matmul__(self, v, **kwargs)
        v = v if hasattr(v, "ndim") else np.asarray(v, dtype=np.float64)
        if v.ndim == 0:
            raise ValueError("softmax(K) @ v needs v of shape (M,) or (M, E), got a 0D array")
        vj = LazyTensor(v, axis=1) if v.ndim <= 2 else LazyTensor(v[..., None, :, :])
        dim = max(scores.nbatchdims, vj.nbatchdims) + 1
        out = scores.sumsoftmaxweight(vj, dim=dim, **kwargs)
        return out[..., 0] if v.ndim == 1 else out


__all__ = ["SoftmaxLazyTensor", "lse_leaf"]
