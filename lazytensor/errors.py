"""Exception types of the user API.

>>> issubclass(ArgumentTypeError, TypeError) and issubclass(ArgumentTypeError, ValueError)
True
"""

from __future__ import annotations

__all__ = ["ArgumentTypeError"]


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong kind (an object that is not an array, an unsupported dtype,
    a wrong number of arrays, NumPy and torch mixed).

    A ``TypeError`` by Python's convention, and a ``ValueError`` too, because pykeops raises
    ``ValueError`` for these: code written for pykeops that catches ``ValueError`` keeps
    working.
    """
