"""The exceptions and the warning that the kernel cache raises.

Callers catch one type, :class:`CacheError`, for every failure that belongs to the cache
itself (a bad key, a build that wrote no binary, a lock that never came free, a root that
cannot be used even after falling back). Exceptions raised by a caller's ``build``
function are never wrapped: they reach the caller unchanged.

>>> from lazytensor.cache import CacheError, InvalidKeyError
>>> issubclass(InvalidKeyError, CacheError) and issubclass(InvalidKeyError, ValueError)
True
"""

from __future__ import annotations


class CacheError(RuntimeError):
    """A cache operation failed for a reason that belongs to the cache, not to ``build``.

    >>> raise CacheError("lock timed out")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    lazytensor.cache.errors.CacheError: lock timed out
    """


class InvalidKeyError(CacheError, ValueError):
    """A key or file name was refused before it could reach the file system.

    It is also a ``ValueError`` because a malformed argument is what it is; it is also a
    ``CacheError`` so that code catching cache failures catches it too.

    >>> isinstance(InvalidKeyError("bad"), ValueError)
    True
    """


class CacheWarning(UserWarning):
    """The cache could not use the directory it was asked to and used a private one instead.

    Emitted once per process and per requested root, with the reason in the message.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as seen:
    ...     warnings.simplefilter("always")
    ...     warnings.warn("root is world-writable", CacheWarning)
    >>> seen[0].category.__name__
    'CacheWarning'
    """
