"""pykeops.torch-style entry points: ``from lazytensor.torch import LazyTensor, Genred``.

The same objects as the top-level package (every function takes NumPy arrays and torch
tensors alike); this module exists so that code written for ``pykeops.torch`` ports by
changing the import. ``lazytensor.torch.cluster`` stands for ``pykeops.torch.cluster``.

>>> from lazytensor.torch import LazyTensor, Vi, Vj, Genred, KernelSolve
"""

import sys

from .api.custom import elementwise
from .api.genred import Genred, generic_argkmin, generic_argmin, generic_logsumexp, generic_sum
from .api.lazy import ComplexLazyTensor, LazyTensor, Pm, Vi, Vj
from .api.solve import KernelSolve
from .scale import cluster

__all__ = ["ComplexLazyTensor", "Genred", "KernelSolve", "LazyTensor", "Pm", "Vi", "Vj", "elementwise",
           "generic_argkmin", "generic_argmin", "generic_logsumexp", "generic_sum"]

# ``from lazytensor.torch.cluster import grid_cluster``, as ``from pykeops.torch.cluster import ...``
sys.modules[__name__ + ".cluster"] = cluster
