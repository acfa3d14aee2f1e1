"""lazytensor: kernel reductions on large point sets, without the N x M matrix.

>>> import numpy as np
>>> from lazytensor import Vi, Vj
>>> x, y, b = np.random.rand(500, 3), np.random.rand(400, 3), np.random.rand(400, 2)
>>> K = (-Vi(x).sqdist(Vj(y))).exp()
>>> (K @ b).shape
(500, 2)
"""

from .custom import elementwise
from .genred import Genred, generic_argkmin, generic_argmin, generic_logsumexp, generic_sum
from .lazy import LazyTensor, Pm, Vi, Vj
from .solve import KernelSolve

__version__ = "0.1.0"

__all__ = ["LazyTensor", "Pm", "Vi", "Vj", "__version__"]
__all__ += ["Genred", "KernelSolve", "elementwise", "generic_argkmin", "generic_argmin",
            "generic_logsumexp", "generic_sum"]
