"""pykeops.numpy-style entry points: ``from lazytensor.numpy import LazyTensor, Genred``.

The same objects as the top-level package (every function takes NumPy arrays and torch
tensors alike); this module exists so that code written for ``pykeops.numpy`` ports by
changing the import. ``lazytensor.numpy.cluster`` stands for ``pykeops.numpy.cluster``.

>>> from lazytensor.numpy import LazyTensor, Vi, Vj, Genred, KernelSolve
"""

import sys

from .api.custom import elementwise
from .api.genred import Genred, generic_argkmin, generic_argmin, generic_logsumexp, generic_sum
from .api.lazy import ComplexLazyTensor, LazyTensor, Pm, Vi, Vj
from .api.solve import KernelSolve
from .scale import cluster

__all__ = ["ComplexLazyTensor", "Genred", "KernelSolve", "LazyTensor", "Pm", "Vi", "Vj", "elementwise",
           "generic_argkmin", "generic_argmin", "generic_logsumexp", "generic_sum"]

# ``from lazytensor.numpy.cluster import grid_cluster``, as ``from pykeops.numpy.cluster import ...``
sys.modules[__name__ + ".cluster"] = cluster
