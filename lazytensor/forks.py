"""Fork safety of the CPU kernels' OpenMP threads, recorded from the package's import on.

libgomp's thread pool does not survive ``fork()``: a child that enters a parallel region
after its parent ran one waits forever for threads that do not exist. The pool belongs
to the process, shared by every library that uses the same OpenMP runtime (torch's
operations start it, and our kernels link to it), so a process forked where a pool may
exist runs its kernels on one thread (DataLoader workers do anyway: torch gives them one
thread). A pool may exist after our kernels ran on several threads, or whenever an
OpenMP runtime is loaded and the parent has other threads than the one that forks (an
idle pool keeps its threads). Spawned processes are fine.

Locks that threads hold for a moment (the plan cache's, the ranges cache's) come from
:func:`lock`: a child forked while another thread held one gets it released, as the
thread that would release it does not exist there.

The check runs in the parent just before each fork, from ``import lazytensor`` on (this
module is imported by the package's ``__init__``), so that a child is safe even when the
kernels' modules load only after the fork.

>>> isinstance(openmp_pool_may_exist(), bool), forked_where_pool_may_exist() in (True, False)
(True, True)
>>> with lock():
...     pass
"""

from __future__ import annotations

import os
import sys
import threading
import weakref

_OPENMP_RUNTIMES = (b"libgomp", b"libiomp", b"libomp")
_threads_started = False  # our kernels ran on several threads in this process
_pool_at_fork = False  # the last fork's parent may have held a pool (set just before it)
_forked_where_pool = False  # this process (or an ancestor) was forked where a pool may exist
_locks: weakref.WeakSet = weakref.WeakSet()  # the locks of lock(), reset in a forked child


def lock() -> threading.Lock:
    """A ``threading.Lock`` that a forked child finds released (another thread of the
    parent may have held it at fork time)."""
    new = threading.Lock()
    _locks.add(new)
    return new


def note_threads_started() -> None:
    """Record that a kernel runs on several OpenMP threads in this process."""
    global _threads_started
    _threads_started = True


def forked_where_pool_may_exist() -> bool:
    """Whether this process was forked (directly or through its parents) from one that may
    hold an OpenMP pool: its kernels must then run on one thread."""
    return _forked_where_pool


def openmp_pool_may_exist() -> bool:
    """Whether this process may hold an OpenMP thread pool: our kernels ran on several
    threads, or an OpenMP runtime is loaded while other threads than this one exist.
    Where ``/proc`` cannot tell, a loaded torch counts as a pool."""
    if _threads_started or _forked_where_pool:
        return True
    try:
        if len(os.listdir("/proc/self/task")) < 2:
            return False
        with open("/proc/self/maps", "rb") as maps:
            text = maps.read()
    except OSError:
        return "torch" in sys.modules
    return any(name in text for name in _OPENMP_RUNTIMES)


def _before_fork() -> None:
    global _pool_at_fork
    try:
        _pool_at_fork = openmp_pool_may_exist()
    except Exception:  # noqa: BLE001 - a fork must not fail here: assume the worst
        _pool_at_fork = True


def _after_fork_in_child() -> None:
    global _forked_where_pool
    _forked_where_pool = _forked_where_pool or _pool_at_fork
    for held in list(_locks):
        held._at_fork_reinit()  # CPython's own reset of a lock in a child (threading does it)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
