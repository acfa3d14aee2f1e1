"""NumPy's and torch's protocols on LazyTensors: ``np.exp(K)``, ``torch.logsumexp(K, dim=1)``.

- :mod:`.protocols`: ``__array_ufunc__``, ``__array_function__``, ``__torch_function__``;
- :mod:`.table`: which NumPy/SciPy/torch function runs which rule;
- :mod:`.rules`: the rules; :mod:`.softmax`: the lazy softmax they return.
"""
