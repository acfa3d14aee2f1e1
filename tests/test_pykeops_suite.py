"""pykeops 2.3's own test files, run from site-packages on lazytensor through the alias.

One pytest run in a subprocess (``tests/pykeops_alias_plugin.py`` installs
:mod:`lazytensor.compat.pykeops` and fails the run if the real pykeops gets imported),
then one test here per shipped file: every test of the file passes, except

- tests that pykeops itself marks GPU-only, which do not run on a CPU machine (reported
  as warnings with pykeops's reason);
- the known gaps in :data:`KNOWN_FAILURES` (expected failures, with the reason); one of
  them passing fails here, so that the table is kept up to date.

The tests come from the ``pykeops==2.3`` of the test extra; they are never copied here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
import xml.etree.ElementTree as ET

import pytest
from pykeops_alias_plugin import distribution_dir

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
# shipped file -> (tests that fail, why); a file-level entry covers its collection too
KNOWN_FAILURES: dict = {}

ROOT = distribution_dir()
SHIPPED = sorted(f for f in os.listdir(os.path.join(ROOT, "test"))
                 if f.startswith("test_") and f.endswith(".py")) if ROOT else []


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """{file: [(test name, outcome, message)]} of one run of the shipped tests."""
    tmp = tmp_path_factory.mktemp("pykeops-suite")
    (tmp / "pytest.ini").write_text("[pytest]\n")
    report = tmp / "report.xml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [TESTS_DIR, *filter(None, [os.environ.get("PYTHONPATH")])]), PYKEOPS_VERBOSE="0")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
         "pykeops_alias_plugin", "-c", str(tmp / "pytest.ini"), "--rootdir", str(tmp),
         "--continue-on-collection-errors", f"--junitxml={report}",
         os.path.join(ROOT, "test")],
        cwd=tmp, env=env, capture_output=True, text=True, timeout=1800)
    assert "REAL PYKEOPS IMPORTED" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode in (0, 1), (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    results: dict = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        # classname "pykeops.test.test_x[.TestCase]"; a collection error: name "test_x"
        parts = [*case.get("classname", "").split("."), case.get("name", "")]
        name = next((p + ".py" for p in parts if p + ".py" in SHIPPED), "?")
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome, message = tag, node.get("message", "")
                break
        results.setdefault(name, []).append((case.get("name"), outcome, message))
    return results


@pytest.mark.skipif(ROOT is None, reason="pykeops 2.3 is not installed (pip install -e '.[test]')")
@pytest.mark.parametrize("shipped", SHIPPED or ["none"])
def test_pykeops_shipped_file_passes_on_lazytensor(shipped, suite):
    cases = suite.get(shipped)
    assert cases, f"{shipped}: no result in the report (collected nothing?)"
    failed = [(n, m) for n, o, m in cases if o in ("failure", "error")]
    gpu_only = [(n, m) for n, o, m in cases if o == "skipped"]
    for name, why in gpu_only:
        warnings.warn(f"pykeops {shipped}::{name} not run: {why}", stacklevel=1)
    assert all("GPU" in why for _, why in gpu_only), gpu_only
    known = KNOWN_FAILURES.get(shipped)
    if known is None:
        assert not failed, f"{shipped}: {len(failed)} of {len(cases)} failed: {failed[:3]}"
        return
    passed = [n for n, o, _ in cases if o == "passed"]
    assert not passed, (f"{shipped}: {passed} pass now: remove the file from KNOWN_FAILURES in "
                        "tests/test_pykeops_suite.py")
    pytest.xfail(f"{shipped} ({len(failed)} of {len(cases)}): {known[1]}")
