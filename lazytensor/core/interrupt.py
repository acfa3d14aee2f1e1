"""Ctrl-C during long CPU kernels.

Python delivers SIGINT as ``KeyboardInterrupt`` between bytecodes of the main thread, so
a kernel called through ctypes holds it back until it returns (seconds, for a large
problem). A launch of at least :data:`INTERRUPTIBLE_WORK` pairs made from the main thread
therefore runs on a worker thread while the main thread waits for it in short slices of
``Event.wait``, where Python runs its signal handlers. On ``KeyboardInterrupt`` (or any
other exception raised there) the stop word that the kernel polls before each chunk of
work is set, the worker is joined -- the kernel returns within a chunk per thread, a few
milliseconds -- and the exception goes on. The outputs of a stopped call are never
returned; the process stays usable and the worker thread is gone. Smaller launches, and
launches from other threads (which receive no signal), call the kernel directly: a thread
costs tens of microseconds.

>>> import ctypes
>>> calls = []
>>> run(lambda addr: calls.append(addr) or 0, lambda stop: (ctypes.c_int64 * 1)(stop))
0
>>> len(calls)
1
"""

from __future__ import annotations

import ctypes
import threading
from typing import Callable

# Pairs from which a launch from the main thread can be interrupted (~5-50 ms for the
# simplest formulas on one core; below, Ctrl-C waits at most that long).
INTERRUPTIBLE_WORK = 1 << 24
WAIT_SLICE = 0.05  # seconds between two checks of the main thread (signals interrupt it too)

_never_set = ctypes.c_int(0)
NEVER = ctypes.addressof(_never_set)  # the stop word of direct calls: never set


def can_interrupt() -> bool:
    """The calling thread receives SIGINT (the main thread)."""
    return threading.current_thread() is threading.main_thread()


def run(fn: Callable[[int], int], make_args: Callable[[int], object]) -> int:
    """``fn(address of make_args(address of a stop word))`` on a worker thread; the calling
    thread waits, and on an exception sets the stop word, joins the worker and re-raises."""
    stop = ctypes.c_int(0)
    args = make_args(ctypes.addressof(stop))
    addr = ctypes.addressof(args)
    result: list = []
    done = threading.Event()

    def work():
        try:
            result.append(fn(addr))
        finally:
            done.set()

    worker = threading.Thread(target=work, name="lazytensor-kernel", daemon=True)
    worker.start()
    try:
        while not done.wait(WAIT_SLICE):
            pass
    except BaseException:
        stop.value = 1
        _join(worker)
        raise
    _join(worker)
    return result[0]


def _join(worker: threading.Thread) -> None:
    """Join ``worker``, whatever the signals: the kernel reads arrays the caller frees
    once this returns. A second Ctrl-C meanwhile is dropped (the first one is raised)."""
    while worker.is_alive():
        try:
            worker.join()
        except KeyboardInterrupt:
            continue
