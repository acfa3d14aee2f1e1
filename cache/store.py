"""The kernel cache: verified entries, each built once under a per-key lock.

Readers take no lock: an entry appears in one ``os.replace`` and is re-verified on every
load, so a reader sees either nothing or a complete entry. Writers of a key serialise
on a ``threading.Lock`` (threads of this process) and then an ``flock`` (processes),
so a new kernel is compiled once however many processes ask for it at the same time.
The root is held open and everything below it is reached through that descriptor
without following symlinks; the on-disk layout and the locking are in
:mod:`lazytensor.cache.disk`.

Load what :meth:`KernelCache.read_or_build` returns (the bytes that were verified);
the paths returned by :meth:`KernelCache.get_or_build` and :meth:`KernelCache.lookup`
name the entry for people and tools, and may point at other bytes by the time they
are opened.

>>> import tempfile
>>> cache = KernelCache(tempfile.mkdtemp())
>>> def build(tmp):
...     (tmp / "kernel.so").write_bytes(b"binary")
...     return {"compiler": "g++"}
>>> path = cache.get_or_build("ab" * 32, build)
>>> cache.lookup("ab" * 32) == path, cache.read_meta("ab" * 32)["extra"]
(True, {'compiler': 'g++'})
>>> cache.read("ab" * 32).data
b'binary'
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import disk, entry, loading, location, locking, publish, safedir
from .disk import Root
from .errors import CacheError
from .loading import VerifiedBinary

DEFAULT_LOCK_TIMEOUT = 600.0  # seconds; a compile takes seconds, a hung peer forever
_INSTANCE = object()  # "the instance's lock_timeout"

# Process-wide; replaced in a forked child (see _reset_in_child).
_state_lock = threading.Lock()  # resolution and fallback of every instance's root
_default: tuple[str | None, KernelCache] | None = None


class KernelCache:
    """A directory of compiled kernels, keyed by a hex digest, safe across processes.

    ``root`` defaults to ``$LAZYTENSOR_CACHE_DIR``, else the user cache directory; it is
    resolved (and created, private) on first use. ``lock_timeout`` bounds the wait for
    another process's build of the same key (``None``: wait forever).

    >>> import tempfile
    >>> KernelCache(tempfile.mkdtemp()).lookup("0" * 64) is None
    True
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
    ):
        if lock_timeout is not None and not lock_timeout >= 0:
            raise ValueError(f"lock_timeout must be None or >= 0, got {lock_timeout!r}")
        self._asked = None if root is None else os.fspath(root)
        self.lock_timeout = lock_timeout
        self._requested: Path | None = None
        self._root: Root | None = None
        self._fallback = False

    def __repr__(self) -> str:
        where = (self._root and self._root.path) or self._asked or f"${location.ENV_VAR} or the user cache dir"
        return f"KernelCache({where!r}{', fallback' if self._fallback else ''})"

    # ----------------------------------------------------------------- where
    @property
    def root(self) -> Path:
        """The directory in use: the requested root, or this process's private fallback.

        >>> import tempfile
        >>> KernelCache(tempfile.mkdtemp() + "/sub").root.stat().st_mode & 0o777 == 0o700
        True
        """
        return Path(self._active_root().path)

    @property
    def is_fallback(self) -> bool:
        """Whether the requested root was refused and a private temporary one is used."""
        self._active_root()
        return self._fallback

    def _active_root(self) -> Root:
        root = self._root
        if root is not None and not root.gone:
            return root
        with _state_lock:
            if self._root is not None and self._root.gone:
                self._root = None  # deleted under us: resolve and check the name again
                self._fallback = False
            if self._root is None:
                requested = location.requested_root(self._asked)
                handle, reason = location.open_root(requested)
                self._requested = requested
                if handle is not None:
                    self._root = handle
                else:
                    self._root = _fallback_handle(requested, reason)
                    self._fallback = True
            return self._root

    def _fall_back(self, root: Root, failure: disk.StorageFailure) -> None:
        """Switch to the private fallback after a write into ``root`` failed."""
        with _state_lock:
            if self._root is not root:
                return  # another thread already switched; the caller retries there
            if self._fallback or self._requested is None:
                raise CacheError(
                    f"kernel cache {root.path}: {failure.doing} failed: {failure.error}"
                ) from failure.error
            reason = f"{failure.doing} there failed ({failure.error})"
            self._root = _fallback_handle(self._requested, reason)
            self._fallback = True

    # ----------------------------------------------------------------- reads
    def lookup(self, key: str, binary: str = "kernel.so") -> Path | None:
        """The path of ``binary`` in ``key``'s entry if it verifies, else ``None``. No lock.

        For messages and tools: load what :meth:`read` returns, not this path.

        >>> import tempfile
        >>> KernelCache(tempfile.mkdtemp()).lookup("ab" * 32, "kernel.so") is None
        True
        """
        found = self.read(key, binary)
        return None if found is None else found.path

    def read(self, key: str, binary: str = "kernel.so") -> VerifiedBinary | None:
        """``binary`` of ``key``'s entry, read and verified through one descriptor. No lock.

        >>> import tempfile
        >>> KernelCache(tempfile.mkdtemp()).read("ab" * 32) is None
        True
        """
        key = entry.check_key(key)
        binary = entry.check_file_name(binary)
        return publish.read_entry(self._active_root(), key, binary)

    def read_meta(self, key: str) -> dict[str, Any] | None:
        """The checked ``meta.json`` of ``key``'s entry, or ``None``. Files are not re-hashed.

        >>> import tempfile
        >>> KernelCache(tempfile.mkdtemp()).read_meta("ab" * 32) is None
        True
        """
        key = entry.check_key(key)
        try:
            with publish.entry_fd(self._active_root(), key) as entry_fd:
                return entry.read_meta_file(entry_fd, key)
        except OSError:
            return None

    # ----------------------------------------------------------------- writes
    def get_or_build(
        self,
        key: str,
        build: Callable[[Path], dict[str, Any] | None],
        binary: str = "kernel.so",
        *,
        lock_timeout: Any = _INSTANCE,
    ) -> Path:
        """The path of ``binary`` for ``key``, calling ``build(tmpdir)`` on a miss.

        As :meth:`read_or_build`, but returns the entry's path (for messages and tools).

        >>> import tempfile
        >>> cache = KernelCache(tempfile.mkdtemp())
        >>> p = cache.get_or_build("cd" * 32, lambda d: (d / "k.so").write_bytes(b"x") and {}, "k.so")
        >>> p.name, p.read_bytes()
        ('k.so', b'x')
        """
        return self.read_or_build(key, build, binary, lock_timeout=lock_timeout).path

    def read_or_build(
        self,
        key: str,
        build: Callable[[Path], dict[str, Any] | None],
        binary: str = "kernel.so",
        *,
        lock_timeout: Any = _INSTANCE,
    ) -> VerifiedBinary:
        """The verified ``binary`` for ``key``, calling ``build(tmpdir)`` on a miss.

        ``build`` writes its files into the fresh directory it is given and returns a
        JSON-serialisable dict of extra metadata. It runs at most once across all
        threads and processes sharing the root; its exceptions propagate unchanged, and
        processes that were waiting for it raise :class:`~cache.CacheError` with its
        message instead of building again. ``lock_timeout`` (default: the instance's)
        bounds the wait for another process's build of the same key: set it from the
        longest a build may take. If the root turns out to be full or read-only, the
        build is redone in a private fallback cache (with one :class:`~cache.CacheWarning`).

        >>> import tempfile
        >>> cache = KernelCache(tempfile.mkdtemp())
        >>> cache.read_or_build("cd" * 32, lambda d: (d / "kernel.so").write_bytes(b"x") and {}).data
        b'x'
        """
        key = entry.check_key(key)
        binary = entry.check_file_name(binary)
        if not callable(build):
            raise TypeError(f"build must be callable, got {type(build).__name__}")
        if lock_timeout is _INSTANCE:
            lock_timeout = self.lock_timeout
        elif lock_timeout is not None and not lock_timeout >= 0:
            raise ValueError(f"lock_timeout must be None or >= 0, got {lock_timeout!r}")
        while True:
            root = self._active_root()
            try:
                return self._read_or_build_in(root, key, build, binary, lock_timeout)
            except disk.StorageFailure as failure:
                if root.gone:
                    continue  # the root was deleted meanwhile: resolve it again
                self._fall_back(root, failure)  # raises when already on the fallback

    def _read_or_build_in(
        self, root: Root, key: str, build: Callable[[Path], Any], binary: str,
        lock_timeout: float | None,
    ) -> VerifiedBinary:
        found = publish.read_entry(root, key, binary)
        if found is not None:
            return found
        since = time.time()
        with locking.key_lock(root, key, lock_timeout) as lock:
            # Whoever held the lock before us has probably just built it.
            found = publish.read_entry(root, key, binary)
            if found is not None:
                return found
            failure = lock.failure_since(since)
            if failure is not None:
                raise CacheError(
                    f"kernel cache {root.path}: key {key} was being built by another process "
                    f"while this one waited, and {failure}"
                )
            disk.discard_leftovers(root, key)
            return publish.build_entry(root, key, build, binary, lock)

    # ----------------------------------------------------------------- admin
    def info(self) -> dict[str, Any]:
        """Root, entry count, total bytes and one summary per entry (``valid``: hashes match).

        >>> import tempfile
        >>> KernelCache(tempfile.mkdtemp()).info()["num_entries"]
        0
        """
        root = self._active_root()
        entries = []
        for key, prefix_fd in disk.iter_keys(root):
            with contextlib.suppress(OSError):
                entries.append(publish.entry_summary(root, key, prefix_fd))
        return {
            "root": root.path,
            "fallback": self._fallback,
            "num_entries": len(entries),
            "total_bytes": sum(item["size"] for item in entries),
            "entries": entries,
        }

    def clear(self) -> int:
        """Remove every entry, each under its key's lock; return how many were removed.

        Symlinks or foreign directories where entry directories belong are removed too
        (not followed), as are private copies left by processes that died while loading.

        >>> import tempfile
        >>> KernelCache(tempfile.mkdtemp()).clear()
        0
        """
        root = self._active_root()
        keys = {key for key, _ in disk.iter_keys(root)} | disk.leftover_keys(root)
        removed = 0
        try:
            for key in sorted(keys):
                with locking.key_lock(root, key, self.lock_timeout):
                    with disk.storage(root.path, "removing an entry"):
                        with contextlib.suppress(FileNotFoundError, safedir.UnsafeDirectory):
                            with disk.prefix_dir(root, key, create=False) as prefix_fd:
                                removed += disk.move_aside(root, key, prefix_fd)
                    disk.discard_leftovers(root, key)
            for prefix in disk.unsafe_prefixes(root):
                with disk.storage(root.path, "removing an unsafe directory"):
                    os.close(disk.open_repaired(prefix, root.fd, root))
        except disk.StorageFailure as failure:
            raise CacheError(f"kernel cache {root.path}: {failure}") from failure.error
        loading.remove_stale_copies(root)
        return removed


def _fallback_handle(requested: Path, reason: str) -> Root:
    fallback = location.fallback_root(requested, reason)
    try:
        return Root(str(fallback), checked=False)
    except OSError as error:
        raise CacheError(f"kernel cache fallback {fallback} cannot be opened: {error}") from error


def default_cache() -> KernelCache:
    """The process-wide cache, re-created when ``$LAZYTENSOR_CACHE_DIR`` changes.

    >>> default_cache() is default_cache()
    True
    """
    global _default
    wanted = os.environ.get(location.ENV_VAR) or None
    with _state_lock:
        if _default is None or _default[0] != wanted:
            _default = (wanted, KernelCache(wanted))
        return _default[1]


def _reset_in_child() -> None:
    # A lock that another thread held at fork time would stay locked in the child.
    global _state_lock
    _state_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
