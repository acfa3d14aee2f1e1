"""Faults around kernel builds: concurrency, missing or failing compilers, fork, interrupts,
corrupted cache entries.

Each test that compiles uses a formula no other run has built (a random integer constant
baked into the kernel) and a cache directory of its own. The in-process kernel table
(``lazytensor.backends.cpu.runtime._table``) hides the disk cache from a process that has already
loaded a kernel, so cross-process behaviour is tested in subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from lazytensor.cache import KernelCache
from lazytensor.codegen import compilers
from lazytensor.codegen.compilers import CompileError

from lazytensor import Vi, Vj
from lazytensor.core import backend as backends

REPO = Path(__file__).resolve().parents[1]

X = np.linspace(-1, 1, 40)[:, None] * np.array([[1.0, 0.5, -0.25]])
Y = np.linspace(0, 2, 50)[:, None] * np.array([[0.3, -1.0, 0.7]])


def unique_constant() -> int:
    """An integer that makes a formula (and its kernel) new to every cache."""
    return 2 + int.from_bytes(os.urandom(4), "little") % 1_000_000


def formula(x, y, c):
    """``Σ_j c * exp(-|x_i - y_j|²)`` with the constant c compiled in."""
    return (-Vi(x).sqdist(Vj(y))).exp() * c


def dense(x, y, c):
    return c * np.exp(-((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)).sum(1, keepdims=True)


def run_python(code: str, env_extra: dict | None = None, timeout: float = 120, **kw):
    env = {**os.environ, **(env_extra or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=REPO,
        check=False,
        **kw,
    )


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """A new, empty cache directory for this test (the process-wide cache follows the env)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("LAZYTENSOR_CACHE_DIR", str(root))
    return root


def entries(root) -> list[dict]:
    return KernelCache(root).info()["entries"]


# ------------------------------------------------------------------ (a) concurrent builds

_WORKER = r"""
import os, sys, time
import numpy as np
from lazytensor import Vi, Vj
c, go = int(sys.argv[1]), sys.argv[2]
x = np.linspace(-1, 1, 40)[:, None] * np.array([[1.0, 0.5, -0.25]])
y = np.linspace(0, 2, 50)[:, None] * np.array([[0.3, -1.0, 0.7]])
K = (-Vi(x).sqdist(Vj(y))).exp() * c
while not os.path.exists(go):   # start together
    time.sleep(0.005)
print((K.sum(dim=1)).tobytes().hex())
"""


def test_16_processes_build_one_new_kernel_once(tmp_path):
    root, go = tmp_path / "cache", tmp_path / "go"
    c = unique_constant()
    env = {
        **os.environ,
        "LAZYTENSOR_CACHE_DIR": str(root),
        "LAZYTENSOR_DEBUG": "1",
        "PYTHONPATH": str(REPO),
        "LAZYTENSOR_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(c), str(go)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(16)
    ]
    time.sleep(1.0)  # let them import and wait at the start line
    go.touch()
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    results = {out.strip() for out, _ in outs}
    assert len(results) == 1
    got = np.frombuffer(bytes.fromhex(results.pop()), dtype=np.float64).reshape(40, 1)
    np.testing.assert_allclose(got, dense(X, Y, c), rtol=1e-12)
    builds = sum(err.count("[lazytensor] building kernel") for _, err in outs)
    assert builds == 1, f"{builds} processes compiled the kernel"
    found = entries(root)
    assert len(found) == 1 and found[0]["valid"]


def test_16_threads_build_one_new_kernel_once(fresh_cache, monkeypatch):
    c = unique_constant()
    calls = []
    real_compile = compilers.CpuCompiler.compile

    def counting_compile(self, *args, **kwargs):
        calls.append(1)
        return real_compile(self, *args, **kwargs)

    monkeypatch.setattr(compilers.CpuCompiler, "compile", counting_compile)
    barrier = threading.Barrier(16)
    results, errors = [None] * 16, []

    def work(k):
        try:
            K = formula(X, Y, c)
            barrier.wait(timeout=60)
            results[k] = K.sum(dim=1)
        except BaseException as e:  # noqa: BLE001  (reported below, in the main thread)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors, errors
    assert len(calls) == 1
    for r in results:
        np.testing.assert_array_equal(r, results[0])
    np.testing.assert_allclose(results[0], dense(X, Y, c), rtol=1e-12)
    assert len(entries(fresh_cache)) == 1


# ------------------------------------------------------------------ (b) no compiler


@pytest.fixture
def no_compiler(monkeypatch):
    missing = compilers.CpuCompiler("/nonexistent/bin/c++")
    assert not missing.available
    monkeypatch.setattr(compilers, "cpu_compiler", lambda: missing)
    monkeypatch.setattr(backends, "_warned_fallback", False)


def test_missing_compiler_backend_cpu_is_a_clear_error(no_compiler, fresh_cache):
    with pytest.raises(compilers.CompilerNotFound, match=r"no C\+\+ compiler found.*CXX"):
        formula(X, Y, unique_constant()).sum(dim=1, backend="cpu")
    assert entries(fresh_cache) == []


def test_missing_compiler_auto_falls_back_with_one_warning(no_compiler, fresh_cache):
    c = unique_constant()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        a = formula(X, Y, c).sum(dim=1)
        b = formula(X, Y, c).argmax(dim=1)  # a second reduction: no second warning
        g = formula(X.astype(np.float32), Y.astype(np.float32), c).sum(dim=0)
    fallback = [w for w in record if "compiler" in str(w.message)]
    assert len(fallback) == 1 and fallback[0].category is RuntimeWarning
    assert "falling back" in str(fallback[0].message)
    np.testing.assert_allclose(a, dense(X, Y, c), rtol=1e-12)
    np.testing.assert_array_equal(b[:, 0], np.argmax(-((X[:, None] - Y[None]) ** 2).sum(-1), 1))
    assert g.dtype == np.float32 and g.shape == (50, 1)
    assert entries(fresh_cache) == []


def test_cxx_pointing_nowhere_and_no_compiler_on_path(tmp_path):
    """A real process where $CXX names a missing file and PATH holds no compiler."""
    code = r"""
import warnings
import numpy as np
from lazytensor import Vi, Vj
from lazytensor.codegen.compilers import CompilerNotFound
x, y = np.random.rand(5, 2), np.random.rand(6, 2)
K = Vi(x).sqdist(Vj(y))
try:
    K.sum(dim=1, backend="cpu")
    raise SystemExit("backend='cpu' did not fail")
except CompilerNotFound as e:
    assert "compiler" in str(e), e
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    out = K.sum(dim=1)
    K.min(dim=1)
assert len(w) == 1 and "falling back" in str(w[0].message), [str(m.message) for m in w]
np.testing.assert_allclose(out[:, 0], ((x[:, None] - y[None]) ** 2).sum((1, 2)))
print("ok")
"""
    empty = tmp_path / "bin"
    empty.mkdir()
    proc = run_python(
        code,
        {
            "CXX": "/nonexistent/g++",
            "PATH": str(empty),
            "LAZYTENSOR_CACHE_DIR": str(tmp_path / "cache"),
        },
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


# ------------------------------------------------------------------ (c) failing compiler


def test_failing_compiler_error_shows_command_stderr_and_formula(
    tmp_path, fresh_cache, monkeypatch
):
    script = tmp_path / "broken-c++"
    script.write_text("#!/bin/sh\necho 'broken-c++: fatal error: out of cheese' >&2\nexit 1\n")
    script.chmod(0o755)
    broken = compilers.CpuCompiler(str(script))
    assert broken.available
    monkeypatch.setattr(compilers, "cpu_compiler", lambda: broken)
    # a formula no other test has loaded into this process's kernel table
    unique = int.from_bytes(os.urandom(3), "little") + 2
    for backend in ("cpu", "auto"):  # a compiler that fails is no reason to fall back
        with pytest.raises(CompileError) as info:
            ((Vi(X) - Vj(Y)).sqnorm2() + unique).sum(dim=1, backend=backend)
        message = str(info.value)
        assert str(script) in message and "-O3" in message  # the command
        assert "out of cheese" in message  # its stderr
        assert "sum of" in message and "Vi(0,3)" in message and "Vj(1,3)" in message  # the formula
    assert entries(fresh_cache) == []
    leftovers = list((fresh_cache / "tmp").iterdir()) if (fresh_cache / "tmp").exists() else []
    assert leftovers == []


# ------------------------------------------------------------------ (d) fork and workers


def _wait_child(pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError(f"the forked child hung for {timeout} s")


def test_fork_after_using_threaded_kernels(monkeypatch):
    """libgomp's threads do not survive fork: the child must not wait for them."""
    monkeypatch.setenv("LAZYTENSOR_NUM_THREADS", "2")
    rng = np.random.default_rng(0)
    x, y = rng.random((300, 3)), rng.random((400, 3))  # 120 000 pairs: threads are used
    K = (-Vi(x).sqdist(Vj(y))).exp()
    expected = K.sum(dim=1)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            again = K.sum(dim=1)  # the kernel loaded by the parent
            idx = (Vi(x) * Vj(y)).sum(-1).argKmin(3, dim=1)  # a kernel built in the child
            ok = np.allclose(again, expected, rtol=1e-12) and np.array_equal(
                idx, np.argsort(x @ y.T, axis=1, kind="stable")[:, :3]
            )
            code = 0 if ok else 2
        finally:
            os._exit(code)
    assert _wait_child(pid, 120) == 0


class _KernelDataset(torch.utils.data.Dataset):
    def __init__(self, c):
        self.c = c

    def __len__(self):
        return 6

    def __getitem__(self, k):
        x = torch.linspace(-1, 1, 30, dtype=torch.float64)[:, None] + k
        y = torch.linspace(0, 2, 20, dtype=torch.float64)[:, None]
        return (-Vi(x).sqdist(Vj(y))).exp().sum(dim=1)[:, 0] * self.c


def test_dataloader_workers_run_reductions():
    c = float(unique_constant())
    ds = _KernelDataset(c)
    ds[0]  # the parent has loaded the kernel before forking its workers
    loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, timeout=120)
    got = torch.cat(list(loader))
    expected = torch.cat([ds[k][None] for k in range(6)])
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)


def _spawned_worker(rank, out_dir, c):
    x = torch.linspace(-1, 1, 30, dtype=torch.float64)[:, None]
    y = torch.linspace(0, 2, 20, dtype=torch.float64)[:, None]
    r = ((-Vi(x).sqdist(Vj(y))).exp() * c).sum(dim=1)
    torch.save(r, os.path.join(out_dir, f"{rank}.pt"))


def test_torch_multiprocessing_spawn_worker(tmp_path):
    c = unique_constant()
    torch.multiprocessing.spawn(_spawned_worker, args=(str(tmp_path), c), nprocs=1, join=True)
    got = torch.load(tmp_path / "0.pt")
    x = torch.linspace(-1, 1, 30, dtype=torch.float64)[:, None]
    y = torch.linspace(0, 2, 20, dtype=torch.float64)[:, None]
    expected = c * torch.exp(-((x - y.T) ** 2)).sum(1, keepdim=True)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)


# ------------------------------------------------------------------ (e) interrupted build


def test_keyboard_interrupt_during_compile_leaves_nothing(fresh_cache, monkeypatch):
    c = unique_constant()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(compilers, "run_tool", interrupted)
        with pytest.raises(KeyboardInterrupt):
            formula(X, Y, c).sum(dim=1, backend="cpu")
    assert entries(fresh_cache) == []
    tmp = fresh_cache / "tmp"
    assert not tmp.exists() or list(tmp.iterdir()) == []
    got = formula(X, Y, c).sum(dim=1, backend="cpu")  # the next call builds it
    np.testing.assert_allclose(got, dense(X, Y, c), rtol=1e-12)
    found = entries(fresh_cache)
    assert len(found) == 1 and found[0]["valid"]


# ------------------------------------------------------------------ (f) corrupted entries

_CORRUPT_CHECK = r"""
import sys
import numpy as np
from lazytensor import Vi, Vj
c = int(sys.argv[1])
x = np.linspace(-1, 1, 40)[:, None] * np.array([[1.0, 0.5, -0.25]])
y = np.linspace(0, 2, 50)[:, None] * np.array([[0.3, -1.0, 0.7]])
got = ((-Vi(x).sqdist(Vj(y))).exp() * c).sum(dim=1)
want = c * np.exp(-((x[:, None, :] - y[None, :, :]) ** 2).sum(-1)).sum(1, keepdims=True)
np.testing.assert_allclose(got, want, rtol=1e-12)
print("ok")
"""


def _truncate(entry_dir: Path):
    so = entry_dir / "kernel.so"
    so.write_bytes(so.read_bytes()[: so.stat().st_size // 2])


def _garbage_meta(entry_dir: Path):
    (entry_dir / "meta.json").write_text("{ not json at all")


def _flip_byte(entry_dir: Path):
    so = entry_dir / "kernel.so"
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0x5A
    so.write_bytes(bytes(data))


def _wrong_hash_in_meta(entry_dir: Path):
    meta = json.loads((entry_dir / "meta.json").read_text())
    meta["files"]["kernel.so"]["sha256"] = "0" * 64
    (entry_dir / "meta.json").write_text(json.dumps(meta))


def test_corrupted_entries_of_a_real_kernel_are_rebuilt(tmp_path):
    root = tmp_path / "cache"
    c = str(unique_constant())
    env = {"LAZYTENSOR_CACHE_DIR": str(root), "LAZYTENSOR_DEBUG": "1"}

    def run_and_count_builds():
        proc = subprocess.run(
            [sys.executable, "-c", _CORRUPT_CHECK, c],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
            check=False,
            env={**os.environ, **env, "PYTHONPATH": str(REPO)},
        )
        assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
        return proc.stderr.count("[lazytensor] building kernel")

    assert run_and_count_builds() == 1
    assert run_and_count_builds() == 0  # a valid entry is loaded, not rebuilt
    for corrupt in (_truncate, _garbage_meta, _flip_byte, _wrong_hash_in_meta):
        (entry,) = entries(root)
        corrupt(root / entry["key"][:2] / entry["key"])
        assert not entries(root)[0]["valid"], corrupt.__name__
        assert run_and_count_builds() == 1, corrupt.__name__
        (entry,) = entries(root)
        assert entry["valid"], corrupt.__name__
