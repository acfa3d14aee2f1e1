"""Reading, summarising and building one entry under a held root.

A reader opens ``<prefix>/<key>`` through the root's descriptor, refusing symlinks,
reads ``meta.json`` and the binary through descriptors and returns the bytes it hashed.
A builder (holding the key's lock) runs ``build`` in a new private directory under
``tmp/``, records every file's hash, reads the binary back (the bytes handed out are
those, read before the entry becomes visible) and moves the directory into place.

>>> import tempfile
>>> from lazytensor.cache.disk import Root
>>> root = Root(tempfile.mkdtemp())
>>> read_entry(root, "ab" * 32, "kernel.so") is None
True
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import disk, entry, safedir
from .disk import Root
from .errors import CacheError
from .loading import VerifiedBinary
from .locking import KeyLock


def _summarize(extra: dict[str, Any], width: int = 80) -> dict[str, Any]:
    """``extra`` with every value whose JSON is longer than ``width`` cut to a string."""
    summary = {}
    for name, value in extra.items():
        text = json.dumps(value)
        summary[name] = value if len(text) <= width else text[: width - 3] + "..."
    return summary


@contextlib.contextmanager
def entry_fd(root: Root, key: str) -> Iterator[int]:
    """The open entry directory of ``key``; OSError when missing, a symlink or unsafe."""
    with safedir.opened_dir(key[:2], root.fd) as prefix_fd:
        with safedir.opened_dir(key, prefix_fd) as entry_fd:
            yield entry_fd


def read_entry(root: Root, key: str, binary: str) -> VerifiedBinary | None:
    """``binary`` of ``key``'s entry, read and hashed through one descriptor, or ``None``."""
    try:
        with entry_fd(root, key) as fd:
            meta = entry.read_meta_file(fd, key)
            record = None if meta is None else meta["files"].get(binary)
            data = None if record is None else entry.read_verified(fd, binary, record)
    except OSError:
        return None
    if data is None:
        return None
    return VerifiedBinary(key, binary, data, Path(disk.entry_dir(root, key), binary), root)


def entry_summary(root: Root, key: str, prefix_fd: int) -> dict[str, Any]:
    """One line of :meth:`KernelCache.info`; an entry that is not a directory is invalid."""
    meta = binary = None
    valid = False
    with contextlib.suppress(OSError):  # a symlink or a file: listed, invalid
        with safedir.opened_dir(key, prefix_fd) as entry_fd:
            meta = entry.read_meta_file(entry_fd, key)
            binary = None if meta is None else meta["binary"]
            valid = meta is not None and entry.verify_file(entry_fd, binary, meta["files"][binary])
    return {
        "key": key,
        "size": safedir.tree_size(key, prefix_fd),
        "created": None if meta is None else meta["created"],
        "binary": binary,
        "valid": valid,
        "extra": {} if meta is None else _summarize(meta["extra"]),
    }


def build_entry(root: Root, key: str, build: Callable[[Path], Any], binary: str,
                lock: KeyLock) -> VerifiedBinary:
    """Run ``build`` in a new private directory under ``tmp/`` and move the result into
    place in one rename; only while holding ``key``'s ``lock``."""
    with disk.storage(root.path, "creating a build directory"):
        tmp_fd = root.subdir("tmp")
    try:
        with disk.storage(root.path, "creating a build directory"):
            name = f"{key}.{secrets.token_hex(6)}"
            os.mkdir(name, 0o700, dir_fd=tmp_fd)
        try:
            with disk.storage(root.path, "opening the build directory"):
                build_fd = safedir.open_dir(name, tmp_fd)
            try:
                return _fill_and_publish(root, key, build, binary, tmp_fd, name, build_fd, lock)
            finally:
                os.close(build_fd)
        finally:
            # Also on KeyboardInterrupt; once the entry is in place there is nothing here.
            safedir.remove(name, tmp_fd)
    finally:
        os.close(tmp_fd)


def _fill_and_publish(root: Root, key: str, build: Callable[[Path], Any], binary: str,
                      tmp_fd: int, name: str, build_fd: int, lock: KeyLock) -> VerifiedBinary:
    try:
        # The directory's real path now: a name re-pointed since the root was checked
        # (a swapped symlink or parent) is not on it.
        extra = build(Path(safedir.current_path(build_fd, os.path.join(root.path, "tmp", name))))
    except Exception as error:
        lock.record_failure(error)  # for the processes waiting on this key
        raise
    lock.clear_failure()
    with disk.storage(root.path, "reading the files build() wrote"):
        files = entry.scan_build_dir(build_fd)
    if binary not in files:
        raise CacheError(f"build() wrote {sorted(files)} but not {binary!r}")
    meta = entry.encode_meta(key, binary, files, extra)
    with disk.storage(root.path, "writing meta.json"):
        entry.write_meta(build_fd, meta)
    # The bytes handed out are read (and hashed) before the entry becomes visible, so
    # nothing done to the entry afterwards (a concurrent clear) can change them.
    data = entry.read_verified(build_fd, binary, files[binary])
    if data is None:
        raise CacheError(f"kernel cache {root.path}: {binary} changed while it was stored")
    with disk.storage(root.path, "moving the entry into place"):
        with disk.prefix_dir(root, key, create=True) as prefix_fd:
            disk.move_aside(root, key, prefix_fd)
            os.replace(name, key, src_dir_fd=tmp_fd, dst_dir_fd=prefix_fd)
    return VerifiedBinary(key, binary, data, Path(disk.entry_dir(root, key), binary), root)
