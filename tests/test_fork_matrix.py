"""fork() against every state the CPU runtime's threads and locks can be in.

Each case is a script run in a fresh interpreter (its own kernel cache, so the first call
builds), under a timeout: a hang fails the test instead of blocking the run. Inside it,
the child of ``os.fork()`` computes a reduction and compares it with NumPy; the parent
gives the child a timeout of its own and says which step hung.

- during a build: another thread compiles the kernel the child asks for (the child must
  not wait for the in-process build locks of a thread it does not have);
- a parent that dies during that build: the child (which shares the build's lock file)
  must not keep the kernel's lock;
- after torch's OpenMP: torch ran a parallel operation, so libgomp's pool, which our
  kernels share, holds threads the child lacks;
- after our own threaded kernels (and a grandchild forked from that child);
- during a threaded kernel that runs in another thread;
- multiprocessing pools started with the fork method, after torch's OpenMP and our kernels.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from lazytensor.codegen import compilers

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or not compilers.cpu_compiler().available,
                                reason="needs fork() and a C++ compiler")

_PRELUDE = '''
import os, sys, threading, time
import numpy as np
from lazytensor import Vi, Vj

def gaussian(x, y, c):
    return np.exp(-c * ((x[:, None] - y[None]) ** 2).sum(-1)).sum(1)[:, None]

def lazy_gaussian(x, y, c):
    return np.asarray((-Vi(x).sqdist(Vj(y)) * c).exp().sum(dim=1))

def in_child(fn, timeout=45.0, what="the child"):
    """fn() in a forked child; exit here (status 1) unless it returns True in time."""
    pid = os.fork()
    if pid == 0:
        code = 3
        try:
            code = 0 if fn() else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            if code != 0:
                print(f"{what} exited with status {code}", flush=True)
                sys.exit(1)
            return
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print(f"{what} hung for {timeout} s", flush=True)
    sys.exit(1)

def compiling():
    """A compiler runs as a child of this process (some thread of ours started it)."""
    import glob
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        with open(path) as f:
            if f.read().split():
                return True
    return False

rng = np.random.default_rng(int(os.environ.get("SEED", "0")))
'''

CASES = {
    "during_a_build": '''
x, y = rng.random((200, 3)), rng.random((300, 3))
builder = threading.Thread(target=lazy_gaussian, args=(x, y, 1.25))
builder.start()
deadline = time.monotonic() + 60
while not compiling():  # the other thread's first call is compiling its kernel
    assert time.monotonic() < deadline, "no compiler started"
    time.sleep(0.005)
time.sleep(0.05)
# the same kernel (another constant: constants are not in the kernel's key)
in_child(lambda: np.allclose(lazy_gaussian(x, y, 2.5), gaussian(x, y, 2.5)), what="the child")
builder.join()
''',
    "parent_dies_during_a_build": '''
x, y = rng.random((200, 3)), rng.random((300, 3))

def parent():  # builds on a thread, forks the child, and dies before the build ends
    builder = threading.Thread(target=lazy_gaussian, args=(x, y, 1.25), daemon=True)
    builder.start()
    deadline = time.monotonic() + 60
    while not compiling():
        assert time.monotonic() < deadline, "no compiler started"
        time.sleep(0.005)
    time.sleep(0.05)
    pid = os.fork()
    if pid == 0:  # the child: once the parent is gone, the kernel's lock must be free
        with open(os.environ["RESULT"] + ".pid", "w") as f:
            f.write(str(os.getpid()))
        code = 3
        try:
            while os.getppid() == parent_pid:
                time.sleep(0.01)
            code = 0 if np.allclose(lazy_gaussian(x, y, 2.5), gaussian(x, y, 2.5)) else 2
        finally:
            with open(os.environ["RESULT"], "w") as f:
                f.write(str(code))
            os._exit(code)
    os._exit(0)

result = os.environ["RESULT"] = os.path.join(os.environ["LAZYTENSOR_CACHE_DIR"] + "-result")
first = os.fork()
if first == 0:
    parent_pid = os.getpid()
    parent()
os.waitpid(first, 0)
deadline = time.monotonic() + 45
while not os.path.exists(result) or not open(result).read():
    if time.monotonic() > deadline:
        print("the orphaned child hung for 45 s", flush=True)
        os.kill(int(open(result + ".pid").read()), 9)
        sys.exit(1)
    time.sleep(0.05)
assert open(result).read() == "0", open(result).read()
''',
    "after_torch_openmp": '''
import torch
torch.set_num_threads(2)
a = torch.randn(2000, 2000)
float(torch.exp(a).sum())  # torch's OpenMP pool now has its threads
x, y = rng.random((3000, 3)), rng.random((3000, 3))
lazy_gaussian(x[:10], y[:10], 1.0)  # the kernel built here, on one thread (a small call)
in_child(lambda: np.allclose(lazy_gaussian(x, y, 1.0), gaussian(x, y, 1.0)))
''',
    "after_our_threaded_kernels": '''
os.environ["LAZYTENSOR_NUM_THREADS"] = "2"
x, y = rng.random((600, 3)), rng.random((700, 3))
want = gaussian(x, y, 1.0)
assert np.allclose(lazy_gaussian(x, y, 1.0), want)  # 420 000 pairs: on two threads

def child():
    if not np.allclose(lazy_gaussian(x, y, 1.0), want):
        return False
    in_child(lambda: np.allclose(lazy_gaussian(x, y, 1.0), want), what="the grandchild")
    return True

in_child(child)
''',
    "during_a_kernel_in_another_thread": '''
os.environ["LAZYTENSOR_NUM_THREADS"] = "2"
x, y = rng.random((2000, 3)), rng.random((3000, 3))
want = gaussian(x[:50], y, 1.0)
lazy_gaussian(x[:10], y[:10], 1.0)  # built (one thread); the loop below runs on two
stop = threading.Event()

def loop():
    while not stop.is_set():
        lazy_gaussian(x, y, 1.0)

runner = threading.Thread(target=loop)
runner.start()
time.sleep(0.3)
in_child(lambda: np.allclose(lazy_gaussian(x[:50], y, 1.0), want))
stop.set()
runner.join()
''',
    "multiprocessing_fork_pool": '''
import multiprocessing
import torch
torch.set_num_threads(2)
float(torch.exp(torch.randn(2000, 2000)).sum())
os.environ["LAZYTENSOR_NUM_THREADS"] = "2"
x, y = rng.random((700, 3)), rng.random((800, 3))
assert np.allclose(lazy_gaussian(x, y, 1.0), gaussian(x, y, 1.0))

def work(c):
    return bool(np.allclose(lazy_gaussian(x, y, c), gaussian(x, y, c)))

with multiprocessing.get_context("fork").Pool(2) as pool:
    assert all(pool.map_async(work, [0.5, 1.0, 1.5, 2.0]).get(timeout=90))
''',
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fork(case, tmp_path, rng):
    script = _PRELUDE + textwrap.dedent(CASES[case]) + '\nprint("ok")\n'
    env = {**os.environ, "LAZYTENSOR_CACHE_DIR": str(tmp_path / "cache"),
           "SEED": str(int(rng.integers(1 << 31)))}
    env.pop("LAZYTENSOR_NUM_THREADS", None)
    try:
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=240)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{case}: the script hung for {e.timeout} s\n{e.stdout}\n{e.stderr}") from None
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (
        f"{case}: status {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}")
