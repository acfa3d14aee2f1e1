"""Type aliases of the public signatures (importing this module does not import torch).

- :data:`Array`: a NumPy array or a torch tensor: what a ``LazyTensor`` wraps, what
  ``Genred`` takes, what a reduction returns (in the library, dtype and device of its
  inputs).
- :data:`Reduced`: what a reduction returns: an array, a tuple of arrays (``min_argmin``,
  ``Kmin_argKmin``, ``max_sumshiftexp`` ...), or with ``call=False`` the function that
  computes it from new arrays.

>>> import numpy as np
>>> from lazytensor import Vi, Vj
>>> x = np.arange(6.0).reshape(3, 2)
>>> out = Vi(x).sqdist(Vj(x)).sum(dim=1)
>>> isinstance(out, np.ndarray), out.shape
(True, (3, 1))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Tuple, Union

import numpy as np

if TYPE_CHECKING:
    import torch

#: A NumPy array or a torch tensor.
Array = Union[np.ndarray, "torch.Tensor"]

#: An array, a tuple of arrays, or (``call=False``) the function that computes them.
Reduced = Union[Array, Tuple[Array, ...], Callable[..., Any]]

__all__ = ["Array", "Reduced"]
