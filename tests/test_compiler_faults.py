"""Injected compiler faults, through ``$CXX``: each is contained and reported clearly.

A fake compiler (a Python script named by ``$CXX``) wraps the real one and misbehaves:
it exits 0 after writing a truncated, garbage or crashing library, writes nothing or a
symlink, hangs, ignores SIGTERM, leaves children behind, prints warnings. ``$CXX`` also
names missing programs and commands with arguments. A fault that could crash the
process that loads the result runs in a subprocess, so that a crash fails the test
instead of killing the suite. No broken library may reach the cache.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from lazytensor.cache import KernelCache
from lazytensor.codegen import compilers
from lazytensor.codegen.compilers import CompileError, CompilerNotFound, CompilerWarning

from lazytensor import Vi, Vj

REPO = Path(__file__).resolve().parents[1]
REAL_CXX = shutil.which("g++") or shutil.which("c++")
pytestmark = pytest.mark.skipif(REAL_CXX is None, reason="no C++ compiler")

X = np.linspace(-1, 1, 40)[:, None] * np.array([[1.0, 0.5, -0.25]])
Y = np.linspace(0, 2, 50)[:, None] * np.array([[0.3, -1.0, 0.7]])

_FAKE = r'''#!{python}
import os, signal, subprocess, sys, time
MODE, REAL, PIDS, BOOM = {mode!r}, {real!r}, {pids!r}, {boom!r}

def note(pid):
    with open(PIDS, "a") as f:
        f.write(f"{{pid}}\n")

note(os.getpid())
args = sys.argv[1:]
out = args[args.index("-o") + 1]
if MODE == "hang":
    time.sleep(1000)
if MODE == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(["sleep", "1000"])  # SIG_IGN is inherited
    note(child.pid)
    time.sleep(1000)
if MODE == "hang-child":
    child = subprocess.Popen(["sleep", "1000"])
    note(child.pid)
    child.wait()
if MODE == "garbage":
    open(out, "wb").write(os.urandom(30000))
    sys.exit(0)
if MODE == "no-output":
    sys.exit(0)
if MODE == "symlink-output":
    os.symlink(REAL, out)
    sys.exit(0)
if MODE == "crash-on-load":
    args.append(BOOM)
code = subprocess.call([REAL, *args])
if code:
    sys.exit(code)
data = open(out, "rb").read()
if MODE == "truncate-half":
    open(out, "wb").write(data[: len(data) // 2])
if MODE == "header-only":
    open(out, "wb").write(data[:64])
if MODE == "warn":
    print("kernel.cpp:1:1: warning: the moon is in the wrong phase", file=sys.stderr)
if MODE == "leave-child":
    note(subprocess.Popen(["sleep", "1000"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).pid)
'''

# A library whose loading kills the loader, as a truncated mapping does (SIGBUS).
_BOOM = ('#include <csignal>\n'
         '__attribute__((constructor)) static void lt_boom() { std::raise(SIGBUS); }\n')


def fake_compiler(tmp_path: Path, mode: str) -> tuple[str, Path]:
    """A ``$CXX`` that misbehaves as ``mode``; returns it and the file of pids it started."""
    boom = tmp_path / "boom.cpp"
    boom.write_text(_BOOM)
    script = tmp_path / f"fake-c++-{mode}"
    pids = tmp_path / f"pids-{mode}"
    script.write_text(_FAKE.format(python=sys.executable, mode=mode, real=REAL_CXX,
                                   pids=str(pids), boom=str(boom)))
    script.chmod(0o755)
    return str(script), pids


def started(pids: Path) -> list[int]:
    return [int(line) for line in pids.read_text().split()] if pids.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its parent is gone too
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture(autouse=True)
def _no_fake_compiler_survives(tmp_path: Path):
    """Whatever a test asserts, no process a fake compiler started outlives it."""
    yield
    for pids in tmp_path.glob("pids-*"):
        for pid in started(pids):
            with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


def unique() -> int:
    return 2 + int.from_bytes(os.urandom(4), "little") % 1_000_000


_BUILD = r"""
import sys
import numpy as np
from lazytensor import Vi, Vj
from lazytensor.codegen.compilers import CompileError
c = float(sys.argv[1])
x = np.linspace(-1, 1, 40)[:, None] * np.array([[1.0, 0.5, -0.25]])
y = np.linspace(0, 2, 50)[:, None] * np.array([[0.3, -1.0, 0.7]])
try:
    got = ((-Vi(x).sqdist(Vj(y))).exp() * c).sum(dim=1, backend="cpu")
except Exception as e:
    print("ERROR", type(e).__name__, str(e).replace("\n", " | ")[-3000:])
    raise SystemExit(3)
want = c * np.exp(-((x[:, None] - y[None]) ** 2).sum(-1)).sum(1, keepdims=True)
np.testing.assert_allclose(got, want, rtol=1e-12)
print("OK")
"""


def build_in_subprocess(env: dict, c: int, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _BUILD, str(c)], capture_output=True, text=True, cwd=REPO,
        timeout=timeout, check=False, env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )


def entries(root: Path) -> list[dict]:
    return KernelCache(root).info()["entries"]


@pytest.fixture
def use_cxx(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """In this process: a fresh compiler object from ``$CXX`` and a fresh cache."""
    monkeypatch.setenv("LAZYTENSOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(compilers, "cpu_compiler", functools.cache(compilers.CpuCompiler))

    def use(command: str) -> compilers.CpuCompiler:
        monkeypatch.setenv("CXX", command)
        compilers.cpu_compiler.cache_clear()
        return compilers.cpu_compiler()

    return use


# ------------------------------------------------------------------ broken output
@pytest.mark.parametrize("mode", ["truncate-half", "header-only", "garbage", "crash-on-load",
                                  "no-output", "symlink-output"])
def test_compiler_that_exits_0_with_a_broken_library_is_not_cached(tmp_path: Path, mode: str):
    """Two processes in turn: each gets a clear CompileError, none dies (SIGBUS, SIGSEGV),
    nothing broken is cached for the next one to load."""
    cxx, _ = fake_compiler(tmp_path, mode)
    root = tmp_path / "cache"
    env = {"CXX": cxx, "LAZYTENSOR_CACHE_DIR": str(root)}
    c = unique()
    for _ in range(2):
        proc = build_in_subprocess(env, c)
        assert proc.returncode == 3, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
        assert "ERROR CompileError" in proc.stdout
        assert "does not load" in proc.stdout or "not cached" in proc.stdout
        assert entries(root) == []
    # The real compiler (another identity, another key) builds the same formula fine.
    assert build_in_subprocess({"LAZYTENSOR_CACHE_DIR": str(root)}, c).stdout.strip() == "OK"


# ------------------------------------------------------------------ hung compilers
@pytest.mark.parametrize("mode", ["hang", "ignore-term", "hang-child"])
def test_hung_compiler_times_out_and_its_process_group_is_killed(
    tmp_path: Path, use_cxx, monkeypatch: pytest.MonkeyPatch, mode: str
):
    cxx, pids = fake_compiler(tmp_path, mode)
    use_cxx(cxx)
    monkeypatch.setenv("LAZYTENSOR_COMPILE_TIMEOUT", "1.5")
    start = time.monotonic()
    with pytest.raises(compilers.CompileTimeout, match=r"within 1\.5 s.*LAZYTENSOR_COMPILE_TIMEOUT"):
        ((-Vi(X).sqdist(Vj(Y))).exp() * unique()).sum(dim=1, backend="cpu")
    assert time.monotonic() - start < 15
    assert started(pids) and not any(alive(pid) for pid in started(pids))
    assert entries(tmp_path / "cache") == []


def test_compiler_children_left_behind_are_killed(tmp_path: Path, use_cxx):
    cxx, pids = fake_compiler(tmp_path, "leave-child")
    use_cxx(cxx)
    c = unique()
    got = ((-Vi(X).sqdist(Vj(Y))).exp() * c).sum(dim=1, backend="cpu")
    np.testing.assert_allclose(got, c * np.exp(-((X[:, None] - Y[None]) ** 2).sum(-1)).sum(
        1, keepdims=True), rtol=1e-12)
    assert len(started(pids)) == 2 and not any(alive(pid) for pid in started(pids))


_INTERRUPTED = r"""
import signal, sys
# Ctrl-C as at a terminal, even when this test runs with SIGINT ignored (a background job)
signal.signal(signal.SIGINT, signal.default_int_handler)
from lazytensor import Vi, Vj
import numpy as np
x = np.random.rand(5, 2)
try:
    (Vi(x).sqdist(Vj(x)) * float(sys.argv[1])).sum(dim=1, backend="cpu")
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
    raise SystemExit(5)
"""


def test_ctrl_c_during_compile_kills_the_compiler_and_its_children(tmp_path: Path):
    cxx, pids = fake_compiler(tmp_path, "hang-child")
    proc = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTED, str(unique())], cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO), "CXX": cxx,
             "LAZYTENSOR_CACHE_DIR": str(tmp_path / "cache")},
    )
    try:
        deadline = time.monotonic() + 60
        while len(started(pids)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 5 and "INTERRUPTED" in out, err[-2000:]
    time.sleep(0.2)
    survivors = [pid for pid in started(pids) if alive(pid)]
    for pid in survivors:  # do not leave them running when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not survivors
    assert entries(tmp_path / "cache") == []


_WAITER = r"""
import sys, time
import numpy as np
from lazytensor import Vi, Vj
x = np.random.rand(5, 2)
start = time.monotonic()
try:
    (Vi(x).sqdist(Vj(x)) * float(sys.argv[1])).sum(dim=1, backend="cpu")
except Exception as e:
    print(type(e).__name__, round(time.monotonic() - start, 1), str(e).replace("\n", " | ")[:600])
"""


def test_processes_waiting_for_a_hung_build_fail_after_the_compile_timeout(tmp_path: Path):
    """Three processes want the same new kernel; the compiler hangs. The one compiling
    times out; the others, waiting on its lock, report its failure instead of waiting
    (the old wait was 600 s) or compiling again."""
    cxx, pids = fake_compiler(tmp_path, "hang")
    env = {**os.environ, "PYTHONPATH": str(REPO), "CXX": cxx, "LAZYTENSOR_COMPILE_TIMEOUT": "3",
           "LAZYTENSOR_CACHE_DIR": str(tmp_path / "cache")}
    c = str(unique())
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", _WAITER, c], cwd=REPO, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
        for pid in started(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert time.monotonic() - start < 60
    kinds = sorted(out.split()[0] for out in outs if out.strip())
    assert kinds == ["CacheError", "CacheError", "CompileTimeout"], outs
    assert all("did not finish within 3 s" in out for out in outs), outs
    assert len(started(pids)) == 1  # compiled once, not once per process


# ------------------------------------------------------------------ $CXX
@pytest.mark.parametrize("cxx", ["/nonexistent/g++", "no-such-compiler-xyz", "g++ '"])
def test_cxx_naming_nothing_runnable_is_refused_not_replaced(use_cxx, cxx: str):
    compiler = use_cxx(cxx)
    assert not compiler.available and "$CXX" in compiler.problem
    with pytest.raises(CompilerNotFound, match=r"\$CXX"):
        ((-Vi(X).sqdist(Vj(Y))).exp() * unique()).sum(dim=1, backend="cpu")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        from lazytensor.core import backend

        backend._warned_fallback = False
        c = unique()
        got = ((-Vi(X).sqdist(Vj(Y))).exp() * c).sum(dim=1)  # auto: the reference, loudly
    assert any("$CXX" in str(w.message) and "falling back" in str(w.message) for w in seen)
    np.testing.assert_allclose(got, c * np.exp(-((X[:, None] - Y[None]) ** 2).sum(-1)).sum(
        1, keepdims=True), rtol=1e-12)


def test_cxx_may_be_a_command_with_arguments(tmp_path: Path, use_cxx):
    """``CXX="ccache g++"``: a wrapper that gets the real compiler as its first argument."""
    log = tmp_path / "wrapper.log"
    wrapper = tmp_path / "ccache"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexec "$@"\n')
    wrapper.chmod(0o755)
    compiler = use_cxx(f"{wrapper} g++")
    assert compiler.available and compiler.argv[1] == "g++"
    c = unique()
    got = ((-Vi(X).sqdist(Vj(Y))).exp() * c).sum(dim=1, backend="cpu")
    np.testing.assert_allclose(got, c * np.exp(-((X[:, None] - Y[None]) ** 2).sum(-1)).sum(
        1, keepdims=True), rtol=1e-12)
    assert log.read_text().startswith("g++ ")
    assert str(wrapper) in compiler.identity()["command"]


# ------------------------------------------------------------------ environment
def test_environment_the_compiler_reads_is_part_of_the_key(tmp_path: Path):
    include = tmp_path / "include"
    include.mkdir()
    root = tmp_path / "cache"
    c = unique()

    def builds(extra: dict) -> int:
        proc = subprocess.run(
            [sys.executable, "-c", _BUILD, str(c)], capture_output=True, text=True, cwd=REPO,
            timeout=120, check=False,
            env={**{k: v for k, v in os.environ.items() if k not in ("CPATH", "LIBRARY_PATH")},
                 "PYTHONPATH": str(REPO), "LAZYTENSOR_CACHE_DIR": str(root),
                 "LAZYTENSOR_DEBUG": "1", **extra},
        )
        assert proc.stdout.strip() == "OK", proc.stdout + proc.stderr[-2000:]
        return proc.stderr.count("[lazytensor] building kernel")

    assert builds({}) == 1
    assert builds({"CPATH": str(include)}) == 1  # another include path: another binary
    assert builds({"CPLUS_INCLUDE_PATH": str(include)}) == 1
    assert builds({"LIBRARY_PATH": str(include)}) == 1
    assert builds({"CPATH": str(include)}) == 0  # and each is found again
    assert builds({}) == 0


def test_unusable_tmpdir_does_not_break_builds(tmp_path: Path):
    """g++ writes its temporary files under $TMPDIR; the build gives it its own."""
    for tmpdir in ("/proc", str(tmp_path / "missing")):
        proc = build_in_subprocess({"TMPDIR": tmpdir, "LAZYTENSOR_CACHE_DIR": str(tmp_path / "c")},
                                   unique())
        assert proc.stdout.strip() == "OK", (tmpdir, proc.stdout, proc.stderr[-2000:])


# ------------------------------------------------------------------ warnings
def test_compiler_warnings_are_shown(tmp_path: Path, use_cxx):
    cxx, _ = fake_compiler(tmp_path, "warn")
    use_cxx(cxx)
    with pytest.warns(CompilerWarning, match="the moon is in the wrong phase"):
        ((-Vi(X).sqdist(Vj(Y))).exp() * unique()).sum(dim=1, backend="cpu")


def test_literal_out_of_range_is_a_compile_error_and_others_are_warnings(tmp_path: Path):
    compiler = compilers.CpuCompiler(REAL_CXX)
    (tmp_path / "a").mkdir(mode=0o700)
    with pytest.raises(CompileError, match="overflow"):
        compiler.compile('extern "C" float f() { return 1e39F; }', tmp_path / "a", what="f")
    (tmp_path / "b").mkdir(mode=0o700)
    with pytest.warns(CompilerWarning, match="too large"):
        compiler.compile('extern "C" double g() { return 100000000000000000000; }',
                         tmp_path / "b", what="g")


def test_compile_refuses_a_directory_others_can_write(tmp_path: Path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PermissionError, match="writable by others"):
        compilers.CpuCompiler(REAL_CXX).compile("int f() { return 1; }", shared)


def test_bad_compile_timeout_setting_is_a_clear_error(monkeypatch: pytest.MonkeyPatch):
    for bad in ("soon", "-1", "0", "inf"):
        monkeypatch.setenv("LAZYTENSOR_COMPILE_TIMEOUT", bad)
        with pytest.raises(ValueError, match="LAZYTENSOR_COMPILE_TIMEOUT"):
            compilers.compile_timeout()
    monkeypatch.setenv("LAZYTENSOR_COMPILE_TIMEOUT", "42")
    assert compilers.compile_timeout() == 42 and compilers.build_lock_timeout() == 84


def test_elf_check_finds_every_cut(tmp_path: Path):
    """Cut a real library at every 1/64 of its length: the check refuses each prefix."""
    (tmp_path / "w").mkdir(mode=0o700)
    library = compilers.CpuCompiler(REAL_CXX).compile('extern "C" int f() { return 1; }',
                                                       tmp_path / "w").read_bytes()
    assert compilers.elf_problem(library, compilers.ET_DYN) is None
    for k in range(64):
        cut = library[: len(library) * k // 64]
        assert compilers.elf_problem(cut, compilers.ET_DYN) is not None, k
    assert json.dumps(compilers.CpuCompiler(REAL_CXX).identity())  # printable


def test_load_check_survives_a_library_that_kills_its_loader(tmp_path: Path):
    work = tmp_path / "w"
    work.mkdir(mode=0o700)
    source = textwrap.dedent(_BOOM) + 'extern "C" int f() { return 1; }\n'
    with pytest.raises(CompileError, match="does not load"):
        compilers.CpuCompiler(REAL_CXX).compile(source, work, what="a library that crashes")
