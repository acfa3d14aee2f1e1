"""The tutorials are saved with their outputs, and the runner that executes them works.

Executing every notebook takes minutes: ``make tutorials`` does it (CI runs it after the
test suite). Here: the saved notebooks are complete (every code cell executed, in order,
no error output, figures present), and the runner fails on an error cell, runs in a clean
state and tidies what it saves.
"""

from __future__ import annotations

import os

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from tools import tutorials  # noqa: E402

EXPECTED = ["01_getting_started", "02_kernel_regression", "03_knn_digits", "04_kmeans_gmm",
            "05_optimal_transport", "06_gradients", "07_attention_and_ranges", "08_your_own_formulas",
            "09_gpu", "10_fast_sums"]


def test_the_tutorials_are_there():
    assert [p.stem for p in tutorials.notebooks()] == EXPECTED


@pytest.mark.parametrize("path", tutorials.notebooks(), ids=lambda p: p.stem)
def test_saved_with_outputs_and_figures(path):
    assert tutorials.problems(nbformat.read(path, as_version=4)) == []


def test_problems_finds_unexecuted_reordered_and_failed_cells():
    nb = tutorials.new_notebook(["a = 1", "b = 2", "c = 3"])
    assert tutorials.problems(nb)[0] == "cell 1 was not executed (no execution count)"
    for k, cell in enumerate(nb.cells):
        cell.execution_count = [1, 3, 2][k]
    assert "ran as number 3, not 2" in tutorials.problems(nb)[0]
    for k, cell in enumerate(nb.cells):
        cell.execution_count = k + 1
    assert tutorials.problems(nb) == ["no figure in the saved outputs"]
    nb.cells[1].outputs = [nbformat.v4.new_output("error", ename="ValueError", evalue="boom",
                                                  traceback=[])]
    assert tutorials.problems(nb) == ["cell 2 has an error output: ValueError: boom"]


def test_the_runner_stops_at_an_error_cell(tmp_path):
    nb = tutorials.new_notebook(["x = 1", "raise ValueError('boom')", "y = 2"])
    with pytest.raises(Exception, match="boom"):
        tutorials.execute(nb, tmp_path, timeout=120)
    assert nb.cells[2].get("execution_count") is None


def test_the_runner_starts_clean_and_cleans_up(tmp_path):
    pytest.importorskip("matplotlib")
    nb = tutorials.new_notebook([
        "import os, tempfile\n"
        "print(os.environ['LAZYTENSOR_CACHE_DIR'])\nprint(tempfile.gettempdir())\nprint(os.getcwd())",
        "import matplotlib.pyplot as plt\nplt.plot([0, 1], [1, 0])\nplt.show()",
    ])
    tutorials.execute(nb, tmp_path, timeout=120)
    cache, temp, cwd = nb.cells[0].outputs[0]["text"].split()
    assert cache != os.environ.get("LAZYTENSOR_CACHE_DIR") and cache.startswith(temp)
    assert not os.path.exists(temp)  # removed with everything in it
    assert os.path.realpath(cwd) == os.path.realpath(tmp_path)
    assert tutorials.problems(nb) == []  # executed in order, and the figure was captured


def test_tidy_keeps_what_a_terminal_shows():
    nb = tutorials.new_notebook(["pass"])
    nb.cells[0].outputs = [
        nbformat.v4.new_output("stream", name="stderr", text="solve: 1it\rsolve: 2it"),
        nbformat.v4.new_output("stream", name="stderr", text="\rsolve: 3it, done\n"),
        nbformat.v4.new_output("stream", name="stdout", text="result\r\n"),
    ]
    outputs = tutorials.tidy(nb).cells[0].outputs
    assert [(o["name"], o["text"]) for o in outputs] == [("stderr", "solve: 3it, done\n"),
                                                         ("stdout", "result\n")]
