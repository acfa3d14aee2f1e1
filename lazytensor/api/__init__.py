"""The user API, as pykeops spells it.

- :mod:`.lazy`: ``LazyTensor``, ``Vi``, ``Vj``, ``Pm``: formulas built by operators and
  methods, reduced by ``sum``, ``min``, ``argKmin``, ``logsumexp``, ``@``, ...;
- :mod:`.keops_methods`, :mod:`.complex_methods`: pykeops's other methods, complex values;
- :mod:`.method_docs`, :mod:`.typehints`: the methods' docstrings from the records, types;
- :mod:`.genred`: ``Genred`` and the ``generic_*`` reductions of formula strings;
- :mod:`.solve`: ``(alpha I + K) x = b`` by conjugate gradient (``K.solve``, ``KernelSolve``);
- :mod:`.symbolic`: symbolic variables (``Vi(0, 3)``), reductions called later, ``print(K)``;
- :mod:`.custom`: user elementwise functions from sympy expressions;
- :mod:`.materialize`: ``K.dense()`` and the refusal of implicit dense copies.
"""
