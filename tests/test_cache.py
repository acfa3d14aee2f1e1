"""Tests of the kernel cache (cache/): entries, verification, locking, fallbacks.

Every fault is injected, never waited for: corrupt files are written by hand, killed
processes are killed with SIGKILL, full and read-only disks are simulated by making
``os`` calls under the cache root raise (root bypasses permission bits, so chmod
alone would not test anything when the suite runs as root).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lazytensor.cache import (
    CacheError,
    CacheWarning,
    InvalidKeyError,
    KernelCache,
    default_cache,
    location,
)
from lazytensor.cache import entry as entry_module

from lazytensor import cache

PAYLOAD = b"\x7fELF" + bytes(range(256)) * 8


def make_key(n: object) -> str:
    return hashlib.sha256(repr(n).encode()).hexdigest()


KEY = make_key("main")


class Builder:
    """A build function that records its calls and writes a source and a binary."""

    def __init__(self, payload: bytes = PAYLOAD, extra: object = None, delay: float = 0.0):
        self.payload = payload
        self.extra = {"compiler": "test-cc"} if extra is None else extra
        self.delay = delay
        self.dirs: list[Path] = []
        self._lock = threading.Lock()

    def __call__(self, tmpdir: Path) -> object:
        with self._lock:
            self.dirs.append(tmpdir)
        (tmpdir / "kernel.cpp").write_text("// generated")
        (tmpdir / "kernel.so").write_bytes(self.payload)
        time.sleep(self.delay)
        return self.extra

    @property
    def calls(self) -> int:
        return len(self.dirs)


class CountingBuild:
    """Picklable build for other processes: sleeps, then appends a line to a counter file."""

    def __init__(self, counter: str, delay: float = 0.2):
        self.counter = counter
        self.delay = delay

    def __call__(self, tmpdir: Path) -> dict:
        time.sleep(self.delay)
        with open(self.counter, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        (tmpdir / "kernel.so").write_bytes(PAYLOAD)
        return {"pid": os.getpid()}


def entry_dirs(root: Path) -> list[Path]:
    """Entry directories counted independently of KernelCache.info()."""
    return sorted(p for p in root.glob("??/*") if p.name[:2] == p.parent.name)


def leftovers(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root)) for sub in ("tmp", "trash") for p in (root / sub).glob("*")
    )


@contextlib.contextmanager
def caught_warnings():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")  # so that only the cache's own de-duplication counts
        yield seen


def cache_warnings(seen: list) -> list:
    return [w for w in seen if issubclass(w.category, CacheWarning)]


_DIR_FD_ARGS = {0: ("dir_fd", "src_dir_fd"), 1: ("dst_dir_fd",)}


def full_path(args: tuple, kwargs: dict, arg: int) -> str:
    """The path an os call reaches with its argument ``arg``: a name relative to a
    ``dir_fd``, or a descriptor itself, is resolved through /proc/self/fd."""
    target = args[arg]
    if isinstance(target, int):
        return os.readlink(f"/proc/self/fd/{target}")
    target = os.fspath(target)
    for name in _DIR_FD_ARGS.get(arg, ()):
        if kwargs.get(name) is not None and not os.path.isabs(target):
            return os.path.join(os.readlink(f"/proc/self/fd/{kwargs[name]}"), target)
    return target


def raise_under(real, prefix: Path, code: int, arg: int = 0):
    """Wrap an os function so that it fails with ``code`` for paths under ``prefix``."""
    prefix_text = str(prefix)

    def fake(*args, **kwargs):
        path = full_path(args, kwargs, arg)
        if path == prefix_text or path.startswith(prefix_text + os.sep):
            raise OSError(code, os.strerror(code), path)
        return real(*args, **kwargs)

    return fake


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache root for this test in $LAZYTENSOR_CACHE_DIR; fallbacks land in tmp_path too."""
    path = tmp_path / "cache"
    monkeypatch.setenv(cache.ENV_VAR, str(path))
    systmp = tmp_path / "systmp"
    systmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(systmp))
    return path


# --------------------------------------------------------------------------- basics
def test_miss_builds_once_then_hits(root: Path) -> None:
    kc = KernelCache()
    build = Builder()
    path = kc.get_or_build(KEY, build)
    assert path == root / KEY[:2] / KEY / "kernel.so"
    assert path.read_bytes() == PAYLOAD
    assert (path.parent / "kernel.cpp").read_text() == "// generated"
    assert kc.get_or_build(KEY, build) == path
    assert kc.lookup(KEY) == path
    assert build.calls == 1
    assert not build.dirs[0].exists()  # the temporary build directory was moved, not copied
    assert leftovers(root) == []
    meta = kc.read_meta(KEY)
    assert meta["key"] == KEY and meta["format"] == cache.FORMAT_VERSION
    assert meta["files"]["kernel.so"] == {
        "sha256": hashlib.sha256(PAYLOAD).hexdigest(),
        "size": len(PAYLOAD),
    }
    assert set(meta["files"]) == {"kernel.so", "kernel.cpp"}
    assert meta["extra"] == {"compiler": "test-cc"} and meta["binary"] == "kernel.so"
    assert abs(meta["created"] - time.time()) < 60
    assert json.loads((path.parent / "meta.json").read_text()) == meta


def test_other_binary_names_and_none_extra(root: Path) -> None:
    kc = KernelCache()

    def build(tmpdir: Path) -> None:
        (tmpdir / "obj").mkdir()
        (tmpdir / "obj" / "part.o").write_bytes(b"o")
        (tmpdir / "kernel.cubin").write_bytes(b"cubin")

    path = kc.get_or_build(KEY, build, binary="kernel.cubin")
    assert path.read_bytes() == b"cubin"
    assert kc.lookup(KEY, "kernel.cubin") == path
    assert kc.lookup(KEY) is None  # no kernel.so in this entry
    assert kc.read_meta(KEY)["extra"] == {}
    assert set(kc.read_meta(KEY)["files"]) == {"kernel.cubin", "obj/part.o"}


def test_root_is_resolved_lazily_and_created_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_umask = os.umask(0)  # without the chmod, the parents would come out 0777
    try:
        target = tmp_path / "a" / "b" / "c"
        monkeypatch.setenv(cache.ENV_VAR, str(target))
        kc = KernelCache()
        assert not (tmp_path / "a").exists()  # nothing happens before first use
        assert kc.root == target and not kc.is_fallback
        for directory in (tmp_path / "a", tmp_path / "a" / "b", target):
            assert directory.stat().st_mode & 0o777 == 0o700, directory
        kc.get_or_build(KEY, Builder())
        for sub in ("locks", "tmp", KEY[:2]):
            assert (target / sub).stat().st_mode & 0o777 == 0o700, sub
    finally:
        os.umask(old_umask)


def test_explicit_root_beats_environment(root: Path, tmp_path: Path) -> None:
    explicit = tmp_path / "explicit"
    assert KernelCache(explicit).root == explicit
    assert KernelCache(str(explicit)).root == explicit
    assert KernelCache().root == root


def test_default_cache_is_a_singleton_that_follows_the_environment(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = default_cache()
    assert default_cache() is first and first.root == root
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path / "other"))
    second = default_cache()
    assert second is not first and second.root == tmp_path / "other"
    assert default_cache() is second


def test_argument_checks(root: Path) -> None:
    with pytest.raises(ValueError):
        KernelCache(lock_timeout=-1)
    with pytest.raises(TypeError):
        KernelCache().get_or_build(KEY, "not callable")


def test_package_imports_neither_lazytensor_nor_codegen() -> None:
    code = (
        "import sys, lazytensor.cache; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('lazytensor', 'codegen', 'cache') "
        # the package's own __init__ (and its fork-safety record, lazytensor.forks)
        "and m not in ('lazytensor', 'lazytensor.lazy_exports', 'lazytensor.forks') "
        "and not m.startswith('lazytensor.cache')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])


def test_lookup_is_fast(root: Path) -> None:
    kc = KernelCache()
    kc.get_or_build(KEY, Builder(payload=os.urandom(50_000)))
    kc.lookup(KEY)
    start = time.perf_counter()
    for _ in range(200):
        assert kc.lookup(KEY) is not None
    mean = (time.perf_counter() - start) / 200
    assert mean < 2e-3, f"lookup took {mean * 1e6:.0f} us"  # typically ~50 us


# --------------------------------------------------------------------------- verification
def _rewrite_meta(change):
    def corrupt(entry_dir: Path) -> None:
        meta = json.loads((entry_dir / "meta.json").read_text())
        change(meta)
        (entry_dir / "meta.json").write_text(json.dumps(meta))

    return corrupt


def _replace_binary_by_symlink(entry_dir: Path) -> None:
    # Same bytes, so the hash would match: only refusing to follow links catches it.
    copy = entry_dir.parent / "elsewhere.so"
    shutil.copy(entry_dir / "kernel.so", copy)
    (entry_dir / "kernel.so").unlink()
    (entry_dir / "kernel.so").symlink_to(copy)


def _replace_entry_by_file(entry_dir: Path) -> None:
    shutil.rmtree(entry_dir)
    entry_dir.write_bytes(b"not a directory")


CORRUPTIONS = {
    "meta missing": lambda d: (d / "meta.json").unlink(),
    "meta garbage": lambda d: (d / "meta.json").write_bytes(b"\x00\xff{{ not json"),
    "meta empty": lambda d: (d / "meta.json").write_bytes(b""),
    "meta not a dict": lambda d: (d / "meta.json").write_text("[1, 2, 3]"),
    "meta too large": lambda d: (d / "meta.json").write_bytes(b"{}" + b" " * (2 << 20)),
    "meta a directory": lambda d: ((d / "meta.json").unlink(), (d / "meta.json").mkdir()),
    "meta wrong key": _rewrite_meta(lambda m: m.update(key=make_key("other"))),
    "meta wrong format": _rewrite_meta(lambda m: m.update(format=999)),
    "meta bad sha": _rewrite_meta(lambda m: m["files"]["kernel.so"].update(sha256="zz")),
    "meta bool size": _rewrite_meta(lambda m: m["files"]["kernel.so"].update(size=True)),
    "meta no files": _rewrite_meta(lambda m: m.pop("files")),
    "meta traversal name": _rewrite_meta(
        lambda m: m["files"].update({"../../x": m["files"]["kernel.so"]})
    ),
    "meta extra not dict": _rewrite_meta(lambda m: m.update(extra=[1])),
    "binary missing": lambda d: (d / "kernel.so").unlink(),
    "binary truncated": lambda d: (d / "kernel.so").write_bytes(PAYLOAD[:100]),
    "binary empty": lambda d: (d / "kernel.so").write_bytes(b""),
    "binary one byte changed": lambda d: (d / "kernel.so").write_bytes(PAYLOAD[:-1] + b"X"),
    "binary a symlink": _replace_binary_by_symlink,
    "binary a directory": lambda d: ((d / "kernel.so").unlink(), (d / "kernel.so").mkdir()),
    "entry a file": _replace_entry_by_file,
}


@pytest.mark.parametrize("fault", sorted(CORRUPTIONS))
def test_corrupt_entry_is_absent_and_rebuilt(root: Path, fault: str) -> None:
    kc = KernelCache()
    path = kc.get_or_build(KEY, Builder())
    CORRUPTIONS[fault](path.parent)
    assert kc.lookup(KEY) is None
    if fault.startswith(("meta", "entry")):
        assert kc.read_meta(KEY) is None
    assert [e["valid"] for e in kc.info()["entries"]] == [False]

    build = Builder(payload=b"rebuilt")
    assert kc.get_or_build(KEY, build) == path
    assert build.calls == 1
    assert path.read_bytes() == b"rebuilt" and not path.is_symlink()
    assert kc.lookup(KEY) == path
    assert entry_dirs(root) == [path.parent]
    assert leftovers(root) == []  # the corrupt entry went through trash/ and was deleted


# --------------------------------------------------------------------------- build failures
class Boom(Exception):
    pass


def test_build_exception_propagates_unchanged(root: Path) -> None:
    kc = KernelCache()
    error = Boom("compiler said no")
    seen_dir: list[Path] = []

    def build(tmpdir: Path) -> dict:
        seen_dir.append(tmpdir)
        (tmpdir / "kernel.so").write_bytes(b"partial")
        raise error

    with pytest.raises(Boom) as raised:
        kc.get_or_build(KEY, build)
    assert raised.value is error
    assert seen_dir[0].parent == root / "tmp" and not seen_dir[0].exists()
    assert entry_dirs(root) == [] and leftovers(root) == []
    assert kc.get_or_build(KEY, Builder()).read_bytes() == PAYLOAD  # the lock was released


def test_build_oserror_is_not_mistaken_for_a_full_disk(root: Path) -> None:
    error = OSError(errno.ENOSPC, "compiler ran out of space")

    def build(tmpdir: Path) -> dict:
        raise error

    with caught_warnings() as seen, pytest.raises(OSError) as raised:
        KernelCache().get_or_build(KEY, build)
    assert raised.value is error
    assert cache_warnings(seen) == [] and not KernelCache().is_fallback


def test_keyboard_interrupt_in_build_leaves_nothing(root: Path) -> None:
    kc = KernelCache()

    def build(tmpdir: Path) -> dict:
        (tmpdir / "kernel.so").write_bytes(b"half a binary")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        kc.get_or_build(KEY, build)
    assert entry_dirs(root) == [] and leftovers(root) == []
    assert kc.lookup(KEY) is None
    # Both the thread lock and the file lock were released: another thread gets through.
    result: list[Path] = []
    worker = threading.Thread(target=lambda: result.append(kc.get_or_build(KEY, Builder())))
    worker.start()
    worker.join(10)
    assert result and result[0].read_bytes() == PAYLOAD


def test_keyboard_interrupt_while_moving_into_place(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_replace = os.replace

    def interrupted(src, dst, **kwargs):
        if Path(dst).name == KEY:
            raise KeyboardInterrupt
        return real_replace(src, dst, **kwargs)

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(os, "replace", interrupted)
        KernelCache().get_or_build(KEY, Builder())
    assert entry_dirs(root) == [] and leftovers(root) == []


@pytest.mark.parametrize(
    "returned",
    [["not", "a", "dict"], "text", {"x": object()}, {"x": float("nan")}],
    ids=["list", "str", "object", "nan"],
)
def test_bad_metadata_from_build_is_refused(root: Path, returned: object) -> None:
    with pytest.raises(CacheError):
        KernelCache().get_or_build(KEY, Builder(extra=returned))
    assert entry_dirs(root) == [] and leftovers(root) == []


def _writes_symlink(tmpdir: Path) -> dict:
    (tmpdir / "kernel.so").write_bytes(b"x")
    (tmpdir / "link").symlink_to("/etc/passwd")
    return {}


def _writes_meta(tmpdir: Path) -> dict:
    (tmpdir / "kernel.so").write_bytes(b"x")
    (tmpdir / "meta.json").write_text("{}")
    return {}


def _writes_odd_name(tmpdir: Path) -> dict:
    (tmpdir / "kernel.so").write_bytes(b"x")
    (tmpdir / "with space").write_bytes(b"x")
    return {}


@pytest.mark.parametrize(
    "build",
    [lambda tmpdir: {}, _writes_symlink, _writes_meta, _writes_odd_name],
    ids=["no binary", "symlink", "own meta.json", "odd name"],
)
def test_bad_build_output_is_refused(root: Path, build) -> None:
    with pytest.raises(CacheError):
        KernelCache().get_or_build(KEY, build)
    assert entry_dirs(root) == [] and leftovers(root) == []


# --------------------------------------------------------------------------- names
BAD_KEYS = [
    "",
    "abc",
    "0" * 15,
    "0" * 129,
    "AB" * 16,
    "../" + "a" * 16,
    "a" * 16 + "/..",
    "a" * 16 + "\n",
    "\uff41" * 16,  # full-width "a": a letter, but not ASCII hex
    b"a" * 16,
    123,
    None,
]
BAD_NAMES = ["", ".", "..", "../x", "a/b", "/etc/passwd", ".hidden", "meta.json", "a\x00b"]
BAD_NAMES += ["-rf", "x" * 129, "with space"]


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_bad_keys_are_refused(root: Path, key: object) -> None:
    kc = KernelCache()
    build = Builder()
    for call in (
        lambda: kc.lookup(key),
        lambda: kc.read_meta(key),
        lambda: kc.get_or_build(key, build),
    ):
        with pytest.raises(InvalidKeyError) as raised:
            call()
        assert isinstance(raised.value, ValueError) and isinstance(raised.value, CacheError)
    assert build.calls == 0 and entry_dirs(root) == []


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_bad_binary_names_are_refused(root: Path, name: str) -> None:
    kc = KernelCache()
    build = Builder()
    with pytest.raises(InvalidKeyError):
        kc.lookup(KEY, name)
    with pytest.raises(InvalidKeyError):
        kc.get_or_build(KEY, build, binary=name)
    assert build.calls == 0


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(key=st.text(max_size=140), name=st.text(max_size=20))
def test_any_text_is_a_valid_name_or_refused(root: Path, key: str, name: str) -> None:
    kc = KernelCache()
    try:
        found = kc.lookup(key, name)
    except InvalidKeyError:
        return
    assert found is None  # nothing was ever stored
    assert all(c in "0123456789abcdef" for c in key) and 16 <= len(key) <= 128
    assert "/" not in name and not name.startswith(".") and name != "meta.json"


# --------------------------------------------------------------------------- locking
def test_stale_lock_file_does_not_block(root: Path) -> None:
    (root / "locks").mkdir(parents=True)
    (root / "locks" / f"{KEY}.lock").write_text("12345\nleft by a dead process\n")
    kc = KernelCache(lock_timeout=5)
    start = time.monotonic()
    assert kc.get_or_build(KEY, Builder()).read_bytes() == PAYLOAD
    assert time.monotonic() - start < 2


def _hold_lock_forever(root: str, key: str, started: str) -> None:
    def build(tmpdir: Path) -> dict:
        (tmpdir / "kernel.so").write_bytes(b"never finished")
        Path(started).touch()
        time.sleep(60)
        return {}

    KernelCache(root).get_or_build(key, build)


def _mp_context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def test_lock_of_a_killed_process_is_released(root: Path, tmp_path: Path) -> None:
    started = tmp_path / "started"
    holder = _mp_context().Process(target=_hold_lock_forever, args=(str(root), KEY, str(started)))
    holder.start()
    try:
        deadline = time.monotonic() + 20
        while not started.exists():
            assert holder.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        # While the holder lives, the lock really is held.
        with pytest.raises(CacheError, match="held"):
            KernelCache(root, lock_timeout=0.2).get_or_build(KEY, Builder())
        assert len(leftovers(root)) == 1  # the holder's build directory
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(10)
    assert holder.exitcode == -signal.SIGKILL
    build = Builder()
    start = time.monotonic()
    path = KernelCache(root, lock_timeout=5).get_or_build(KEY, build)
    assert time.monotonic() - start < 2
    assert build.calls == 1 and path.read_bytes() == PAYLOAD
    assert leftovers(root) == []  # the dead holder's build directory was cleaned up


def _race_for_key(root: str, key: str, counter: str, barrier, results) -> None:
    try:
        barrier.wait(30)
        path = KernelCache(root, lock_timeout=30).get_or_build(key, CountingBuild(counter))
        results.put(str(path))
    except BaseException as error:  # noqa: BLE001 - the parent must hear of it, not time out
        results.put(f"{type(error).__name__}: {error}")


def test_many_processes_build_once(root: Path, tmp_path: Path) -> None:
    ctx = _mp_context()
    counter = tmp_path / "counter"
    barrier = ctx.Barrier(16)
    results = ctx.Queue()
    workers = [
        ctx.Process(target=_race_for_key, args=(str(root), KEY, str(counter), barrier, results))
        for _ in range(16)
    ]
    for worker in workers:
        worker.start()
    paths = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(30)
    assert [worker.exitcode for worker in workers] == [0] * 16
    assert len(counter.read_text().splitlines()) == 1
    assert set(paths) == {str(root / KEY[:2] / KEY / "kernel.so")}
    assert len(entry_dirs(root)) == 1 and leftovers(root) == []
    assert KernelCache(root).info()["num_entries"] == 1


def test_many_threads_build_once(root: Path) -> None:
    shared = KernelCache()
    build = Builder(delay=0.2)
    barrier = threading.Barrier(16)

    def race(index: int) -> Path:
        barrier.wait(10)
        # Half share one instance, half bring their own: both must serialise.
        kc = shared if index % 2 else KernelCache()
        return kc.get_or_build(KEY, build)

    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(race, i) for i in range(16)]
        paths = [future.result(timeout=30) for future in futures]  # re-raises a thread's error
    assert build.calls == 1 and len(set(paths)) == 1
    assert len(entry_dirs(root)) == 1


def test_lock_timeout_between_threads(root: Path) -> None:
    release = threading.Event()
    entered = threading.Event()

    def slow(tmpdir: Path) -> dict:
        entered.set()
        release.wait(10)
        (tmpdir / "kernel.so").write_bytes(b"slow")
        return {}

    worker = threading.Thread(target=lambda: KernelCache().get_or_build(KEY, slow))
    worker.start()
    try:
        assert entered.wait(10)
        with pytest.raises(CacheError, match="locked"):
            KernelCache(lock_timeout=0.1).get_or_build(KEY, Builder())
    finally:
        release.set()
        worker.join(10)
    assert KernelCache().lookup(KEY).read_bytes() == b"slow"


def test_nested_builds(root: Path) -> None:
    kc = KernelCache()
    inner_key = make_key("inner")

    def outer(tmpdir: Path) -> dict:
        inner = kc.get_or_build(inner_key, Builder(payload=b"inner"))  # another key: fine
        (tmpdir / "kernel.so").write_bytes(b"outer")
        return {"inner": str(inner)}

    def recursive(tmpdir: Path) -> dict:
        return {"path": str(kc.get_or_build(tmpdir.name.split(".")[0], Builder()))}

    assert kc.get_or_build(KEY, outer).read_bytes() == b"outer"
    assert kc.lookup(inner_key).read_bytes() == b"inner"
    with pytest.raises(CacheError, match="same key"):
        kc.get_or_build(make_key("recursive"), recursive)
    assert kc.lookup(make_key("recursive")) is None


# --------------------------------------------------------------------------- fallbacks
def _assert_fell_back(kc: KernelCache, requested: Path, seen: list, reason: str) -> None:
    warned = cache_warnings(seen)
    assert len(warned) == 1, [str(w.message) for w in warned]
    assert str(requested) in str(warned[0].message) and reason in str(warned[0].message)
    assert warned[0].filename == __file__  # points at the caller, not into the cache package
    assert kc.is_fallback and kc.root != requested
    assert kc.root.name.startswith(location.FALLBACK_PREFIX)
    assert kc.root.parent == Path(tempfile.gettempdir())
    assert kc.root.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o720])
def test_group_or_world_writable_root_is_refused(root: Path, mode: int) -> None:
    root.mkdir()
    root.chmod(mode)
    with caught_warnings() as seen:
        kc = KernelCache()
        path = kc.get_or_build(KEY, Builder())
        again = KernelCache()  # same root, same process: no second warning, same fallback
        assert again.lookup(KEY) == path
    _assert_fell_back(kc, root, seen, "writable")
    assert again.root == kc.root
    assert list(root.iterdir()) == []  # nothing was written into the refused root


def test_root_owned_by_someone_else_is_refused(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root.mkdir(mode=0o700)
    with monkeypatch.context() as patch, caught_warnings() as seen:
        if os.geteuid() == 0:
            os.chown(root, 65534, 65534)
        else:  # cannot give a directory away: pretend to be someone else instead
            real = os.geteuid()
            patch.setattr(location.os, "geteuid", lambda: real + 1)
        kc = KernelCache()
        assert kc.root.is_dir()
    _assert_fell_back(kc, root, seen, "owned by uid")
    assert kc.get_or_build(KEY, Builder()).is_relative_to(kc.root)


def test_created_parents_are_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the chmod of the parents it creates, umask 0 leaves them world-writable.
    systmp = tmp_path / "systmp"
    systmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(systmp))
    requested = tmp_path / "new" / "cache"
    monkeypatch.setattr(location.os, "chmod", lambda *args, **kwargs: None)
    old_umask = os.umask(0)
    try:
        with caught_warnings() as seen:
            kc = KernelCache(requested)
            assert kc.root.is_dir()
    finally:
        os.umask(old_umask)
    _assert_fell_back(kc, requested, seen, f"its parent {tmp_path / 'new'}")


def test_root_that_cannot_be_created(root: Path, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    requested = tmp_path / "a-file" / "cache"
    with caught_warnings() as seen:
        kc = KernelCache(requested)
        path = kc.get_or_build(KEY, Builder())
    _assert_fell_back(kc, requested, seen, "cannot be created")
    assert path.read_bytes() == PAYLOAD


def test_read_only_root(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root.mkdir(mode=0o700)
    build = Builder()
    with monkeypatch.context() as patch, caught_warnings() as seen:
        patch.setattr(os, "mkdir", raise_under(os.mkdir, root, errno.EROFS))
        patch.setattr(os, "open", raise_under(os.open, root, errno.EROFS))
        kc = KernelCache()
        path = kc.get_or_build(KEY, build)
        assert KernelCache().get_or_build(KEY, build) == path  # shares the fallback
    _assert_fell_back(kc, root, seen, "Read-only file system")
    assert build.calls == 1 and path.read_bytes() == PAYLOAD
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_write_failure_after_build_retries_in_fallback(
    root: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    monkeypatch.setattr(
        entry_module, "write_meta", raise_under(entry_module.write_meta, root, code)
    )
    build = Builder()
    with caught_warnings() as seen:
        kc = KernelCache()
        path = kc.get_or_build(KEY, build)
    _assert_fell_back(kc, root, seen, os.strerror(code))
    assert build.calls == 2  # once in the full root, once in the fallback
    assert path.read_bytes() == PAYLOAD and kc.lookup(KEY) == path
    assert entry_dirs(root) == [] and leftovers(root) == []


def test_rename_failure_retries_in_fallback(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build = Builder()
    with monkeypatch.context() as patch, caught_warnings() as seen:
        patch.setattr(os, "replace", raise_under(os.replace, root, errno.EACCES, arg=1))
        kc = KernelCache()
        path = kc.get_or_build(KEY, build)
    _assert_fell_back(kc, root, seen, "Permission denied")
    assert build.calls == 2 and path.read_bytes() == PAYLOAD
    assert entry_dirs(root) == [] and leftovers(root) == []


def test_fallback_that_fails_too_raises(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def always_full(entry_dir, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(entry_module, "write_meta", always_full)
    build = Builder()
    with caught_warnings() as seen, pytest.raises(CacheError, match="No space left"):
        KernelCache().get_or_build(KEY, build)
    assert len(cache_warnings(seen)) == 1 and build.calls == 2
    assert all(not d.exists() for d in build.dirs)


# --------------------------------------------------------------------------- info / clear
def test_info_and_clear(root: Path) -> None:
    kc = KernelCache()
    keys = [make_key(i) for i in range(3)]
    long_text = "x" * 500
    for i, key in enumerate(keys):
        kc.get_or_build(key, Builder(payload=bytes(100 * (i + 1)), extra={"note": long_text}))
    (kc.lookup(keys[2])).write_bytes(b"tampered")
    (root / "tmp" / f"{keys[0]}.leftover").mkdir()  # as if a builder had been killed

    info = kc.info()
    assert info["root"] == str(root) and info["fallback"] is False
    assert info["num_entries"] == 3 and [e["key"] for e in info["entries"]] == sorted(keys)
    expected = sum(f.stat().st_size for d in entry_dirs(root) for f in d.rglob("*"))
    assert info["total_bytes"] == expected
    by_key = {e["key"]: e for e in info["entries"]}
    assert [by_key[k]["valid"] for k in keys] == [True, True, False]
    assert all(len(e["extra"]["note"]) <= 80 for e in info["entries"])
    assert by_key[keys[0]]["binary"] == "kernel.so" and by_key[keys[0]]["created"] > 0
    json.dumps(info)  # printable by a command-line tool

    assert kc.clear() == 3
    assert entry_dirs(root) == [] and leftovers(root) == []
    assert all(kc.lookup(key) is None for key in keys)
    assert kc.info()["num_entries"] == 0 and kc.clear() == 0
    assert kc.get_or_build(keys[0], Builder()).read_bytes() == PAYLOAD  # usable after clear
