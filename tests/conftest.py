"""Test configuration: a private kernel cache per test session (unless one is given)."""

import os
import tempfile

import numpy as np
import pytest

if not os.environ.get("LAZYTENSOR_CACHE_DIR"):
    os.environ["LAZYTENSOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="lazytensor-test-cache-")


@pytest.fixture
def rng(request):
    """A fresh random generator per test; the seed is printed on failure."""
    seed = int.from_bytes(os.urandom(4), "little")
    request.node.user_properties.append(("seed", seed))
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)


class ChildError(Exception):
    """An exception raised by ``fn`` in :func:`run_in_child`: ``kind`` is its type's name."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


def run_in_child(fn, timeout: float = 300.0):
    """``fn()`` in a forked child: its (picklable) result; an exception it raised comes back
    as :class:`ChildError`. A child killed by a signal (a segfault, a stack overflow) fails
    the calling test instead of ending the test run."""
    import pickle
    import select
    import signal
    import time

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 0
        try:
            os.close(read_end)
            try:
                payload = ("returned", fn())
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                payload = ("raised", type(e).__name__, str(e))
            with os.fdopen(write_end, "wb") as f:
                f.write(pickle.dumps(payload))
        except BaseException:  # noqa: BLE001
            code = 3
        finally:
            os._exit(code)
    os.close(write_end)
    chunks, deadline = [], time.monotonic() + timeout
    with os.fdopen(read_end, "rb") as f:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([f], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError(f"the child did not finish within {timeout} s")
            data = os.read(f.fileno(), 1 << 20)
            if not data:
                break
            chunks.append(data)
    status = os.waitid(os.P_PID, pid, os.WEXITED)
    if status.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        raise AssertionError(f"the child was killed by {signal.Signals(status.si_status).name}")
    if status.si_status != 0 or not chunks:
        raise AssertionError(f"the child exited with status {status.si_status}")
    payload = pickle.loads(b"".join(chunks))
    if payload[0] == "raised":
        raise ChildError(payload[1], payload[2])
    return payload[1]
