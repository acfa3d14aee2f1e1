"""CONTRIBUTING.md's recipe for a backend holds: a folder under ``lazytensor/backends/``
and nothing else gives a backend that ``backend="<name>"``, Genred, gradients and the
doctor reach.

The backend here is written in a temporary folder added to ``lazytensor.backends``'s
search path (a subprocess, so that the registry of this process stays as it is); its
executor counts its calls and runs the reference evaluator, whose values are compared
with float64 NumPy.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

TOY = '''
from lazytensor.core.backend import BackendRuntime

calls = []


class Toy(BackendRuntime):
    name = "toy"
    aliases = ("toy_alias",)
    device = None
    needs = "arrays"
    contiguous_inputs = False

    def executor(self, call, shapes, out_specs):
        from lazytensor.backends.reference.dense import run_call

        def run(arrays, ranges=None):
            calls.append(call.reduction)
            return run_call(call, arrays, out_specs, ranges)

        return run


BACKEND = Toy()
'''

DOCTOR = '''
from lazytensor.core.checks import Check

NAMES = ("toy device",)


def checks(kernel=True):
    return [Check("toy device", "ok", "always there")]


def summary(found):
    return "toy: ready"
'''

SCRIPT = textwrap.dedent('''
    import json, sys
    import numpy as np, torch
    import lazytensor.backends as backends
    backends.__path__.append(sys.argv[1])
    from lazytensor import Genred, Vi, Vj
    from lazytensor.cli import doctor
    from lazytensor.core import backend

    rng = np.random.default_rng(int(sys.argv[2]))
    x, y, b = rng.random((7, 3)), rng.random((5, 3)), rng.random((5, 2))
    d2 = ((x[:, None] - y[None]) ** 2).sum(-1)
    out = {"names": list(backend.names())}
    lazy = ((-Vi(x).sqdist(Vj(y))).exp() * Vj(b)).sum(dim=1, backend="toy")
    out["sum_err"] = float(np.abs(lazy - np.exp(-d2) @ b).max())
    idx = (Vi(x).sqdist(Vj(y))).argmin(dim=1, backend="toy_alias")
    out["argmin_ok"] = bool((idx.ravel() == d2.argmin(1)).all())
    g = Genred("Exp(-SqDist(x,y))*b", ["x=Vi(3)", "y=Vj(3)", "b=Vj(2)"], reduction_op="Sum", axis=1)
    out["genred_err"] = float(np.abs(g(x, y, b, backend="toy") - np.exp(-d2) @ b).max())
    xt = torch.tensor(x, requires_grad=True)
    ((-Vi(xt).sqdist(Vj(torch.tensor(y)))).exp().sum(dim=1, backend="toy")).sum().backward()
    k = np.exp(-d2)
    ref = (-2 * k[:, :, None] * (x[:, None] - y[None])).sum(1)
    out["grad_err"] = float(np.abs(xt.grad.numpy() - ref).max())
    from lazytensor.backends import toy
    out["calls"] = toy.calls
    checks = doctor.run_checks(kernel=False)
    out["doctor"] = [c.name for c in checks if c.name == "toy device"]
    out["summary"] = "toy: ready" in doctor.summary(checks)
    print(json.dumps(out))
''')


def test_a_backend_is_a_folder(tmp_path, rng):
    folder = tmp_path / "toy"
    folder.mkdir()
    (folder / "__init__.py").write_text(TOY)
    (folder / "doctor.py").write_text(DOCTOR)
    seed = int(rng.integers(2**31))
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(seed)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert "toy" in out["names"]
    assert out["sum_err"] < 1e-12 and out["genred_err"] < 1e-12 and out["grad_err"] < 1e-12
    assert out["argmin_ok"]
    # the forward sum, the argmin, Genred's sum, the gradient's forward and its VJP sum
    assert len(out["calls"]) >= 5 and set(out["calls"]) <= {"sum", "argmin", "min_argmin"}
    assert out["doctor"] == ["toy device"] and out["summary"]
