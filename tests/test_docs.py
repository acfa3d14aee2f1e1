"""The API reference's check: a broken reference to lazytensor's own names fails the build.

``make docs`` builds the whole reference with ``-W -n`` (CI runs it); here, small projects
with the same configuration show what that check catches and what it lets through.
"""

from __future__ import annotations

from pathlib import Path

import pytest

sphinx_build = pytest.importorskip("sphinx.cmd.build")

# sphinx's own napoleon extension uses an interface that sphinx deprecates
pytestmark = pytest.mark.filterwarnings("ignore:The mapping interface for autodoc options")

CONF = Path(__file__).resolve().parents[1] / "docs" / "conf.py"


def _build(tmp_path, body: str) -> tuple[int, str]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(f"exec(compile(open({str(CONF)!r}).read(), 'conf.py', 'exec'))\n")
    (src / "index.rst").write_text("Test\n====\n\n.. automodule:: lazytensor.solve\n"
                                   "   :members: solve\n\n" + body + "\n")
    warnings = tmp_path / "warnings.txt"
    status = sphinx_build.build_main(["-b", "html", "-W", "-n", "-q", "-w", str(warnings),
                                      str(src), str(tmp_path / "out")])
    return status, warnings.read_text()


def test_references_that_resolve_and_other_libraries_pass(tmp_path):
    status, text = _build(tmp_path, "See :func:`lazytensor.solve.solve`, :class:`numpy.ndarray` "
                                    "and :func:`torch.autograd.grad`.")
    assert status == 0, text


def test_a_broken_reference_to_lazytensor_fails(tmp_path):
    status, text = _build(tmp_path, "See :func:`lazytensor.solve.no_such_function`.")
    assert status != 0
    assert "lazytensor.solve.no_such_function" in text and "reference target not found" in text
