"""A verified binary: the bytes that were hashed, and how to load exactly those.

Hashing a file and then loading it by name leaves a window in which the name can be
made to point at other bytes. So the cache hands out the bytes themselves, read and
hashed through one descriptor (:class:`VerifiedBinary`). A loader that takes bytes
(a CUDA module) uses :attr:`VerifiedBinary.data`; a loader that needs a file
(``dlopen``) gets :meth:`VerifiedBinary.load`: the bytes are written to a new private
file, created exclusively in the cache's ``loads/`` directory, reached through that
directory's open descriptor (``/proc/self/fd/N/<name>``), and removed once loaded.

Why not ``dlopen("/proc/self/fd/N")`` of the descriptor that was hashed: the dynamic
loader recognises a library by the path string it was opened with, so once ``N`` is
closed and reused, opening another library as ``/proc/self/fd/N`` returns the first
one, silently. Keeping every descriptor open instead would cost one per kernel for the
life of the process. A copy costs a write of a few hundred kilobytes per load, next to
a compile of seconds, and its name is unique.

>>> import tempfile
>>> from lazytensor.cache import KernelCache
>>> cache = KernelCache(tempfile.mkdtemp())
>>> binary = cache.read_or_build("ab" * 32, lambda d: (d / "kernel.so").write_bytes(b"x") and {})
>>> binary.data, binary.load(lambda path: open(path, "rb").read())
(b'x', b'x')
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from . import safedir
from .disk import Root
from .errors import CacheError

T = TypeVar("T")

_memfds: list[int] = []  # kept open for the life of the process (see _load_from_memory)


@dataclass(frozen=True)
class VerifiedBinary:
    """A binary from the cache: ``data`` is exactly what matched the recorded sha256.

    ``path`` says where the entry lives, for messages only: never load from it.
    """

    key: str
    name: str
    data: bytes = field(repr=False)
    path: Path
    root: Root = field(repr=False, compare=False)

    @property
    def sha256(self) -> str:
        """The hash the bytes were checked against."""
        return hashlib.sha256(self.data).hexdigest()

    def load(self, loader: Callable[[str], T]) -> T:
        """``loader(path)`` on a new private file holding exactly :attr:`data`.

        The file is removed when ``loader`` returns (a loaded library stays mapped).
        If the copy disappears before it is loaded (the cache was cleared or deleted
        meanwhile), it is written once more; if the cache cannot hold it at all, the
        bytes are loaded from memory instead.
        """
        for attempt in (0, 1):
            try:
                loads = self.root.subdir("loads")
            except OSError:
                return _load_from_memory(self.data, self.name, loader)
            try:
                name = f"{os.getpid()}-{secrets.token_hex(6)}-{self.name}"
                try:
                    _write_private(loads, name, self.data)
                except OSError:
                    return _load_from_memory(self.data, self.name, loader)
                try:
                    return loader(safedir.fd_path(loads, name) or
                                  os.path.join(self.root.path, "loads", name))
                except OSError:
                    if attempt or _exists(name, loads):
                        raise
                finally:
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=loads)
            finally:
                os.close(loads)
        raise AssertionError("unreachable")  # pragma: no cover


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
        return True
    except OSError:
        return False


def _write_private(dir_fd: int, name: str, data: bytes) -> None:
    fd = os.open(name, safedir.CREATE_FLAGS, 0o500, dir_fd=dir_fd)
    try:
        _write_all(fd, data)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        raise
    os.close(fd)


def _load_from_memory(data: bytes, name: str, loader: Callable[[str], T]) -> T:
    """Load from an anonymous memory file (Linux), kept open so its path stays unique."""
    if not hasattr(os, "memfd_create"):
        raise CacheError(f"cannot write a private copy of {name} to load it")
    fd = os.memfd_create(name, getattr(os, "MFD_CLOEXEC", 0))
    try:
        _write_all(fd, data)
        result = loader(f"/proc/self/fd/{fd}")
    except BaseException:
        os.close(fd)
        raise
    _memfds.append(fd)
    return result


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def remove_stale_copies(root: Root) -> None:
    """Delete ``loads/`` files whose process is gone (it died while loading)."""
    try:
        loads = safedir.open_dir("loads", root.fd)
    except OSError:
        return
    try:
        for name in os.listdir(loads):
            pid = name.split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                safedir.remove(name, loads)
    finally:
        os.close(loads)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
