"""Test configuration.

- One private temporary directory per test session holds everything the tests create
  (``tempfile`` and ``$TMPDIR`` point to it, so subprocesses and compilers use it too):
  the kernel cache, unless ``$LAZYTENSOR_CACHE_DIR`` is given, and every temporary file.
  It is removed when the session ends.
- ``rng``: a fresh random generator per test, its seed printed on failure.
- ``gpu``: the real GPU when torch sees one, else the CUDA emulator (tests/cuda_emulator).
- A one-line summary of the skipped tests, grouped by reason.
"""

import atexit
import os
import shutil
import tempfile
from collections import Counter

import numpy as np
import pytest

_SESSION_TMP = tempfile.mkdtemp(prefix="lazytensor-tests-")
_CREATOR = os.getpid()
tempfile.tempdir = _SESSION_TMP
os.environ["TMPDIR"] = _SESSION_TMP
if not os.environ.get("LAZYTENSOR_CACHE_DIR"):
    os.environ["LAZYTENSOR_CACHE_DIR"] = os.path.join(_SESSION_TMP, "kernel-cache")


def _remove_session_tmp():
    if os.getpid() == _CREATOR:  # not in a forked child that exits normally
        shutil.rmtree(_SESSION_TMP, ignore_errors=True)


atexit.register(_remove_session_tmp)


@pytest.fixture
def rng(request):
    """A fresh random generator per test; the seed is printed on failure."""
    seed = int.from_bytes(os.urandom(4), "little")
    request.node.user_properties.append(("seed", seed))
    print(f"random seed: {seed}")
    return np.random.default_rng(seed)


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ").strip()


def pytest_terminal_summary(terminalreporter):
    """``skipped N: n1 × reason (files), ...`` on one line (``-q`` hides the reasons)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    counts, files = Counter(), {}
    for report in skipped:
        reason = _skip_reason(report)
        counts[reason] += 1
        files.setdefault(reason, set()).add(os.path.basename(report.location[0]))
    groups = []
    for reason, n in counts.most_common():
        where = sorted(files[reason])
        where_text = ", ".join(where[:3]) + (f" +{len(where) - 3}" if len(where) > 3 else "")
        groups.append(f"{n} × {reason} ({where_text})")
    terminalreporter.write_line(f"skipped {len(skipped)}: " + "; ".join(groups))


def _gpu_kind():
    """("hardware" | "emulator", None) or (None, why not)."""
    import torch
    from lazytensor.codegen.cuda.nvcc import nvcc_path

    if nvcc_path() is None:
        return None, "nvcc not found (CUDA toolkit): CUDA kernels can be neither built nor run"
    if torch.cuda.is_available() and os.environ.get("LAZYTENSOR_TEST_GPU") != "emulator":
        return "hardware", None
    try:
        import pycuda  # noqa: F401
    except ImportError:
        return None, "pycuda is not installed (`make .venv/.pycuda` builds it against the " \
                     "fake driver)"
    return "emulator", None


@pytest.fixture(scope="session")
def _gpu_device():
    kind, why = _gpu_kind()
    if kind is None:
        pytest.skip(why)
    if kind == "hardware":
        from cuda_emulator.gpu import Gpu

        return Gpu()
    from cuda_emulator.gpu import EmulatedGpu

    return EmulatedGpu()


@pytest.fixture
def gpu(_gpu_device, monkeypatch):
    """A GPU: the real one when torch sees one, else the emulator (see tests/cuda_emulator).
    After the test, races or divergent barriers the emulator saw fail it."""
    if _gpu_device.emulated:
        _gpu_device.install(monkeypatch)
    yield _gpu_device
    _gpu_device.check()


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
