"""Running a compiler so that its faults stay contained.

A compiler is an external program: it can hang, ignore SIGTERM, leave children behind,
exit 0 after writing half a file, or write its temporary files to a ``$TMPDIR`` that does
not exist. :func:`run_tool` runs it in its own process group in a working directory held
open (so the names it writes cannot be re-pointed elsewhere while it runs), with its
temporary files in that directory, a timeout, and the whole group killed on timeout
and on ``KeyboardInterrupt``. :func:`elf_problem` says whether a file it wrote is a
whole ELF image (every header and loaded segment inside the file).

>>> import tempfile, pathlib
>>> with workdir_fd(pathlib.Path(tempfile.mkdtemp())) as fd:
...     run_tool(["sh", "-c", "echo hi > out.txt"], fd, timeout=10).returncode, read_file(fd, "out.txt")
(0, b'hi\\n')
>>> elf_problem(b"\\x7fELF")
'it is 4 bytes long, shorter than an ELF header'
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

TIMEOUT_ENV = "LAZYTENSOR_COMPILE_TIMEOUT"
DEFAULT_TIMEOUT = 300.0  # seconds; kernels compile in seconds, a hung compiler never ends
_TERM_GRACE = 0.5  # seconds between SIGTERM and SIGKILL of a timed-out compiler group


class ToolTimeout(Exception):
    """The tool ran past its timeout; its process group was killed."""

    def __init__(self, timeout: float, output: str):
        super().__init__(f"did not finish within {timeout:g} s")
        self.timeout, self.output = timeout, output


def compile_timeout() -> float:
    """Seconds a compiler may run: ``$LAZYTENSOR_COMPILE_TIMEOUT``, else 300.

    >>> compile_timeout() > 0
    True
    """
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"${TIMEOUT_ENV} must be a positive number of seconds, got {text!r}")
    return value


@contextlib.contextmanager
def workdir_fd(workdir: Path) -> Iterator[int]:
    """``workdir`` opened once, refused unless it is a directory of this user that nobody
    else can write to (no one else can then plant a symlink among the files written)."""
    fd = os.open(workdir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise PermissionError(
                f"refusing to compile in {workdir}: it must belong to this user and not be "
                f"writable by others (owner uid {info.st_uid}, mode {oct(info.st_mode & 0o777)})"
            )
        yield fd
    finally:
        os.close(fd)


def write_new(dir_fd: int, name: str, text: str) -> None:
    """Write ``name`` in ``dir_fd`` afresh (an existing file or symlink is replaced)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dir_fd)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def read_file(dir_fd: int, name: str) -> bytes | None:
    """The bytes of regular file ``name`` in ``dir_fd``, or ``None`` (missing, symlink)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None
        return handle.read()


def _kill_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the process group, SIGKILL it after ``grace`` seconds; reap the leader."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_alive(proc.pid):
                return
            time.sleep(0.01)
    proc.poll()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# While Popen starts the compiler, this process holds the write ends of the pipes the
# compiler writes to, until the compiler is started. A process forked from another
# thread in that moment would hold them too, for as long as it lives: the compiler's
# output would never end for communicate(), and the build would never finish (a child
# that waits for that build, through the cache's lock, would wait forever). So a fork
# waits for the compiler's start to be over (a few milliseconds), as pthread_atfork's
# handlers do. An RLock: a Popen that runs a preexec_fn runs these handlers in its thread.
_spawn_lock = threading.RLock()


def _before_fork() -> None:
    _spawn_lock.acquire()


def _after_fork_in_parent() -> None:
    _spawn_lock.release()


def _after_fork_in_child() -> None:
    global _spawn_lock
    _spawn_lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)


def run_tool(cmd: list[str], dir_fd: int | None, timeout: float,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` in the directory ``dir_fd`` (its own session and process group), with
    ``$TMPDIR`` there too; return its ``CompletedProcess`` (text output).

    ``dir_fd=None`` runs it where we are, with our ``$TMPDIR``. Raises
    :class:`ToolTimeout` after ``timeout`` seconds, the group killed; on any interruption
    (``KeyboardInterrupt``) the group is killed before it propagates.
    """
    env = dict(os.environ if env is None else env)
    cwd, pass_fds = None, ()
    if dir_fd is not None:
        env["TMPDIR"] = "."  # the compiler's temporary files stay in the build directory
        # The child changes into the held directory itself (passed down), not into a name.
        cwd, pass_fds = f"/proc/self/fd/{dir_fd}", (dir_fd,)
    with _spawn_lock:  # no fork() of ours while the pipes' write ends are open here
        proc = subprocess.Popen(
            cmd, cwd=cwd, pass_fds=pass_fds, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
            start_new_session=True,
        )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc, _TERM_GRACE)
        out, err = _drain(proc)
        raise ToolTimeout(timeout, (err or "") + (out or "")) from None
    except BaseException:
        _kill_group(proc, 0.0)
        _drain(proc)
        raise
    if _group_alive(proc.pid):  # children it left behind
        _kill_group(proc, 0.0)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _drain(proc: subprocess.Popen) -> tuple[str, str]:
    """What the killed process wrote; gives up on pipes held open by an escaped child."""
    try:
        return proc.communicate(timeout=2.0)
    except (subprocess.TimeoutExpired, ValueError, OSError):
        with contextlib.suppress(Exception):
            proc.kill()
        return "", ""


# ELF header fields after e_ident: type, machine, version, entry, phoff, shoff, flags,
# ehsize, phentsize, phnum, shentsize, shnum, shstrndx.
_EHDR = {1: struct.Struct("<HHIIIIIHHHHHH"), 2: struct.Struct("<HHIQQQIHHHHHH")}
_PHDR = {1: struct.Struct("<IIIIIIII"), 2: struct.Struct("<IIQQQQQQ")}
PT_LOAD = 1


def elf_problem(data: bytes, want_type: int | None = None) -> str | None:
    """Why ``data`` is not a whole little-endian ELF image (``None`` if it is one).

    Checks the header, the program and section header tables, and that every loaded
    segment lies inside the file: a file cut short fails here instead of crashing the
    process that maps it (SIGBUS). ``want_type``: 3 for a shared object (ET_DYN).

    >>> elf_problem(b"MZ" + bytes(100))
    'it does not start with the ELF magic number'
    """
    if len(data) < 64:
        return f"it is {len(data)} bytes long, shorter than an ELF header"
    if data[:4] != b"\x7fELF":
        return "it does not start with the ELF magic number"
    elf_class, encoding = data[4], data[5]
    if elf_class not in _EHDR or encoding != 1:
        return f"it has an unexpected ELF class/encoding ({elf_class}, {encoding})"
    header = _EHDR[elf_class].unpack_from(data, 16)
    e_type, phoff, shoff = header[0], header[4], header[5]
    phentsize, phnum, shentsize, shnum = header[8], header[9], header[10], header[11]
    if want_type is not None and e_type != want_type:
        return f"its ELF type is {e_type}, not {want_type}"
    size = len(data)
    if phoff + phnum * phentsize > size:
        return f"its program headers end past its {size} bytes (cut short?)"
    if shoff + shnum * shentsize > size:
        return f"its section headers end past its {size} bytes (cut short?)"
    phdr = _PHDR[elf_class]
    if phnum and phentsize < phdr.size:
        return "its program headers are too small"
    for k in range(phnum):
        fields = phdr.unpack_from(data, phoff + k * phentsize)
        p_type = fields[0]
        offset, filesz = (fields[2], fields[5]) if elf_class == 2 else (fields[1], fields[4])
        if p_type == PT_LOAD and offset + filesz > size:
            return f"a loaded segment ends at byte {offset + filesz}, past its {size} bytes"
    return None
