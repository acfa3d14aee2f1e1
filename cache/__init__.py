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
>>> binary = cache.read_or_build("ab" * 32, build)
>>> binary.path.name, binary.data[:4], cache.lookup("ab" * 32) == binary.path
('kernel.so', b'\\x7fELF', True)

Load ``binary.data``, or a library through ``binary.load(ctypes.CDLL)``: exactly the
bytes that were verified. The root is checked once and then held open; nothing inside
it is reached through a symlink.

Modules: :mod:`lazytensor.cache.entry` (what an entry is and how it is verified),
:mod:`lazytensor.cache.safedir` (directories held open, no symlinks followed),
:mod:`lazytensor.cache.disk` (the layout), :mod:`lazytensor.cache.locking` (the per-key lock),
:mod:`lazytensor.cache.publish` (reading and building one entry),
:mod:`lazytensor.cache.loading` (:class:`VerifiedBinary`, loading what was verified),
:mod:`lazytensor.cache.location` (choosing a private root, falling back),
:mod:`lazytensor.cache.store` (:class:`KernelCache`, :func:`default_cache`).
"""

from .entry import FORMAT_VERSION
from .errors import CacheError, CacheWarning, InvalidKeyError
from .loading import VerifiedBinary
from .location import ENV_VAR
from .store import KernelCache, default_cache

__all__ = [
    "ENV_VAR",
    "FORMAT_VERSION",
    "CacheError",
    "CacheWarning",
    "InvalidKeyError",
    "KernelCache",
    "VerifiedBinary",
    "default_cache",
]
