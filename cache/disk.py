"""The root's layout, the per-key lock, and the file operations done under it.

Layout under a root (every directory 0700)::

    <root>/<key[:2]>/<key>/   one finished entry: the build's files and meta.json
    <root>/locks/<key>.lock   per-key file lock (flock: the kernel drops it when its holder dies)
    <root>/tmp/<key>.*        a build in progress, moved into place with one rename
    <root>/trash/<key>.*      a corrupt entry being deleted

Names under ``tmp/`` and ``trash/`` that start with a key are only ever created while
holding that key's lock, so whoever holds the lock may delete any it finds: they were
left by a process that died.

>>> import tempfile
>>> root = tempfile.mkdtemp()
>>> with key_lock(root, "ab" * 32, timeout=5.0):
...     entry_dir(root, "ab" * 32)[len(root):]
'/ab/abababababababababababababababababababababababababababababababab'
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Iterator

from . import entry
from .errors import CacheError

# Errors meaning "this directory cannot hold the cache" rather than "this build is broken".
STORAGE_ERRNOS = frozenset(
    code
    for code in (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, getattr(errno, "EDQUOT", 0))
    if code
)
_PREFIX_RE = re.compile(r"[0-9a-f]{2}")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

# Per process; replaced in a forked child (see _reset_in_child).
_table_lock = threading.Lock()  # guards _thread_locks
_thread_locks: dict[tuple[str, str], threading.Lock] = {}
_local = threading.local()  # .held: the (root, key) locks this thread holds


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
        if error.errno in STORAGE_ERRNOS:
            raise StorageFailure(error, doing) from error
        raise CacheError(f"kernel cache {root}: {doing} failed: {error}") from error


def entry_dir(root: str, key: str) -> str:
    """Where ``key``'s entry lives; the two-digit level keeps directories small."""
    return os.path.join(root, key[:2], key)


def remove(path: str) -> None:
    """Delete a file or a directory tree, best effort: a leftover is retried later."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def tree_size(path: str) -> int:
    """Bytes in the files under ``path`` (or of ``path`` itself if it is not a directory)."""
    if not os.path.isdir(path) or os.path.islink(path):
        return os.lstat(path).st_size
    total = 0
    for parent, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(parent, name)).st_size
    return total


def move_aside(root: str, key: str, path: str) -> None:
    """Rename a (corrupt) entry into ``trash/`` in one step, then delete it there.

    The rename is what readers see, so they never find a half-deleted entry.
    """
    if not os.path.lexists(path):
        return
    trash = os.path.join(root, "trash")
    os.makedirs(trash, mode=0o700, exist_ok=True)
    aside = os.path.join(trash, f"{key}.{os.getpid()}.{secrets.token_hex(4)}")
    os.replace(path, aside)
    remove(aside)


def discard_leftovers(root: str, key: str) -> None:
    """Delete ``tmp/<key>.*`` and ``trash/<key>.*``; only while holding ``key``'s lock."""
    for folder in (os.path.join(root, "tmp"), os.path.join(root, "trash")):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if name.startswith(key + "."):  # "." is not hex, so no longer key matches
                remove(os.path.join(folder, name))


def iter_entries(root: str) -> Iterator[tuple[str, str]]:
    """``(key, path)`` for every ``<prefix>/<key>`` in ``root``, whether valid or not."""
    try:
        prefixes = sorted(os.listdir(root))
    except OSError:
        return
    for prefix in prefixes:
        folder = os.path.join(root, prefix)
        if _PREFIX_RE.fullmatch(prefix) is None or os.path.islink(folder):
            continue
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            if entry.is_key(name) and name[:2] == prefix:
                yield name, os.path.join(folder, name)


def leftover_keys(root: str) -> set[str]:
    """Keys named by anything in ``tmp/`` or ``trash/``."""
    keys = set()
    for folder in ("tmp", "trash"):
        with contextlib.suppress(OSError):
            keys.update(name.split(".")[0] for name in os.listdir(os.path.join(root, folder)))
    return {key for key in keys if entry.is_key(key)}


def _held() -> set[tuple[str, str]]:
    held = getattr(_local, "held", None)
    if held is None:
        held = _local.held = set()
    return held


@contextlib.contextmanager
def key_lock(root: str, key: str, timeout: float | None) -> Iterator[None]:
    """Hold ``key``'s lock in ``root`` against other threads and other processes.

    Threads queue on a ``threading.Lock`` first: a file lock alone is not a reliable
    way to exclude threads of one process (depending on the filelock version, an
    instance is re-entrant across threads). Then a ``FileLock`` excludes other
    processes; it is an flock, so the kernel releases it when a holder dies, and a lock
    file left behind by a killed process blocks nobody. ``timeout`` (seconds, ``None``
    for ever) bounds the whole wait; past it :class:`~cache.CacheError` is raised.
    """
    held = _held()
    if (root, key) in held:
        raise CacheError(f"build() for key {key} asked for the same key: it would wait on itself")
    deadline = None if timeout is None else time.monotonic() + timeout
    with _table_lock:
        thread_lock = _thread_locks.setdefault((root, key), threading.Lock())
    if not thread_lock.acquire(timeout=-1 if timeout is None else timeout):
        raise CacheError(f"kernel cache {root}: key {key} stayed locked for {timeout} s")
    try:
        lock_path = os.path.join(root, "locks", key + ".lock")
        with storage(root, "creating the lock file"):
            os.makedirs(os.path.dirname(lock_path), mode=0o700, exist_ok=True)
            # Created here, private, so that a failure is classified by `storage`.
            os.close(os.open(lock_path, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600))
        remaining = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        # imported here: a process that only reads the cache never pays for filelock
        from filelock import FileLock, Timeout

        file_lock = FileLock(lock_path, timeout=remaining)
        with storage(root, "taking the lock file"):
            try:
                file_lock.acquire()
            except Timeout as error:  # a TimeoutError, hence an OSError: handle it here
                raise CacheError(
                    f"kernel cache {root}: another process held {lock_path} for {timeout} s"
                ) from error
        held.add((root, key))
        try:
            yield
        finally:
            held.discard((root, key))
            file_lock.release()
    finally:
        thread_lock.release()


def _reset_in_child() -> None:
    # A lock that another thread held at fork time would stay locked in the child.
    global _table_lock, _thread_locks, _local
    _table_lock = threading.Lock()
    _thread_locks = {}
    _local = threading.local()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
