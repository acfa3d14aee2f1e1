"""The root's layout, held open, and the file operations done in it.

Layout under a root (every directory 0700)::

    <root>/<key[:2]>/<key>/   one finished entry: the build's files and meta.json
    <root>/locks/<key>.lock   per-key lock (flock: the kernel drops it when its holder dies)
    <root>/tmp/<key>.*        a build in progress, moved into place with one rename
    <root>/trash/<key>.*      a corrupt entry being deleted
    <root>/loads/<pid>-*      a private copy of a verified binary while it is being loaded

Everything is reached from the root's open descriptor (:class:`Root`), one component at
a time, without following symlinks (:mod:`lazytensor.cache.safedir`). A symlink, a
file, or a directory not private to this user where a directory of the layout should be
is moved aside and replaced, never followed.

The per-key lock is in :mod:`lazytensor.cache.locking`. Names under ``tmp/`` and
``trash/`` that start with a key are only ever created while holding that key's lock,
so whoever holds the lock may delete any it finds: they were left by a process that died.

>>> import tempfile
>>> root = Root(tempfile.mkdtemp(), follow=False)
>>> entry_dir(root, "ab" * 32)[len(root.path):]
'/ab/abababababababababababababababababababababababababababababababab'
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
from collections.abc import Iterator

from . import entry, safedir
from .errors import CacheError

# Errors meaning "this directory cannot hold the cache" rather than "this build is broken".
STORAGE_ERRNOS = frozenset(
    code
    for code in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, getattr(errno, "EDQUOT", 0))
    if code
)
_PREFIX_RE = re.compile(r"[0-9a-f]{2}")


class Root:
    """A cache root held open: ``path`` names it in messages, ``fd`` is what gets used.

    The descriptor is checked (owner, mode) when opened and closed when the object goes.
    """

    def __init__(self, path: str, *, follow: bool = False, checked: bool = True):
        self.path = path
        if checked:
            self.fd = safedir.open_root_fd(path, follow)
        else:  # a directory this process has just created private (mkdtemp)
            self.fd = os.open(path, safedir.DIR_FLAGS)
        info = os.fstat(self.fd)
        self.ident = (info.st_dev, info.st_ino)

    def __repr__(self) -> str:
        return f"Root({self.path!r}, fd={self.fd})"

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            os.close(self.fd)

    @property
    def gone(self) -> bool:
        """Whether the directory was deleted since it was opened (then resolve it again)."""
        return safedir.is_gone(self.fd)

    def subdir(self, name: str) -> int:
        """Open (create, or replace when unsafe) the layout directory ``name``; caller closes."""
        return open_repaired(name, self.fd, self)


class StorageFailure(Exception):
    """A write into the root failed with disk full, read-only or permission denied.

    Internal: :class:`~cache.KernelCache` catches it and falls back, or turns it into a
    :class:`~cache.CacheError`; it never reaches callers.
    """

    def __init__(self, error: OSError, doing: str):
        super().__init__(f"{doing} failed: {error}")
        self.error = error
        self.doing = doing


@contextlib.contextmanager
def storage(root: str, doing: str) -> Iterator[None]:
    """Classify an OSError from one of the cache's own file operations.

    Only the cache's operations run in here, never ``build``, so that a build's own
    OSError reaches the caller unchanged.

    >>> with storage("/r", "writing"):
    ...     raise OSError(errno.ENOSPC, "No space left on device")
    Traceback (most recent call last):
    lazytensor.cache.disk.StorageFailure: writing failed: [Errno 28] No space left on device
    """
    try:
        yield
    except OSError as error:
        if error.errno in STORAGE_ERRNOS and not isinstance(error, safedir.UnsafeDirectory):
            raise StorageFailure(error, doing) from error
        raise CacheError(f"kernel cache {root}: {doing} failed: {error}") from error


def entry_dir(root: Root, key: str) -> str:
    """Where ``key``'s entry lives, for messages; the two-digit level keeps directories small."""
    return os.path.join(root.path, key[:2], key)


def _aside_name(name: str) -> str:
    return f"{name}.{os.getpid()}.{secrets.token_hex(4)}"


def open_repaired(name: str, dir_fd: int, root: Root) -> int:
    """Open directory ``name`` in ``dir_fd``, created if missing; an unsafe one (symlink,
    file, not private) is renamed into ``trash/`` and deleted there, then made anew."""
    try:
        return safedir.open_dir(name, dir_fd, create=True)
    except safedir.UnsafeDirectory:
        pass
    aside = f"bad-{_aside_name(name)}"
    if name == "trash":  # nowhere to put it but the root itself
        os.replace(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        safedir.remove(aside, dir_fd)
    else:
        trash = root.subdir("trash")
        try:
            os.replace(name, aside, src_dir_fd=dir_fd, dst_dir_fd=trash)
            safedir.remove(aside, trash)
        finally:
            os.close(trash)
    return safedir.open_dir(name, dir_fd, create=True)


@contextlib.contextmanager
def prefix_dir(root: Root, key: str, *, create: bool) -> Iterator[int]:
    """The open ``<root>/<key[:2]>`` directory; without ``create``, unsafe or missing raises."""
    fd = open_repaired(key[:2], root.fd, root) if create else safedir.open_dir(key[:2], root.fd)
    try:
        yield fd
    finally:
        os.close(fd)


def move_aside(root: Root, key: str, prefix_fd: int) -> bool:
    """Rename ``key``'s (corrupt) entry into ``trash/`` in one step, then delete it there.

    The rename is what readers see, so they never find a half-deleted entry. Returns
    whether there was something to move.
    """
    try:
        os.lstat(key, dir_fd=prefix_fd)
    except FileNotFoundError:
        return False
    trash = root.subdir("trash")
    try:
        aside = _aside_name(key)
        os.replace(key, aside, src_dir_fd=prefix_fd, dst_dir_fd=trash)
        safedir.remove(aside, trash)
    finally:
        os.close(trash)
    return True


def _listdir(root: Root, folder: str) -> tuple[int | None, list[str]]:
    try:
        fd = safedir.open_dir(folder, root.fd)
    except OSError:
        return None, []
    try:
        return fd, os.listdir(fd)
    except OSError:
        os.close(fd)
        return None, []


def discard_leftovers(root: Root, key: str) -> None:
    """Delete ``tmp/<key>.*`` and ``trash/<key>.*``; only while holding ``key``'s lock."""
    for folder in ("tmp", "trash"):
        fd, names = _listdir(root, folder)
        if fd is None:
            continue
        try:
            for name in names:
                if name.startswith(key + "."):  # "." is not hex, so no longer key matches
                    safedir.remove(name, fd)
        finally:
            os.close(fd)


def iter_keys(root: Root) -> Iterator[tuple[str, int]]:
    """``(key, prefix_fd)`` for every ``<prefix>/<key>`` name in ``root``, valid or not.

    Prefix directories that are symlinks or not private are skipped, as lookups refuse
    them. ``prefix_fd`` is open while the caller handles that key.
    """
    try:
        prefixes = sorted(os.listdir(root.fd))
    except OSError:
        return
    for prefix in prefixes:
        if _PREFIX_RE.fullmatch(prefix) is None:
            continue
        try:
            fd = safedir.open_dir(prefix, root.fd)
        except OSError:
            continue
        try:
            for name in sorted(os.listdir(fd)):
                if entry.is_key(name) and name[:2] == prefix:
                    yield name, fd
        except OSError:
            continue
        finally:
            os.close(fd)


def unsafe_prefixes(root: Root) -> list[str]:
    """Names of two-hex-digit entries in the root that are not safe directories."""
    bad = []
    with contextlib.suppress(OSError):
        for prefix in os.listdir(root.fd):
            if _PREFIX_RE.fullmatch(prefix) is None:
                continue
            try:
                os.close(safedir.open_dir(prefix, root.fd))
            except safedir.UnsafeDirectory:
                bad.append(prefix)
            except OSError:
                continue
    return bad


def leftover_keys(root: Root) -> set[str]:
    """Keys named by anything in ``tmp/`` or ``trash/``."""
    keys = set()
    for folder in ("tmp", "trash"):
        fd, names = _listdir(root, folder)
        if fd is not None:
            os.close(fd)
            keys.update(name.split(".")[0] for name in names)
    return {key for key in keys if entry.is_key(key)}


