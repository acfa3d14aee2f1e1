"""lazytensor's kernel cache: bytes in, bytes out, keyed by a hex digest.

The cache knows nothing about formulas or compilers (it never imports ``lazytensor`` or
``codegen``). A caller computes a key that covers everything affecting the binary and
hands over a ``build(tmpdir)`` function; the cache runs it at most once across threads
and processes, stores the result atomically and verifies it on every load.

>>> import tempfile
>>> from lazytensor.cache import KernelCache
>>> cache = KernelCache(tempfile.mkdtemp())
>>> def build(tmp):
...     (tmp / "kernel.cpp").write_text("// source")
...     (tmp / "kernel.so").write_bytes(b"\\x7fELF...")
...     return {"compiler": "g++ 12", "flags": ["-O3"]}
>>> path = cache.get_or_build("ab" * 32, build)
>>> path.name, cache.lookup("ab" * 32) == path
('kernel.so', True)

Modules: :mod:`lazytensor.cache.entry` (what an entry is and how it is verified),
:mod:`lazytensor.cache.location` (choosing a private root, falling back),
:mod:`lazytensor.cache.store` (:class:`KernelCache`, locking, :func:`default_cache`).
"""

from .entry import FORMAT_VERSION
from .errors import CacheError, CacheWarning, InvalidKeyError
from .location import ENV_VAR
from .store import KernelCache, default_cache

__all__ = [
    "ENV_VAR",
    "FORMAT_VERSION",
    "CacheError",
    "CacheWarning",
    "InvalidKeyError",
    "KernelCache",
    "default_cache",
]
