"""Attacks on the kernel cache: nobody else's code gets loaded, whatever they re-point.

Each test plays an attacker against a victim. Where the attack is a race, attacker and
victim are two processes (forked), so the victim's view of the cache is its own. Where it
needs another local user, that user's directory is simulated: the tests run as one uid
(often root, who can write anywhere), so ``safedir.owner_of`` is patched to report a
foreign uid for the directories the attacker controls. The victim must never return or
load the attacker's bytes, and must never follow a symlink out of the cache.
"""

from __future__ import annotations

import ctypes
import hashlib
import multiprocessing
import os
import shutil
import stat
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import pytest
from lazytensor.cache import CacheWarning, KernelCache, safedir

CXX = shutil.which("g++") or shutil.which("c++")
needs_cxx = pytest.mark.skipif(CXX is None, reason="no C++ compiler")

GOOD = b"\x7fELF good kernel " + bytes(range(256)) * 4
EVIL = b"\x7fELF evil kernel " + bytes(range(255, -1, -1)) * 4
FOREIGN_UID = 54321


def make_key(n: object) -> str:
    return hashlib.sha256(repr(n).encode()).hexdigest()


KEY, KEY2 = make_key("attack"), make_key("attack-2")


def writes(payload: bytes):
    def build(tmpdir: Path) -> dict:
        (tmpdir / "kernel.so").write_bytes(payload)
        return {}

    return build


def plant(directory: Path, key: str, payload: bytes) -> Path:
    """A complete, valid-looking entry for ``key`` in ``directory`` (what an attacker
    could write in a cache of their own), built by the cache code itself."""
    return KernelCache(directory).get_or_build(key, writes(payload)).parent


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` with its bytes (to show it was left untouched)."""
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file() and not p.is_symlink()}


def pretend_foreign(monkeypatch: pytest.MonkeyPatch, *paths: Path) -> None:
    """Make the owner check see ``paths`` (and symlinks at them) as another user's."""
    marked = set()
    for path in paths:
        marked.add((os.lstat(path).st_dev, os.lstat(path).st_ino))
        if path.exists():
            marked.add((os.stat(path).st_dev, os.stat(path).st_ino))
    real = safedir.owner_of

    def owner_of(info: os.stat_result) -> int:
        return FOREIGN_UID if (info.st_dev, info.st_ino) in marked else real(info)

    monkeypatch.setattr(safedir, "owner_of", owner_of)


def _fork() -> multiprocessing.context.BaseContext:
    return multiprocessing.get_context("fork")


# ------------------------------------------------------------------ re-pointed names
def _victim(root: str, to_attacker, from_attacker, results) -> None:
    """Builds KEY, lets the attacker act, then reads KEY and builds KEY2."""
    try:
        cache = KernelCache(root)
        cache.read_or_build(KEY, writes(GOOD))
        to_attacker.put("built")
        assert from_attacker.get(timeout=30) == "re-pointed"
        first = cache.read(KEY)
        second = cache.read_or_build(KEY2, writes(GOOD))
        loaded = second.load(lambda path: Path(path).read_bytes())
        results.put((first and first.data, second.data, loaded))
    except BaseException as error:  # noqa: BLE001 - reported to the parent
        results.put(repr(error))


@pytest.mark.parametrize("level", ["root", "parent"])
def test_name_re_pointed_after_the_check_is_not_followed(tmp_path: Path, level: str) -> None:
    """Attacker (another process) swaps the root, or a parent of it, for a directory
    holding planted entries for the victim's keys, after the victim checked the root."""
    real, evil = tmp_path / "real", tmp_path / "evil"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    root = link if level == "root" else link / "cache"
    if level == "parent":
        (real / "cache").mkdir(mode=0o700)
    planted = evil if level == "root" else evil / "cache"
    for key in (KEY, KEY2):
        plant(planted, key, EVIL)

    ctx = _fork()
    to_attacker, from_attacker, results = ctx.Queue(), ctx.Queue(), ctx.Queue()
    victim = ctx.Process(target=_victim, args=(str(root), to_attacker, from_attacker, results))
    victim.start()
    try:
        assert to_attacker.get(timeout=30) == "built"
        attacker = ctx.Process(target=_re_point, args=(str(link), str(evil)))
        attacker.start()
        attacker.join(30)
        assert attacker.exitcode == 0
        from_attacker.put("re-pointed")
        outcome = results.get(timeout=60)
    finally:
        victim.join(30)
        if victim.is_alive():
            victim.kill()
    assert outcome == (GOOD, GOOD, GOOD), outcome
    assert os.readlink(link) == str(evil)  # the attack did happen
    assert snapshot(planted / KEY[:2] / KEY)["kernel.so"] == EVIL  # and was not cleaned up


def _re_point(link: str, target: str) -> None:
    tmp = link + ".new"
    os.symlink(target, tmp)
    os.replace(tmp, link)


def test_root_that_is_a_symlink_to_another_users_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = tmp_path / "theirs"
    plant(theirs, KEY, EVIL)
    theirs.chmod(0o700)
    link = tmp_path / "cache"
    link.symlink_to(theirs)
    pretend_foreign(monkeypatch, theirs)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cache = KernelCache(link)
        assert cache.read(KEY) is None
    assert cache.is_fallback and any(issubclass(w.category, CacheWarning) for w in seen)
    assert "owned by uid 54321" in str(seen[0].message)


def test_symlink_owned_by_another_user_is_not_followed_to_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tmp_path / "mine"
    plant(mine, KEY, EVIL)  # "ours", but reached only through their link
    mine.chmod(0o700)
    link = tmp_path / "cache"
    link.symlink_to(mine)
    pretend_foreign(monkeypatch, link)  # lstat of the link: another user's
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cache = KernelCache(link)
        assert cache.read(KEY) is None
    assert cache.is_fallback and "symbolic link owned by uid 54321" in str(seen[0].message)


# ------------------------------------------------------------------ symlinks inside the root
def _link_prefix(root: Path, elsewhere: Path) -> None:
    (root / KEY[:2]).symlink_to(elsewhere / KEY[:2])


def _link_entry(root: Path, elsewhere: Path) -> None:
    (root / KEY[:2]).mkdir(mode=0o700)
    (root / KEY[:2] / KEY).symlink_to(elsewhere / KEY[:2] / KEY)


def _link_meta(root: Path, elsewhere: Path) -> None:
    entry = root / KEY[:2] / KEY
    entry.mkdir(parents=True, mode=0o700)
    shutil.copy(elsewhere / KEY[:2] / KEY / "kernel.so", entry / "kernel.so")
    (entry / "meta.json").symlink_to(elsewhere / KEY[:2] / KEY / "meta.json")


INSIDE = {"prefix": _link_prefix, "entry": _link_entry, "meta.json": _link_meta}


@pytest.mark.parametrize("where", sorted(INSIDE))
def test_symlink_inside_the_cache_is_refused_and_replaced(tmp_path: Path, where: str) -> None:
    """A symlink where a prefix directory, an entry or its metadata belongs: lookups
    refuse it (as info and clear skip it), a build replaces it, its target is untouched."""
    root, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    plant(elsewhere, KEY, EVIL)
    root.mkdir(mode=0o700)
    INSIDE[where](root, elsewhere)
    before = snapshot(elsewhere)
    cache = KernelCache(root)
    assert cache.read(KEY) is None and cache.lookup(KEY) is None
    assert cache.read_meta(KEY) is None
    assert [e["valid"] for e in cache.info()["entries"]] in ([], [False])
    assert cache.read_or_build(KEY, writes(GOOD)).data == GOOD
    assert cache.read(KEY).data == GOOD
    assert not (root / KEY[:2]).is_symlink() and not (root / KEY[:2] / KEY).is_symlink()
    assert snapshot(elsewhere) == before
    assert cache.clear() == 1 and snapshot(elsewhere) == before


@pytest.fixture
def precious(tmp_path: Path):
    """A directory the cache must never write into; on another file system where there is
    one (/dev/shm), so that even a file moved through a link into it and out again fails."""
    other = Path("/dev/shm")
    if other.is_dir() and os.stat(other).st_dev != os.stat(tmp_path).st_dev:
        path = Path(tempfile.mkdtemp(dir=other, prefix="lazytensor-precious-"))
    else:  # pragma: no cover - no second file system
        path = tmp_path / "precious"
        path.mkdir()
    (path / "keep.txt").write_text("do not touch")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("layout", ["tmp", "locks", "trash", "loads"])
def test_symlinked_layout_directory_is_not_written_through(
    tmp_path: Path, precious: Path, layout: str
) -> None:
    """``tmp`` (builds), ``locks``, ``trash`` (deletions) and ``loads`` (private copies)
    pointing elsewhere: nothing is created, renamed into or deleted from the target."""
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    (root / layout).symlink_to(precious)
    build_dirs = []

    def build(tmpdir: Path, payload: bytes) -> dict:
        build_dirs.append(os.path.realpath(tmpdir))
        return writes(payload)(tmpdir)

    cache = KernelCache(root)
    cache.read_or_build(KEY, lambda d: build(d, b"first"))
    (root / KEY[:2] / KEY / "kernel.so").write_bytes(b"corrupt")  # rebuilt through trash/
    binary = cache.read_or_build(KEY, lambda d: build(d, GOOD))
    assert binary.load(lambda path: Path(path).read_bytes()) == GOOD
    cache.clear()
    assert all(d.startswith(str(root.resolve()) + os.sep) for d in build_dirs), build_dirs
    assert snapshot(precious) == {"keep.txt": b"do not touch"}
    assert sorted(p.name for p in precious.iterdir()) == ["keep.txt"]


def test_lock_file_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    root, target = tmp_path / "cache", tmp_path / "target"
    (root / "locks").mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    target.write_text("precious")
    (root / "locks" / f"{KEY}.lock").symlink_to(target)
    assert KernelCache(root, lock_timeout=5).read_or_build(KEY, writes(GOOD)).data == GOOD
    assert target.read_text() == "precious"


@pytest.mark.parametrize("problem", ["foreign", "group-writable"])
def test_prefix_directory_not_private_is_refused_and_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, problem: str
) -> None:
    root = tmp_path / "cache"
    plant(root, KEY, EVIL)  # as if written by whoever could write into that directory
    prefix = root / KEY[:2]
    if problem == "foreign":
        pretend_foreign(monkeypatch, prefix)
    else:
        prefix.chmod(0o770)
    cache = KernelCache(root)
    assert cache.read(KEY) is None
    assert cache.info()["entries"] == []
    assert cache.read_or_build(KEY, writes(GOOD)).data == GOOD
    assert stat.S_IMODE((root / KEY[:2]).stat().st_mode) == 0o700


# ------------------------------------------------------------------ races on the bytes
def _swap_binary_forever(entry: str, stop: str) -> None:
    good, evil = os.path.join(entry, "good"), os.path.join(entry, "evil")
    target = os.path.join(entry, "kernel.so")
    while not os.path.exists(stop):
        for source in (evil, good):
            shutil.copy(source, target + ".tmp")
            os.replace(target + ".tmp", target)


def test_binary_swapped_between_hash_and_load_is_never_loaded(tmp_path: Path) -> None:
    """An attacker process keeps replacing the entry's binary with other bytes (a process
    that can do that is this user, but the point holds for any window): what is read
    and what is loaded are always the verified bytes, or nothing."""
    cache = KernelCache(tmp_path / "cache")
    entry = cache.get_or_build(KEY, writes(GOOD)).parent
    (entry / "good").write_bytes(GOOD)
    (entry / "evil").write_bytes(EVIL)
    stop = tmp_path / "stop"
    swapper = _fork().Process(target=_swap_binary_forever, args=(str(entry), str(stop)))
    swapper.start()
    seen = {"none": 0, "good": 0}
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            binary = cache.read(KEY)
            if binary is None:
                seen["none"] += 1
                continue
            assert binary.data == GOOD
            assert binary.load(lambda path: Path(path).read_bytes()) == GOOD
            seen["good"] += 1
    finally:
        stop.touch()
        swapper.join(10)
    assert seen["good"] > 0 and seen["none"] > 0, seen  # the race was really run


def _clear_forever(root: str, stop: str, counts) -> None:
    cache = KernelCache(root)
    cleared = 0
    while not os.path.exists(stop):
        cleared += cache.clear()
    counts.put(cleared)


@pytest.fixture(scope="module")
def tiny_library(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a real shared library with ``int which(void) { return 7; }``."""
    if CXX is None:
        pytest.skip("no C++ compiler")
    work = tmp_path_factory.mktemp("tiny")
    (work / "tiny.cpp").write_text('extern "C" int which() { return 7; }\n')
    subprocess.run([CXX, "-shared", "-fPIC", "tiny.cpp", "-o", "tiny.so"], cwd=work, check=True)
    return (work / "tiny.so").read_bytes()


def test_clear_in_another_process_between_build_and_load(tmp_path: Path, tiny_library) -> None:
    """Another process keeps clearing the cache while this one builds and dlopens
    kernels: no OSError ever reaches the caller, every load is the verified library."""
    root, stop = tmp_path / "cache", tmp_path / "stop"
    cache = KernelCache(root)
    ctx = _fork()
    counts = ctx.Queue()
    clearer = ctx.Process(target=_clear_forever, args=(str(root), str(stop), counts))
    clearer.start()
    try:
        for k in range(150):
            binary = cache.read_or_build(make_key(("clear", k)), writes(tiny_library))
            time.sleep(0.005)  # the caller's own work between the build and the load
            assert binary.data == tiny_library
            assert binary.load(ctypes.CDLL).which() == 7
    finally:
        stop.touch()
        clearer.join(30)
    assert clearer.exitcode == 0 and counts.get(timeout=5) > 0  # clears did land


@needs_cxx
def test_libraries_loaded_one_after_the_other_are_each_their_own(tmp_path: Path) -> None:
    """The loader recognises a library by the path it was opened with: loading through a
    reused name (such as /proc/self/fd/N after N was closed) would return the first."""
    cache = KernelCache(tmp_path / "cache")
    libraries = []
    for k in range(4):
        def build(tmpdir: Path, k=k) -> dict:
            (tmpdir / "k.cpp").write_text(f'extern "C" int which() {{ return {k}; }}\n')
            subprocess.run([CXX, "-shared", "-fPIC", "k.cpp", "-o", "kernel.so"], cwd=tmpdir,
                           check=True)
            return {}

        libraries.append(cache.read_or_build(make_key(("which", k)), build).load(ctypes.CDLL))
    assert [lib.which() for lib in libraries] == [0, 1, 2, 3]
    assert list((tmp_path / "cache" / "loads").iterdir()) == []  # private copies removed


def test_root_deleted_while_in_use_is_made_again(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    cache = KernelCache(root)
    assert cache.read_or_build(KEY, writes(GOOD)).data == GOOD
    shutil.rmtree(root)
    assert cache.read(KEY) is None
    assert cache.read_or_build(KEY, writes(GOOD)).data == GOOD
    assert (root / KEY[:2] / KEY / "kernel.so").read_bytes() == GOOD
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
