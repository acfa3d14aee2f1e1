"""Directories held open: every cache operation is relative to a checked directory fd.

A path is re-resolved each time it is used, so a check made on a path says nothing about
the next use: whoever can re-point a symlink or rename a parent in between decides what
gets opened. The cache therefore opens its root once, checks *that open directory*
(owner, mode) and then reaches everything below it with ``dir_fd=`` calls, one component
at a time, never following a symlink (``O_NOFOLLOW``): a symlink anywhere inside the cache
is refused, not followed. Paths built from the root's name serve only for messages.

>>> import tempfile
>>> root = open_root_fd(tempfile.mkdtemp())
>>> sub = open_dir("locks", root, create=True)
>>> sorted(os.listdir(root)), problem(os.fstat(sub), "locks") is None
(['locks'], True)
>>> os.close(sub); os.close(root)
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | NOFOLLOW | _CLOEXEC
READ_FLAGS = os.O_RDONLY | NOFOLLOW | _CLOEXEC
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | _CLOEXEC
# What opening a symlink with O_NOFOLLOW (ELOOP) or a file as a directory (ENOTDIR) raises.
NOT_A_DIRECTORY = frozenset({errno.ELOOP, errno.ENOTDIR, errno.EMLINK})


class UnsafeDirectory(OSError):
    """A directory inside the cache is a symlink, not a directory, or not private to us."""


def owner_of(info: os.stat_result) -> int:
    """The uid that owns ``info``'s file (the one place the tests simulate another user)."""
    return info.st_uid


def problem(info: os.stat_result, subject: str) -> str | None:
    """Why a directory with this ``fstat`` must not hold binaries we load, or ``None``.

    >>> import tempfile
    >>> d = tempfile.mkdtemp(); os.chmod(d, 0o777)
    >>> problem(os.stat(d), "it")
    'it is group- or world-writable (mode 0o777)'
    """
    if not stat.S_ISDIR(info.st_mode):
        return f"{subject} is not a directory"
    owner = owner_of(info)
    if owner != os.geteuid():
        return f"{subject} is owned by uid {owner}, not by this user (uid {os.geteuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{subject} is group- or world-writable (mode {oct(info.st_mode & 0o777)})"
    return None


def open_root_fd(path: str, follow: bool = False) -> int:
    """Open ``path`` as a directory (its last component not a symlink unless ``follow``).

    Raises :class:`UnsafeDirectory` if the open directory is not private to this user.
    """
    flags = DIR_FLAGS & ~NOFOLLOW if follow else DIR_FLAGS
    fd = os.open(path, flags)
    try:
        reason = problem(os.fstat(fd), "it")
        if reason is not None:
            raise UnsafeDirectory(errno.EPERM, reason, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_dir(name: str, dir_fd: int, *, create: bool = False) -> int:
    """Open directory ``name`` inside ``dir_fd`` without following a symlink, and check it.

    ``create`` makes it (0700) first if it is missing. Raises :class:`FileNotFoundError`
    when absent, :class:`UnsafeDirectory` for a symlink, a file, or a directory that is
    not private to this user.
    """
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=dir_fd)
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as error:
        if error.errno in NOT_A_DIRECTORY:
            raise UnsafeDirectory(error.errno, f"{name} is a symlink or not a directory") from error
        raise
    try:
        reason = problem(os.fstat(fd), name)
        if reason is not None:
            raise UnsafeDirectory(errno.EPERM, reason, name)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def opened_dir(name: str, dir_fd: int, *, create: bool = False) -> Iterator[int]:
    """:func:`open_dir` as a context manager that closes the descriptor."""
    fd = open_dir(name, dir_fd, create=create)
    try:
        yield fd
    finally:
        os.close(fd)


def is_gone(fd: int) -> bool:
    """Whether the directory held by ``fd`` has been deleted (a removed cache root)."""
    try:
        return os.fstat(fd).st_nlink == 0
    except OSError:
        return True


def remove(name: str, dir_fd: int) -> None:
    """Delete file or directory tree ``name`` inside ``dir_fd``, best effort, never following
    a symlink (a symlink is unlinked, not its target)."""
    try:
        mode = os.lstat(name, dir_fd=dir_fd).st_mode
    except OSError:
        return
    if not stat.S_ISDIR(mode):
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        return
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return
    try:
        for child in os.listdir(fd):
            remove(child, fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=dir_fd)


def tree_size(name: str, dir_fd: int) -> int:
    """Bytes in the regular files under ``name`` (not following symlinks)."""
    info = os.lstat(name, dir_fd=dir_fd)
    if not stat.S_ISDIR(info.st_mode):
        return info.st_size
    total = 0
    for _, _, files, fd in os.fwalk(name, dir_fd=dir_fd):
        for file in files:
            with contextlib.suppress(OSError):
                total += os.lstat(file, dir_fd=fd).st_size
    return total


def current_path(fd: int, fallback: str) -> str:
    """Where the directory held by ``fd`` is now, as the kernel knows it (no symlinks on
    the way, whatever was re-pointed since it was opened); ``fallback`` without /proc."""
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return fallback
    return path if path.startswith("/") and not path.endswith(" (deleted)") else fallback


def fd_path(fd: int, name: str | None = None) -> str | None:
    """``/proc/self/fd/<fd>[/name]``: a path that reaches the held directory itself, not
    whatever its name points to now; ``None`` where /proc is not mounted (not Linux)."""
    base = f"/proc/self/fd/{fd}"
    if not os.path.isdir(base):
        return None
    return base if name is None else f"{base}/{name}"
