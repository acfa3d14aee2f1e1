"""The API reference's check: a reference to a lazytensor name that does not exist fails.

``make docs`` builds the whole reference with ``-W -n`` (CI runs it); here, small projects
with the same configuration show what that check catches and what it lets through.
"""

from __future__ import annotations

from pathlib import Path

import pytest

sphinx_build = pytest.importorskip("sphinx.cmd.build")

CONF = Path(__file__).resolve().parents[1] / "docs" / "conf.py"


def _build(tmp_path, body: str) -> tuple[int, str]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(f"exec(compile(open({str(CONF)!r}).read(), 'conf.py', 'exec'))\n")
    (src / "index.rst").write_text("Test\n====\n\n.. automodule:: lazytensor.api.solve\n"
                                   "   :members: solve\n\n" + body + "\n")
    warnings = tmp_path / "warnings.txt"
    status = sphinx_build.build_main(["-b", "html", "-W", "-n", "-q", "-w", str(warnings),
                                      str(src), str(tmp_path / "out")])
    return status, warnings.read_text()


def test_names_that_exist_and_other_libraries_pass(tmp_path):
    status, text = _build(tmp_path, (
        "Documented :func:`lazytensor.api.solve.solve`; existing but without a page "
        ":func:`lazytensor.codegen.ops.apply` and :mod:`codegen.parse`; relative to the "
        "module, :class:`KernelOperator`; other libraries :class:`numpy.ndarray`, "
        ":func:`torch.autograd.grad`, :class:`int`."))
    assert status == 0, text


@pytest.mark.parametrize("ref", [":func:`lazytensor.api.solve.no_such_function`",
                                 ":func:`lazytensor.codegen.ops.aply`",
                                 ":class:`NoSuchOperator`"])
def test_a_name_that_does_not_exist_fails(tmp_path, ref):
    status, text = _build(tmp_path, f"See {ref}.")
    assert status != 0
    assert ref.split("`")[1] in text and "reference target not found" in text
