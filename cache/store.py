"""The kernel cache: verified entries, each built once under a per-key lock.

Readers take no lock: an entry appears in one ``os.replace`` and is re-verified on every
load, so a reader sees either nothing or a complete entry. Writers of a key serialise
on a ``threading.Lock`` (threads of this process) and then a ``FileLock`` (processes),
so a new kernel is compiled once however many processes ask for it at the same time.
The on-disk layout and the locking are in :mod:`lazytensor.cache.disk`.

>>> import tempfile
>>> cache = KernelCache(tempfile.mkdtemp())
>>> def build(tmp):
...     (tmp / "kernel.so").write_bytes(b"binary")
...     return {"compiler": "g++"}
>>> path = cache.get_or_build("ab" * 32, build)
>>> cache.lookup("ab" * 32) == path, cache.read_meta("ab" * 32)["extra"]
(True, {'compiler': 'g++'})
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import disk, entry, location
from .errors import CacheError

DEFAULT_LOCK_TIMEOUT = 600.0  # seconds; a compile takes seconds, a hung peer forever

# Process-wide; replaced in a forked child (see _reset_in_child).
_state_lock = threading.Lock()  # resolution and fallback of every instance's root
_default: tuple[str | None, KernelCache] | None = None


def _summarize(extra: dict[str, Any], width: int = 80) -> dict[str, Any]:
    """``extra`` with every value whose JSON is longer than ``width`` cut to a string."""
    summary = {}
    for name, value in extra.items():
        text = json.dumps(value)
        summary[name] = value if len(text) <= width else text[: width - 3] + "..."
    return summary


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
        self._root: str | None = None
        self._fallback = False

    def __repr__(self) -> str:
        where = self._root or self._asked or f"${location.ENV_VAR} or the user cache dir"
        return f"KernelCache({where!r}{', fallback' if self._fallback else ''})"

    # ----------------------------------------------------------------- where
    @property
    def root(self) -> Path:
        """The directory in use: the requested root, or this process's private fallback.

        >>> import tempfile
        >>> KernelCache(tempfile.mkdtemp() + "/sub").root.stat().st_mode & 0o777 == 0o700
        True
        """
        return Path(self._active_root())

    @property
    def is_fallback(self) -> bool:
        """Whether the requested root was refused and a private temporary one is used."""
        self._active_root()
        return self._fallback

    def _active_root(self) -> str:
        root = self._root
        if root is not None:
            return root
        with _state_lock:
            if self._root is None:
                requested = location.requested_root(self._asked)
                reason = location.unusable_reason(requested)
                self._requested = requested
                if reason is None:
                    self._root = str(requested)
                else:
                    self._root = str(location.fallback_root(requested, reason))
                    self._fallback = True
            return self._root

    def _fall_back(self, root: str, failure: disk.StorageFailure) -> None:
        """Switch to the private fallback after a write into ``root`` failed."""
        with _state_lock:
            if self._root != root:
                return  # another thread already switched; the caller retries there
            if self._fallback or self._requested is None:
                raise CacheError(
                    f"kernel cache {root}: {failure.doing} failed: {failure.error}"
                ) from failure.error
            reason = f"{failure.doing} there failed ({failure.error})"
            self._root = str(location.fallback_root(self._requested, reason))
            self._fallback = True

    # ----------------------------------------------------------------- reads
    def lookup(self, key: str, binary: str = "kernel.so") -> Path | None:
        """The verified path of ``binary`` in the entry for ``key``, or ``None``. No lock.

        >>> import tempfile
        >>> KernelCache(tempfile.mkdtemp()).lookup("ab" * 32, "kernel.so") is None
        True
        """
        key = entry.check_key(key)
        binary = entry.check_file_name(binary)
        return self._lookup_in(self._active_root(), key, binary)

    def _lookup_in(self, root: str, key: str, binary: str) -> Path | None:
        entry_dir = disk.entry_dir(root, key)
        meta = entry.read_meta_file(entry_dir, key)
        if meta is None:
            return None
        record = meta["files"].get(binary)
        if record is None or not entry.verify_file(entry_dir, binary, record):
            return None
        return Path(entry_dir, binary)

    def read_meta(self, key: str) -> dict[str, Any] | None:
        """The checked ``meta.json`` of ``key``'s entry, or ``None``. Files are not re-hashed.

        >>> import tempfile
        >>> KernelCache(tempfile.mkdtemp()).read_meta("ab" * 32) is None
        True
        """
        key = entry.check_key(key)
        return entry.read_meta_file(disk.entry_dir(self._active_root(), key), key)

    # ----------------------------------------------------------------- writes
    def get_or_build(
        self,
        key: str,
        build: Callable[[Path], dict[str, Any] | None],
        binary: str = "kernel.so",
    ) -> Path:
        """The verified path of ``binary`` for ``key``, calling ``build(tmpdir)`` on a miss.

        ``build`` writes its files into the fresh directory it is given and returns a
        JSON-serialisable dict of extra metadata. It runs at most once across all
        threads and processes sharing the root; its exceptions propagate unchanged.
        If the root turns out to be full or read-only, the build is redone in a private
        fallback cache (with one :class:`~cache.CacheWarning`).

        >>> import tempfile
        >>> cache = KernelCache(tempfile.mkdtemp())
        >>> p = cache.get_or_build("cd" * 32, lambda d: (d / "k.so").write_bytes(b"x") and {}, "k.so")
        >>> p.name, p.read_bytes()
        ('k.so', b'x')
        """
        key = entry.check_key(key)
        binary = entry.check_file_name(binary)
        if not callable(build):
            raise TypeError(f"build must be callable, got {type(build).__name__}")
        while True:
            root = self._active_root()
            try:
                return self._get_or_build_in(root, key, build, binary)
            except disk.StorageFailure as failure:
                self._fall_back(root, failure)  # raises when already on the fallback

    def _get_or_build_in(
        self, root: str, key: str, build: Callable[[Path], Any], binary: str
    ) -> Path:
        found = self._lookup_in(root, key, binary)
        if found is not None:
            return found
        with disk.key_lock(root, key, self.lock_timeout):
            # Whoever held the lock before us has probably just built it.
            found = self._lookup_in(root, key, binary)
            if found is not None:
                return found
            disk.discard_leftovers(root, key)
            return self._build_entry(root, key, build, binary)

    def _build_entry(self, root: str, key: str, build: Callable[[Path], Any], binary: str) -> Path:
        tmp_parent = os.path.join(root, "tmp")
        with disk.storage(root, "creating a build directory"):
            os.makedirs(tmp_parent, mode=0o700, exist_ok=True)
            build_dir = tempfile.mkdtemp(prefix=key + ".", dir=tmp_parent)
        try:
            extra = build(Path(build_dir))
            with disk.storage(root, "reading the files build() wrote"):
                files = entry.scan_build_dir(build_dir)
            if binary not in files:
                raise CacheError(f"build() wrote {sorted(files)} but not {binary!r}")
            meta = entry.encode_meta(key, binary, files, extra)
            with disk.storage(root, "writing meta.json"):
                entry.write_meta(build_dir, meta)
            final = disk.entry_dir(root, key)
            with disk.storage(root, "moving the entry into place"):
                os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
                disk.move_aside(root, key, final)
                os.replace(build_dir, final)
            return Path(final, binary)
        finally:
            # Also on KeyboardInterrupt; once the entry is in place there is nothing here.
            shutil.rmtree(build_dir, ignore_errors=True)

    # ----------------------------------------------------------------- admin
    def info(self) -> dict[str, Any]:
        """Root, entry count, total bytes and one summary per entry (``valid``: hashes match).

        >>> import tempfile
        >>> KernelCache(tempfile.mkdtemp()).info()["num_entries"]
        0
        """
        root = self._active_root()
        entries = []
        for key, entry_dir in disk.iter_entries(root):
            meta = entry.read_meta_file(entry_dir, key)
            binary = None if meta is None else meta["binary"]
            valid = meta is not None and entry.verify_file(entry_dir, binary, meta["files"][binary])
            with contextlib.suppress(OSError):
                entries.append(
                    {
                        "key": key,
                        "size": disk.tree_size(entry_dir),
                        "created": None if meta is None else meta["created"],
                        "binary": binary,
                        "valid": valid,
                        "extra": {} if meta is None else _summarize(meta["extra"]),
                    }
                )
        return {
            "root": root,
            "fallback": self._fallback,
            "num_entries": len(entries),
            "total_bytes": sum(item["size"] for item in entries),
            "entries": entries,
        }

    def clear(self) -> int:
        """Remove every entry, each under its key's lock; return how many were removed.

        >>> import tempfile
        >>> KernelCache(tempfile.mkdtemp()).clear()
        0
        """
        root = self._active_root()
        keys = {key for key, _ in disk.iter_entries(root)} | disk.leftover_keys(root)
        removed = 0
        for key in sorted(keys):
            try:
                with disk.key_lock(root, key, self.lock_timeout):
                    path = disk.entry_dir(root, key)
                    if os.path.lexists(path):
                        with disk.storage(root, "removing an entry"):
                            disk.move_aside(root, key, path)
                        removed += 1
                    disk.discard_leftovers(root, key)
            except disk.StorageFailure as failure:
                raise CacheError(f"kernel cache {root}: {failure}") from failure.error
        return removed


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
