"""Compatibility layers: run code written for other kernel libraries on lazytensor.

``lazytensor.compat.pykeops.install()`` makes ``import pykeops`` (and ``pykeops.torch``,
``pykeops.numpy``, their ``cluster`` modules, ``pykeops.config``, ``keopscore``) resolve to
lazytensor, so that libraries which import pykeops themselves (geomloss, GPyTorch, Falkon)
run unchanged. ``python -m lazytensor.compat`` prints what it covers.

>>> from lazytensor.compat import pykeops as compat_pykeops
>>> callable(compat_pykeops.install)
True
"""
