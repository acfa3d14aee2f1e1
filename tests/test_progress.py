"""Progress on long work: solver iterations with verbose=True, compile notices on the logger."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from lazytensor import KernelSolve, Vi, Vj
from lazytensor.core import progress


def _system(rng, n=300):
    x = rng.random((n, 2))
    b = rng.standard_normal((n, 2))
    K = (-Vi(x).sqdist(Vj(x)) * 20).exp()
    dense = np.exp(-((x[:, None] - x[None]) ** 2).sum(-1) * 20)
    return K, b, dense


def test_verbose_solve_prints_plain_lines_without_tqdm(rng, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    K, b, dense = _system(rng)
    x = K.solve(b, alpha=0.5, eps=1e-8, verbose=True)
    ref = np.linalg.solve(dense + 0.5 * np.eye(len(b)), b)
    # CG stops on the residual's norm: compare at the solution's scale
    np.testing.assert_allclose(x, ref, rtol=0, atol=1e-6 * np.abs(ref).max())
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("solve: iteration 1, relative residual ")
    last = err[-1]
    assert last.startswith("solve: converged after ") and "(target 1e-08)" in last
    iterations = int(last.split("after ")[1].split(" ")[0])
    residual = float(last.split("relative residual ")[1].split(" ")[0])
    assert 1 < iterations < 300 and residual <= 1e-8
    # one line at iteration 1, every 10th, and the last: the output stays short
    assert len(err) == 2 + iterations // 10


def test_quiet_by_default(rng, capsys):
    K, b, _ = _system(rng, 100)
    K.solve(b, alpha=0.5)
    assert capsys.readouterr().err == ""


def test_verbose_solve_uses_tqdm_when_installed(rng, capsys):
    pytest.importorskip("tqdm")
    K, b, _ = _system(rng)
    K.solve(b, alpha=0.5, verbose=True)
    err = capsys.readouterr().err
    assert "solve: " in err and "it [" in err and "residual " in err and "target 1e-06" in err


def test_verbose_reports_a_stop_at_maxiter(rng, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    K, b, _ = _system(rng)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        K.solve(b, alpha=1e-6, eps=1e-12, maxiter=3, verbose=True)
    assert any(issubclass(w.category, RuntimeWarning) for w in caught)
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("solve: stopped after 3 iterations, relative residual ")


def test_kernel_solve_verbose_in_torch_forward_and_backward(rng, capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setitem(sys.modules, "tqdm", None)
    Kinv = KernelSolve("Exp(-SqDist(x, y) * 20) * b", ["x = Vi(2)", "y = Vj(2)", "b = Vj(1)"],
                       "b", axis=1)
    x = torch.tensor(rng.random((200, 2)))
    b = torch.tensor(rng.standard_normal((200, 1)), requires_grad=True)
    a = Kinv(x, x, b, alpha=0.5, eps=1e-10, verbose=True)
    a.sum().backward()
    err = capsys.readouterr().err
    assert err.count("solve: converged after") == 2  # the solve, and the backward's solve
    dense = torch.exp(-((x[:, None] - x[None]) ** 2).sum(-1) * 20) + 0.5 * torch.eye(200)
    torch.testing.assert_close(b.grad, torch.linalg.solve(dense, torch.ones(200, 1, dtype=dense.dtype)),
                               rtol=1e-5, atol=1e-7)


def test_first_compile_is_logged(rng, caplog, monkeypatch):
    # a constant no other test uses, so that the kernel is compiled here
    scale = float(rng.integers(1, 10**6)) + 0.123
    x = rng.random((50, 2))
    monkeypatch.setattr(progress, "SLOW_COMPILE_S", 0.0)
    with caplog.at_level(logging.DEBUG, logger="lazytensor"):
        (-Vi(x).sqdist(Vj(x)) * scale).exp().sum(1)
    notices = [r for r in caplog.records if r.name == "lazytensor" and "compiled" in r.message]
    assert notices and notices[0].levelno == logging.INFO
    assert "sum of exp" in notices[0].message and " s (kept in the kernel cache" in notices[0].message


def test_fast_compiles_are_debug_only(caplog):
    with caplog.at_level(logging.DEBUG, logger="lazytensor"):
        progress.compile_notice("float32 sum of x", 0.01)
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]


_CHILD = """
import logging, sys
import numpy as np
import lazytensor.core.progress as progress
progress.SLOW_COMPILE_S = 0.0
if sys.argv[1] == "configured":
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="app: %(message)s")
from lazytensor import Vi, Vj
x = np.random.rand(20, 2)
(-Vi(x).sqdist(Vj(x)) * 3.25).exp().sum(1)
"""


@pytest.mark.parametrize("verbose,how,where", [
    ("", "plain", "stderr"),           # default: notices shown on stderr
    ("0", "plain", "nowhere"),         # LAZYTENSOR_VERBOSE=0 silences them
    ("", "configured", "stdout"),      # an application's logging set-up receives them, once
])
def test_notice_destination(tmp_path, verbose, how, where):
    env = dict(os.environ, LAZYTENSOR_CACHE_DIR=str(tmp_path / "cache"), LAZYTENSOR_VERBOSE=verbose)
    out = subprocess.run([sys.executable, "-c", _CHILD, how], capture_output=True, text=True,
                         env=env, timeout=300, check=True)
    assert (out.stderr.count("[lazytensor] compiled a kernel") == 1) == (where == "stderr")
    assert (out.stdout.count("app: compiled a kernel") == 1) == (where == "stdout")
    assert "compiled" not in out.stderr + out.stdout or where != "nowhere"
