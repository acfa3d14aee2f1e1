"""NumPy's and torch's protocols on LazyTensors: ``np.exp(K)``, ``torch.logsumexp(K, dim=1)``.

- :mod:`.protocols`: ``__array_ufunc__``, ``__array_function__``, ``__torch_function__``;
- :mod:`.table`: which NumPy/SciPy/torch function runs which rule;
- :mod:`.rules`: the rules; :mod:`.softmax`: the lazy softmax they return.
"""

from ..lazy_exports import lazy_exports

# the names ``lazytensor.interop`` exported when it was one module, loaded on first use
__all__ = ["array_function", "array_ufunc", "mapped_functions", "resolve", "torch_function"]
__getattr__, __dir__ = lazy_exports(globals(), dict.fromkeys(__all__, "protocols"))
