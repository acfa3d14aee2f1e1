"""One cache entry on disk, and the checks it must pass before anyone trusts it.

An entry is a directory ``<root>/<key[:2]>/<key>/`` holding the files a build wrote
(source, binary, ...) and a ``meta.json`` written by the cache::

    {"format": 1, "key": "<key>", "binary": "kernel.so", "created": 1718000000.5,
     "files": {"kernel.so": {"sha256": "<64 hex>", "size": 51234}, "kernel.cpp": {...}},
     "extra": {...the JSON dict that build() returned...}}

Nothing read back is trusted: a crash, a full disk, a second writer or a hand edit can
leave any byte anywhere. So ``meta.json`` is parsed as JSON only (never pickle or
eval), every field is type-checked, and the binary is re-hashed on every load. Any
failure means "no entry", which the store turns into a rebuild under the key's lock.
Every function here works inside a directory given as an open descriptor, and opens
files with ``O_NOFOLLOW`` (see :mod:`lazytensor.cache.safedir`).

>>> check_key("0123456789abcdef")
'0123456789abcdef'
>>> parse_meta(b"not json", "0123456789abcdef") is None
True
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
import time
from typing import Any

from .errors import CacheError, InvalidKeyError

FORMAT_VERSION = 1
META_NAME = "meta.json"
# The metadata is a few kilobytes; anything much larger was not written by us.
MAX_META_BYTES = 1 << 20
_CHUNK = 1 << 20

# fullmatch (not match with "$"): "$" would accept a trailing newline.
_KEY_RE = re.compile(r"[0-9a-f]{16,128}")
# One path component. The first character excludes ".", "..", hidden files and "-x".
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")
_SHA_RE = re.compile(r"[0-9a-f]{64}")
# Opening with O_NOFOLLOW makes a symlink planted as the binary fail to open at all.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_OPEN_FLAGS = os.O_RDONLY | _NOFOLLOW
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW


def is_key(value: object) -> bool:
    """Whether ``value`` is a valid cache key (see :func:`check_key`).

    >>> is_key("ab" * 8), is_key("AB" * 8), is_key("ab" * 8 + "\\n")
    (True, False, False)
    """
    return isinstance(value, str) and _KEY_RE.fullmatch(value) is not None


def check_key(key: object) -> str:
    """Return ``key`` if it is a lower-case hex digest of 16 to 128 digits, else raise.

    The key becomes a directory name, so this is the guard against path traversal.

    >>> check_key("../../etc/passwd")
    Traceback (most recent call last):
    lazytensor.cache.errors.InvalidKeyError: cache key must be 16-128 lower-case hex digits, got '../../etc/passwd'
    """
    if not is_key(key):
        raise InvalidKeyError(f"cache key must be 16-128 lower-case hex digits, got {key!r}")
    return key


def check_file_name(name: object) -> str:
    """Return ``name`` if it is a plain file name an entry may hold, else raise.

    >>> check_file_name("kernel.so")
    'kernel.so'
    >>> check_file_name("../kernel.so")
    Traceback (most recent call last):
    lazytensor.cache.errors.InvalidKeyError: file name must match [A-Za-z0-9_][A-Za-z0-9_.+-]* (at most 128 characters, not meta.json), got '../kernel.so'
    """
    if not isinstance(name, str) or _NAME_RE.fullmatch(name) is None or name == META_NAME:
        raise InvalidKeyError(
            "file name must match [A-Za-z0-9_][A-Za-z0-9_.+-]* "
            f"(at most 128 characters, not {META_NAME}), got {name!r}"
        )
    return name


def is_relative_name(rel: object) -> bool:
    """Whether ``rel`` is a safe "/"-separated path of plain names inside an entry.

    >>> is_relative_name("obj/kernel.o"), is_relative_name("../x"), is_relative_name("/etc")
    (True, False, False)
    """
    if not isinstance(rel, str) or not rel or len(rel) > 1024:
        return False
    return all(_NAME_RE.fullmatch(part) is not None for part in rel.split("/"))


def file_record(name: str, dir_fd: int) -> dict[str, Any]:
    """Hash one regular file ``name`` inside ``dir_fd``: ``{"sha256": hex, "size": bytes}``.

    Raises OSError (also for a symlink, which is never followed).

    >>> import tempfile, pathlib
    >>> d = tempfile.mkdtemp(); _ = (pathlib.Path(d) / "f").write_bytes(b"abc")
    >>> fd = os.open(d, os.O_RDONLY); file_record("f", fd)["size"]; os.close(fd)
    3
    """
    fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{name} is not a regular file")
        digest, size = _hash_fd(fd, limit=None)
    finally:
        os.close(fd)
    return {"sha256": digest, "size": size}


def _hash_fd(fd: int, limit: int | None) -> tuple[str, int]:
    """sha256 and length of what ``fd`` holds, reading at most ``limit + 1`` bytes."""
    sha = hashlib.sha256()
    size = 0
    while True:
        want = _CHUNK if limit is None else min(_CHUNK, limit + 1 - size)
        chunk = os.read(fd, want) if want > 0 else b""
        if not chunk:
            return sha.hexdigest(), size
        sha.update(chunk)
        size += len(chunk)


def scan_build_dir(dir_fd: int) -> dict[str, dict[str, Any]]:
    """Record every file a build wrote in the directory ``dir_fd``, as ``{name: file_record}``.

    Symlinks, devices, odd names and a ``meta.json`` of the build's own are refused with
    :class:`CacheError`: an entry must hold only regular files the cache can re-hash.

    >>> import tempfile, pathlib
    >>> d = tempfile.mkdtemp(); _ = (pathlib.Path(d) / "kernel.so").write_bytes(b"\\x7fELF")
    >>> fd = os.open(d, os.O_RDONLY); list(scan_build_dir(fd)); os.close(fd)
    ['kernel.so']
    """
    files: dict[str, dict[str, Any]] = {}
    for parent, dirs, names, parent_fd in os.fwalk(".", dir_fd=dir_fd):
        for name in sorted(dirs + names):
            rel = os.path.normpath(os.path.join(parent, name)).replace(os.sep, "/")
            mode = os.lstat(name, dir_fd=parent_fd).st_mode
            if not is_relative_name(rel) or rel == META_NAME:
                raise CacheError(f"build wrote {rel!r}, a name the cache does not store")
            if stat.S_ISDIR(mode):
                continue  # os.fwalk descends into it
            if not stat.S_ISREG(mode):
                raise CacheError(f"build wrote {rel!r}, which is not a regular file")
            files[rel] = file_record(name, parent_fd)
    return files


def encode_meta(key: str, binary: str, files: dict[str, Any], extra: object) -> bytes:
    """The bytes of ``meta.json`` for a finished build; :class:`CacheError` if ``extra`` is bad.

    >>> rec = {"sha256": "0" * 64, "size": 1}
    >>> json.loads(encode_meta("0123456789abcdef", "k.so", {"k.so": rec}, {"cc": "g++"}))["extra"]
    {'cc': 'g++'}
    """
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise CacheError(f"build() must return a dict of metadata, got {type(extra).__name__}")
    meta = {
        "format": FORMAT_VERSION,
        "key": key,
        "binary": binary,
        "created": time.time(),
        "files": files,
        "extra": extra,
    }
    try:
        # allow_nan=False: NaN is not JSON, and another reader would reject the file.
        text = json.dumps(meta, sort_keys=True, indent=1, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise CacheError(f"build() metadata is not JSON-serialisable: {error}") from error
    return text.encode("utf-8")


def write_meta(dir_fd: int, data: bytes) -> None:
    """Write ``meta.json`` into a build directory (``dir_fd``) not yet visible to readers.

    No fsync: after a power cut the worst case is a file whose bytes do not match the
    recorded hashes, which verification already treats as absent.
    """
    fd = os.open(META_NAME, _CREATE_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_file_record(record: object) -> bool:
    return (
        isinstance(record, dict)
        and isinstance(record.get("sha256"), str)
        and _SHA_RE.fullmatch(record["sha256"]) is not None
        and _is_count(record.get("size"))
    )


def parse_meta(raw: bytes, key: str) -> dict[str, Any] | None:
    """Decode and type-check ``meta.json`` bytes for ``key``; ``None`` if anything is off.

    >>> parse_meta(b'[1, 2]', "0123456789abcdef") is None
    True
    """
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
    if not isinstance(meta, dict):
        return None
    files = meta.get("files")
    created = meta.get("created")
    ok = (
        meta.get("format") == FORMAT_VERSION
        and type(meta.get("format")) is int
        and meta.get("key") == key
        and isinstance(meta.get("extra"), dict)
        and isinstance(created, (int, float))
        and not isinstance(created, bool)
        and math.isfinite(created)
        and isinstance(files, dict)
        and all(is_relative_name(n) and _is_file_record(r) for n, r in files.items())
        and isinstance(meta.get("binary"), str)
        and meta["binary"] in files
    )
    return meta if ok else None


def read_meta_file(dir_fd: int, key: str) -> dict[str, Any] | None:
    """Read and check ``meta.json`` in the entry directory ``dir_fd``; ``None`` if missing,
    a symlink, huge or malformed.

    >>> import tempfile
    >>> fd = os.open(tempfile.mkdtemp(), os.O_RDONLY)
    >>> read_meta_file(fd, "0123456789abcdef") is None
    True
    >>> os.close(fd)
    """
    try:
        fd = os.open(META_NAME, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        total = 0
        while total <= MAX_META_BYTES:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    if total > MAX_META_BYTES:
        return None
    return parse_meta(b"".join(chunks), key)


def read_verified(dir_fd: int, name: str, record: dict[str, Any]) -> bytes | None:
    """The bytes of ``name`` in ``dir_fd`` if it is a regular file with the recorded size and
    sha256, else ``None``. The bytes returned are the very bytes that were hashed: load
    these, never the file again by its name (it could be replaced in between).

    The size is compared first (one fstat) so a truncated binary costs no reading.

    >>> import tempfile
    >>> fd = os.open(tempfile.mkdtemp(), os.O_RDONLY)
    >>> read_verified(fd, "kernel.so", {"sha256": "0" * 64, "size": 0}) is None
    True
    >>> os.close(fd)
    """
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != record["size"]:
            return None
        chunks = []
        size = 0
        while size <= record["size"]:
            chunk = os.read(fd, min(_CHUNK, record["size"] + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) != record["size"] or hashlib.sha256(data).hexdigest() != record["sha256"]:
        return None
    return data


def verify_file(dir_fd: int, name: str, record: dict[str, Any]) -> bool:
    """Whether ``name`` in ``dir_fd`` is a regular file with the recorded size and sha256.

    >>> import tempfile
    >>> fd = os.open(tempfile.mkdtemp(), os.O_RDONLY)
    >>> verify_file(fd, "kernel.so", {"sha256": "0" * 64, "size": 0})
    False
    >>> os.close(fd)
    """
    return read_verified(dir_fd, name, record) is not None
