"""Ctrl-C during long kernels: a child process receives SIGINT in the middle of a
multi-second forward or backward; the call must raise KeyboardInterrupt promptly, and the
process must stay healthy (the next call correct, no thread left behind)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from lazytensor.core import interrupt

CHILD = textwrap.dedent("""
    import os, signal, sys, time, torch
    # Ctrl-C as at a terminal, even when the suite runs with SIGINT ignored (a background job)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from lazytensor import Vi, Vj
    mode = sys.argv[1]

    def tasks():
        return len(os.listdir("/proc/self/task"))

    def check_small():  # a correct result after the interruption
        x, y, b = torch.rand(300, 3), torch.rand(200, 3), torch.rand(200, 1)
        got = (-Vi(x).sqdist(Vj(y))).exp() @ b
        want = torch.exp(-torch.cdist(x.double(), y.double()) ** 2) @ b.double()
        assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5), "wrong result"

    torch.manual_seed(0)
    n = 150_000 if mode == "forward" else 80_000
    x, y, b = torch.rand(n, 3), torch.rand(n, 3), torch.rand(n, 1)
    # the kernels compiled, and a launch above the threshold once, so that every pool of
    # threads exists already
    k = 1 << 12
    xs = x[:k].clone().requires_grad_(True)
    (-Vi(xs).sqdist(Vj(y[:k * 2]))).exp().__matmul__(b[:k * 2], grad_mode="symbolic").sum().backward()
    check_small()
    time.sleep(0.2)  # the threads of the warm-up's worker end
    before = tasks()
    xg = x.clone().requires_grad_(True)
    try:
        if mode == "forward":
            print("start", flush=True)
            (-Vi(x).sqdist(Vj(y))).exp() @ b
        else:
            out = (-Vi(xg).sqdist(Vj(y))).exp().__matmul__(b, grad_mode="symbolic")
            print("start", flush=True)
            out.sum().backward()
        print("completed", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    check_small()
    time.sleep(0.2)  # a thread that is ending
    print("tasks", before, tasks(), flush=True)
""")


def _run(mode: str) -> tuple[float, list]:
    env = dict(os.environ, LAZYTENSOR_NUM_THREADS="2", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "start", proc.stderr.read()
        time.sleep(0.5)  # well inside the call
        sent = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        first = proc.stdout.readline().strip()
        delay = time.perf_counter() - sent
        rest = proc.stdout.read().split()
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    finally:
        proc.kill()
    return delay, [first] + rest


@pytest.mark.parametrize("mode", ["forward", "backward"])
def test_ctrl_c_stops_a_long_kernel_and_the_process_stays_usable(mode):
    delay, lines = _run(mode)
    print(f"{mode}: KeyboardInterrupt {delay * 1e3:.0f} ms after SIGINT")
    assert lines[0] == "interrupted", lines
    # the uninterrupted call takes many seconds; the kernel stops within a chunk of work
    # (~100 ms on a quiet machine; the bound leaves room for a loaded one)
    assert delay < 1.5, f"KeyboardInterrupt {delay:.2f} s after SIGINT"
    assert lines[1] == "tasks" and int(lines[3]) <= int(lines[2]), f"threads before/after: {lines[2:]}"


def test_the_worker_is_joined_and_a_kernel_error_status_is_returned():
    statuses = []

    def fn(addr):  # stands for the kernel: returns its status
        statuses.append(addr)
        return 1

    assert interrupt.run(fn, lambda stop: (__import__("ctypes").c_int64 * 1)(stop)) == 1
    assert len(statuses) == 1
    assert not any(t.name == "lazytensor-kernel" for t in __import__("threading").enumerate())
