"""Where the cache lives: choosing the root, making it private, and falling back.

The root is ``$LAZYTENSOR_CACHE_DIR`` if set, else the user cache directory from
platformdirs. It holds shared libraries that the process will ``dlopen``, so a root
that someone else could write to is a code-execution hole: such a root is refused, as
is one that cannot be created or written. Refusal is never fatal. The process falls
back to a private ``tempfile.mkdtemp`` directory (deleted at exit), warns once with
the reason, and carries on; only reuse across runs is lost.

>>> import pathlib, tempfile
>>> root = pathlib.Path(tempfile.mkdtemp()) / "made" / "here"
>>> handle, reason = open_root(root)
>>> reason is None, oct(os.fstat(handle.fd).st_mode & 0o777)
(True, '0o700')
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import sys
import tempfile
import threading
import warnings
from pathlib import Path

from . import safedir
from .disk import Root
from .errors import CacheError, CacheWarning

ENV_VAR = "LAZYTENSOR_CACHE_DIR"
APP_NAME = "lazytensor"
FALLBACK_PREFIX = "lazytensor-cache-"

# Per process: requested root -> its private fallback, and roots already warned about.
_fallbacks: dict[str, Path] = {}
_warned: set[str] = set()
_owned_dirs: list[tuple[int, str]] = []  # (creating pid, path) to delete at exit
_lock = threading.Lock()


def requested_root(root: str | os.PathLike[str] | None) -> Path:
    """The root asked for: ``root``, else ``$LAZYTENSOR_CACHE_DIR``, else the user cache dir.

    >>> requested_root("/tmp/x")
    PosixPath('/tmp/x')
    """
    if root is None:
        root = os.environ.get(ENV_VAR) or None
    if root is None:
        import platformdirs  # deferred: only needed when no directory was given

        root = platformdirs.user_cache_dir(APP_NAME)
    return Path(os.path.abspath(os.path.expanduser(os.fspath(root))))


def _missing_ancestors(path: Path) -> list[Path]:
    """``path`` and its parents that do not exist yet, deepest first."""
    missing = []
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate):
            break
        missing.append(candidate)
    return missing


def _unsafe_reason(path: Path, subject: str) -> str | None:
    """Why a directory must not hold binaries we will load, or ``None`` if it may."""
    try:
        info = os.stat(path)
    except OSError as error:
        return f"{subject} cannot be inspected ({error})"
    return safedir.problem(info, subject)


def open_root(root: Path) -> tuple[Root | None, str | None]:
    """Create ``root`` private (0700) if missing and open it: ``(Root, None)``, or
    ``(None, why it is unusable)``.

    The check is made on the open directory, which every later operation goes through,
    so re-pointing a name on the way to it afterwards changes nothing. A root that is
    itself a symlink is followed only if this user owns the link. Only the root and the
    parents this call created are checked: pre-existing parents such as ``/tmp`` are
    legitimately shared. Writability is discovered on first write.
    """
    created = _missing_ancestors(root)
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
    except OSError as error:
        return None, f"it cannot be created ({error})"
    for directory in created:
        # makedirs applies the umask, and gives intermediate directories the default
        # mode; chmod makes every directory we created private. A directory someone
        # else created in the meantime fails here and is reported by the check below.
        try:
            os.chmod(directory, 0o700)
        except OSError:
            pass
    for directory in created[1:]:
        reason = _unsafe_reason(directory, f"its parent {directory}")
        if reason is not None:
            return None, reason
    try:
        link = os.lstat(root)
        follow = stat.S_ISLNK(link.st_mode)
        if follow and safedir.owner_of(link) != os.geteuid():
            return None, f"it is a symbolic link owned by uid {safedir.owner_of(link)}"
        return Root(str(root), follow=follow), None
    except safedir.UnsafeDirectory as error:
        return None, error.strerror
    except OSError as error:
        return None, f"it cannot be opened ({error})"


def unusable_reason(root: Path) -> str | None:
    """Create and check ``root`` (see :func:`open_root`); why it is unusable, or ``None``."""
    return open_root(root)[1]


def warn_once(requested: Path, message: str) -> None:
    """Emit one :class:`CacheWarning` per process for ``requested``; later calls are silent."""
    with _lock:
        if str(requested) in _warned:
            return
        _warned.add(str(requested))
    warnings.warn(message, CacheWarning, stacklevel=_first_outside_package())


def _first_outside_package() -> int:
    """The ``stacklevel`` that points the warning at the code that called into the cache."""
    package_dir = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(1)  # warn_once
    level = 1
    while frame is not None and os.path.dirname(frame.f_code.co_filename) == package_dir:
        frame = frame.f_back
        level += 1
    return level


def fallback_root(requested: Path, reason: str) -> Path:
    """This process's private stand-in for ``requested``, created once; warns once.

    Raises :class:`CacheError` when not even a temporary directory can be made.
    """
    with _lock:
        fallback = _fallbacks.get(str(requested))
        if fallback is None:
            try:
                fallback = Path(tempfile.mkdtemp(prefix=FALLBACK_PREFIX))  # mode 0700
            except OSError as error:
                raise CacheError(
                    f"kernel cache {requested} is unusable ({reason}) and no private "
                    f"temporary directory could be created either: {error}"
                ) from error
            _fallbacks[str(requested)] = fallback
            _owned_dirs.append((os.getpid(), str(fallback)))
    warn_once(
        requested,
        f"lazytensor kernel cache: not using {requested} because {reason}; using the "
        f"private temporary cache {fallback} instead, which is deleted at exit, so "
        f"kernels will be recompiled in the next process. Point ${ENV_VAR} to a "
        "writable directory that only you can write to in order to keep them.",
    )
    return fallback


def _remove_fallbacks() -> None:
    # A forked child inherits this list and this handler; only the creator deletes.
    for pid, path in _owned_dirs:
        if pid == os.getpid():
            shutil.rmtree(path, ignore_errors=True)


def _reset_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at fork time


atexit.register(_remove_fallbacks)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
