"""The per-key lock: a thread lock, then an ``flock`` on ``locks/<key>.lock``.

The lock file is opened through the root's descriptor and never through a symlink; the
kernel drops an flock when its holder dies, so a lock file left by a killed process
blocks nobody. The file also carries a note between holders (:class:`KeyLock`).

>>> import tempfile
>>> from lazytensor.cache.disk import Root
>>> root = Root(tempfile.mkdtemp())
>>> with key_lock(root, "ab" * 32, timeout=5.0) as lock:
...     lock.failure_since(0.0) is None
True
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from . import safedir
from .disk import Root, storage
from .errors import CacheError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None

_POLL = 0.05  # seconds between tries of a lock held by another process

# Per process; replaced in a forked child (see _reset_in_child).
_table_lock = threading.Lock()  # guards _thread_locks
_thread_locks: dict[tuple[object, str], threading.Lock] = {}
_local = threading.local()  # .held: the (root, key) locks this thread holds
_held_fds: set[int] = set()  # the descriptors of the flocks held by this process's threads


def _held() -> set[tuple[object, str]]:
    held = getattr(_local, "held", None)
    if held is None:
        held = _local.held = set()
    return held


class KeyLock:
    """The held lock of one key, and the note its lock file carries between holders.

    The lock file holds a small JSON object: the holder's pid (for the message of
    whoever gives up waiting) and, after a failed build, that failure, so that the
    processes which were waiting for the build report it instead of trying again.
    """

    def __init__(self, fd: int):
        self.fd = fd
        self.previous = _read_note(fd)

    def _write(self, note: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            data = json.dumps(note).encode()
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, data, 0)

    def claim(self) -> None:
        """Write our pid, keeping a failure recorded by an earlier holder."""
        note = {"pid": os.getpid()}
        if isinstance(self.previous.get("failure"), dict):
            note["failure"] = self.previous["failure"]
        self._write(note)

    def record_failure(self, error: BaseException) -> None:
        """Say why this holder's build failed, for the processes waiting on the key."""
        failure = {"pid": os.getpid(), "time": time.time(),
                   "error": f"{type(error).__name__}: {error}"[:4000]}
        self._write({"pid": os.getpid(), "failure": failure})

    def clear_failure(self) -> None:
        self._write({"pid": os.getpid()})

    def failure_since(self, since: float) -> str | None:
        """The failure recorded by an earlier holder after ``since``, else ``None``."""
        failure = self.previous.get("failure")
        if not isinstance(failure, dict) or not isinstance(failure.get("time"), (int, float)):
            return None
        if failure["time"] <= since:
            return None
        return f"process {failure.get('pid')} failed to build it: {failure.get('error')}"


def _read_note(fd: int) -> dict[str, Any]:
    try:
        note = json.loads(os.pread(fd, 1 << 16, 0).decode())
    except (OSError, ValueError):
        return {}
    return note if isinstance(note, dict) else {}


def _holder(fd: int) -> str:
    pid = _read_note(fd).get("pid")
    return f" (pid {pid})" if isinstance(pid, int) else ""


def _flock(fd: int, deadline: float | None) -> bool:
    """Take an exclusive flock on ``fd``, polling until ``deadline``; whether it was taken."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return False
        time.sleep(_POLL if deadline is None else min(_POLL, deadline - now))


def _open_lock_file(name: str, locks: int) -> int:
    """Open (create) a lock file; a symlink or other non-file there is removed, not followed."""
    flags = os.O_RDWR | os.O_CREAT | safedir.NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(name, flags, 0o600, dir_fd=locks)
    except OSError as error:
        if error.errno not in safedir.NOT_A_DIRECTORY | {errno.EISDIR}:
            raise
    safedir.remove(name, locks)
    return os.open(name, flags, 0o600, dir_fd=locks)


@contextlib.contextmanager
def key_lock(root: Root, key: str, timeout: float | None) -> Iterator[KeyLock]:
    """Hold ``key``'s lock in ``root`` against other threads and other processes.

    Threads queue on a ``threading.Lock`` first; then an ``flock`` on ``locks/<key>.lock``
    (opened through the root's descriptor, never through a symlink) excludes other
    processes, and the kernel releases it when a holder dies, so a lock file left behind
    by a killed process blocks nobody (see :class:`KeyLock` for what the file says).
    ``timeout`` (seconds, ``None`` for ever) bounds
    the whole wait; past it :class:`~cache.CacheError` is raised.
    """
    held = _held()
    if (root.ident, key) in held:
        raise CacheError(f"build() for key {key} asked for the same key: it would wait on itself")
    deadline = None if timeout is None else time.monotonic() + timeout
    with _table_lock:
        thread_lock = _thread_locks.setdefault((root.ident, key), threading.Lock())
    if not thread_lock.acquire(timeout=-1 if timeout is None else timeout):
        raise CacheError(f"kernel cache {root.path}: key {key} stayed locked for {timeout} s")
    try:
        with storage(root.path, "creating the lock file"):
            locks = root.subdir("locks")
            try:
                fd = _open_lock_file(key + ".lock", locks)
            finally:
                os.close(locks)
        try:
            if not _flock(fd, deadline):
                raise CacheError(
                    f"kernel cache {root.path}: another process{_holder(fd)} held the lock "
                    f"locks/{key}.lock for {timeout} s, longer than a build may take: it is "
                    "probably hung or stopped"
                )
            lock = KeyLock(fd)
            lock.claim()
            held.add((root.ident, key))
            _held_fds.add(fd)
            try:
                yield lock
            finally:
                held.discard((root.ident, key))
                _held_fds.discard(fd)
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    finally:
        thread_lock.release()


def _reset_in_child() -> None:
    # A lock that another thread held at fork time would stay locked in the child.
    global _table_lock, _thread_locks, _local, _held_fds
    _table_lock = threading.Lock()
    _thread_locks = {}
    _local = threading.local()
    # The child shares the flocks the parent's threads held (same open files): closed
    # here (not unlocked, which would release them for the parent), so that a parent that
    # dies during its build releases the key instead of leaving it to this child.
    for fd in _held_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    _held_fds = set()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
