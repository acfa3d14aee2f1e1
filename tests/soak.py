"""The seeds of the ``rng`` fixture, and the soak run (``make soak``).

- By default every test that takes ``rng`` draws a fresh seed, printed when it fails.
- ``LAZYTENSOR_TEST_SEEDS=s1,s2,...``: every such test runs once per listed seed (test ids
  end in ``seed<s>``), in the same process, so that each kernel is compiled once for all
  the seeds. One seed replays a failure:
  ``LAZYTENSOR_TEST_SEEDS=413749726 pytest 'tests/test_x.py::test_y'``.
- ``LAZYTENSOR_SOAK=N`` (``make soak``): only the tests that take ``rng`` and put float32
  to the test are collected (see :func:`soaked`), each over N fresh seeds (or over the
  listed ones), seed after seed, and the run ends with a table: per file, the runs and
  failures; per test that failed, its failure count and its failing seeds. Stopped early
  (Ctrl-C), it prints the table of what ran: every test over the same number of seeds.

The fresh seeds of a soak are drawn when this module is first imported (by conftest.py)
and written to ``LAZYTENSOR_TEST_SEEDS``: under pytest-xdist the process that starts the
workers imports it first, so the workers inherit the same list and collect the same tests.

>>> parse_seeds("12, 413749726")
[12, 413749726]
>>> base_id("tests/test_x.py::test_y[float32-seed12]")
'tests/test_x.py::test_y[float32]'
"""

from __future__ import annotations

import functools
import inspect
import os
import re
from collections import defaultdict

import pytest

SEEDS_ENV = "LAZYTENSOR_TEST_SEEDS"
SOAK_ENV = "LAZYTENSOR_SOAK"
_DTYPES = {"float16", "bfloat16", "float32", "float64", "complex64", "complex128"}
_TORCH_DEFAULT_DTYPE = re.compile(r"torch\.(rand|randn|ones|zeros|linspace|full|empty)\(")
_SINGLE = {"float32", "complex64"}  # complex64: pairs of float32
_WIDE = re.compile(r"float64|double|complex128")
_SEED_ID = re.compile(r"-?seed\d+(?=\]$)")


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def parse_seeds(text: str) -> list[int]:
    """Seeds written as integers separated by commas or spaces, each in [0, 2**32)."""
    words = [w for w in re.split(r"[,\s]+", text.strip()) if w]
    if not words or not all(w.isdigit() and int(w) < 2**32 for w in words):
        raise pytest.UsageError(f"${SEEDS_ENV} must list seeds, integers in [0, 2**32) "
                                f"separated by commas, not {text[:80]!r}")
    return [int(w) for w in words]


def soak_count() -> int | None:
    """N of ``$LAZYTENSOR_SOAK`` (None when it is unset or empty)."""
    text = os.environ.get(SOAK_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise pytest.UsageError(f"${SOAK_ENV} must be a number of seeds (>= 1), not {text!r}")
    return int(text)


def seeds() -> list[int] | None:
    """The seeds every ``rng`` test runs over, or None for one fresh seed per test."""
    text = os.environ.get(SEEDS_ENV, "")
    return parse_seeds(text) if text.strip() else None


def draw_soak_seeds() -> None:
    """A soak without a seed list: draw its seeds once, for this process and its children."""
    count = soak_count()
    if count is not None and seeds() is None:
        os.environ[SEEDS_ENV] = ",".join(str(fresh_seed()) for _ in range(count))


def base_id(nodeid: str) -> str:
    """The test's id without its seed."""
    return _SEED_ID.sub("", nodeid).replace("[]", "")


def _dtype_name(value) -> str | None:
    """'float32' for "float32", np.float32, np.dtype("float32"), torch.float32 (and for
    complex64); the name of another floating dtype; None for a value that is not one."""
    if isinstance(value, (tuple, list)):
        names = {_dtype_name(v) for v in value} - {None}
        return "float32" if names & _SINGLE else (names.pop() if names else None)
    if isinstance(value, type):
        value = value.__name__
    text = str(value).removeprefix("torch.")
    if text not in _DTYPES:
        return None
    return "float32" if text in _SINGLE else text


@functools.lru_cache(maxsize=None)
def _source_puts_float32(function) -> bool:
    """``float32`` or ``complex64`` is written in the test's source, or it makes torch
    tensors of torch's default dtype (float32, unless its module sets float64)."""
    try:
        source = inspect.getsource(function)
        module = inspect.getsource(inspect.getmodule(function))
    except (OSError, TypeError):
        return False
    if "float32" in source or "complex64" in source:
        return True
    return (_TORCH_DEFAULT_DTYPE.search(source) is not None
            and _WIDE.search(source) is None and "set_default_dtype(torch.float64)" not in module)


def _may_be_soaked(metafunc) -> bool:
    """Whether some of the function's tests can be soaked (:func:`soaked` says which)."""
    for mark in metafunc.definition.iter_markers("parametrize"):
        values = mark.args[1] if len(mark.args) > 1 else mark.kwargs.get("argvalues", ())
        if any(_dtype_name(getattr(v, "values", v)) == "float32" for v in values):
            return True
    return _source_puts_float32(metafunc.function)


def soaked(item) -> bool:
    """A test of the soak: it takes ``rng``, and float32 is among its parameters, or, when
    none of them is a dtype, its source puts float32 to the test."""
    if "rng" not in getattr(item, "fixturenames", ()):
        return False
    callspec = getattr(item, "callspec", None)
    names = [_dtype_name(v) for v in (callspec.params.values() if callspec else ())]
    names = [n for n in names if n is not None]
    if names:
        return "float32" in names
    function = getattr(item, "function", None)
    return function is not None and _source_puts_float32(function)


class SoakPlugin:
    """Parametrizes ``rng`` over the seeds; in a soak, selects the tests and tallies them."""

    def __init__(self):
        self.seeds = seeds()
        self.soak = soak_count() is not None
        self.runs: dict = defaultdict(int)
        self.failed: dict = defaultdict(list)

    @pytest.hookimpl(trylast=True)  # after the test's own parametrize: the seed id is last
    def pytest_generate_tests(self, metafunc):
        if not self.seeds or "rng" not in metafunc.fixturenames:
            return
        if self.soak and not _may_be_soaked(metafunc):
            return  # deselected anyway: not worth 200 copies to collect
        metafunc.parametrize("rng", self.seeds, indirect=True,
                             ids=[f"seed{s}" for s in self.seeds])

    def pytest_collection_modifyitems(self, config, items):
        if not self.soak:
            return
        chosen = [soaked(item) for item in items]
        if not all(chosen):
            config.hook.pytest_deselected(items=[i for i, c in zip(items, chosen) if not c])
            items[:] = [i for i, c in zip(items, chosen) if c]
        # seed by seed: every test once, then again with the next seed, so that a soak
        # stopped early (Ctrl-C still prints the table) has covered every test evenly
        rank = {seed: k for k, seed in enumerate(self.seeds or ())}
        items.sort(key=lambda item: rank.get(_seed_of(item), 0))

    def pytest_runtest_logreport(self, report):
        if not self.soak or not (report.when == "call" or report.failed):
            return
        test = base_id(report.nodeid)
        if report.when == "call" or (report.when == "setup" and report.failed):
            self.runs[test] += 1
        if report.failed:
            seed = dict(report.user_properties).get("seed", "?")
            self.failed[test].append(seed)

    def pytest_terminal_summary(self, terminalreporter):
        if self.soak and self.runs:
            for line in soak_table(self.runs, self.failed, len(self.seeds or ())):
                terminalreporter.write_line(line)


def _seed_of(item):
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("rng") if callspec else None


def _seed_order(seed) -> int:
    return int(seed) if str(seed).isdigit() else -1


def soak_table(runs: dict, failed: dict, n_seeds: int) -> list[str]:
    """Lines: per file its tests, runs and failures; then each failing test, its count and
    its seeds."""
    files: dict = defaultdict(lambda: [0, 0, 0])
    for test, n in runs.items():
        row = files[test.split("::")[0]]
        row[0] += 1
        row[1] += n
        row[2] += len(failed.get(test, ()))
    lines = ["", f"soak: {len(runs)} tests, {sum(runs.values())} runs ({n_seeds} seeds each "
             f"planned), {sum(len(s) for s in failed.values())} failed runs in "
             f"{len(failed)} tests",
             f"{'file':44s} {'tests':>6s} {'runs':>8s} {'failed':>7s}"]
    for name, (tests, n, bad) in sorted(files.items()):
        lines.append(f"{name:44s} {tests:6d} {n:8d} {bad:7d}")
    if failed:
        lines.append(f"{'failed/runs':>12s}  test: failing seeds")
        for test, bad in sorted(failed.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"{len(bad):5d}/{runs.get(test, 0):<6d}  {test}: "
                         + ", ".join(map(str, sorted(bad, key=_seed_order))))
    return lines
