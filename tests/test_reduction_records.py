"""A reduction is one record: nothing outside ``codegen/reductions/`` names reductions, and
every record carries what each backend, the block merges and LazyTensor read from it.

The names of reductions written as string literals outside ``codegen/reductions/`` are
counted (parsed with ``ast``; docstrings aside): each file that still has some is listed
in :data:`ALLOWED` with its count and the reason, and the test fails when a count grows
or a new file starts naming reductions (a table of names that should be a fact of the
records). ``"sum"`` is not counted: it is also the op of the vector's sum.
"""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import numpy as np
import pytest
from lazytensor.codegen import reductions
from lazytensor.codegen.reductions.base import PAIRS, TILES
from lazytensor.codegen.render_c import ACC_HOOKS

from lazytensor import LazyTensor, Vi, Vj
from lazytensor.scale import merge

ROOT = Path(__file__).resolve().parents[1]

# file -> (count, why it names reductions)
ALLOWED = {
    "lazytensor/interop/rules.py": (20, "torch's and NumPy's function names (torch.min, "
                                        "torch.logsumexp, softmax ...) mapped to reductions"),
    "lazytensor/interop/table.py": (14, "the table of torch's and NumPy's names"),
    "codegen/vector_ops.py": (4, "pykeops's spellings of the vector ops Min, Max, ArgMin, "
                                 "ArgMax in formula strings (ops, not reductions)"),
    "lazytensor/api/genred.py": (3, "pykeops's generic_logsumexp, generic_argmin and "
                                    "generic_argkmin name their Genred reduction as pykeops does"),
    "lazytensor/__init__.py": (1, "the old import path lazytensor.softmax, a module"),
    "lazytensor/scale/cluster.py": (4, "grid_cluster's anchor=\"min\" (the points' minimum), not a "
                                    "reduction"),
    "codegen/linearize.py": (1, "the record's ``wide`` form \"softmax\", not a reduction"),
    "lazytensor/autodiff/autograd.py": (1, "the j-side gradients of the log-sum-exp family "
                                           "run Max_SumShiftExp of f"),
}


def _docstrings(tree) -> set:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def count_reduction_names() -> dict:
    """file -> the string literals (line, text) that are a registered reduction's name,
    alias or pykeops name (any case, ``_Reduction`` suffix too), outside the records."""
    names = set(reductions.REDUCTIONS) - {"sum"}
    found = {}
    for folder in ("lazytensor", "codegen", "cache"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("codegen/reductions/"):
                continue
            tree = ast.parse(path.read_text())
            docs = _docstrings(tree)
            hits = [(n.lineno, n.value) for n in ast.walk(tree)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)
                    and id(n) not in docs
                    and n.value.lower().replace("_reduction", "") in names]
            if hits:
                found[rel] = sorted(hits)
    return found


def test_no_file_outside_the_records_names_more_reductions_than_allowed():
    found = count_reduction_names()
    grown = {f: hits for f, hits in found.items() if len(hits) > ALLOWED.get(f, (0, ""))[0]}
    assert not grown, ("reduction names outside codegen/reductions/ (read the fact from the "
                       f"record instead, or list the file in ALLOWED with its reason): {grown}")
    assert sum(len(h) for h in found.values()) <= sum(c for c, _ in ALLOWED.values())


def test_the_count_sees_a_table_of_names(tmp_path, monkeypatch):
    """The counter is not blind: a name list in a module is found, a docstring is not."""
    (tmp_path / "lazytensor").mkdir()
    (tmp_path / "lazytensor" / "m.py").write_text(
        '"""min and argmin in a docstring."""\nSELECTS = ("min", "ArgKMin_Reduction", "x")\n')
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert count_reduction_names() == {"lazytensor/m.py": [(2, "ArgKMin_Reduction"), (2, "min")]}


@pytest.mark.parametrize("red", reductions.all_reductions(), ids=lambda r: r.name)
def test_every_record_has_both_accumulator_forms_and_a_block_merge(red):
    F = 3 if red.weighted else 1
    opts = {"K": 2} if red.needs_k else {}
    tiles, pairs = red.acc_code(F, opts, TILES), red.acc_code(F, opts, PAIRS)
    for hook in ACC_HOOKS:
        assert f"void {hook}(" in pairs, f"{red.name}: the PAIRS accumulator has no {hook}"
        if hook != "flush":
            assert f"void {hook}(" in tiles, f"{red.name}: the TILES accumulator has no {hook}"
    r = merge.rule(red.name)
    assert r.runs and len(r.state_shapes(opts, F)) == len(merge.empty(red.name, (2,), opts, F,
                                                                      "float64"))


@pytest.mark.parametrize("red", [r for r in reductions.all_reductions() if r.method],
                         ids=lambda r: r.name)
def test_lazytensor_methods_come_from_the_records(red):
    method = getattr(LazyTensor, red.method)
    assert method.__doc__ == red.method_doc and ">>>" in red.method_doc
    params = inspect.signature(method).parameters
    assert ("K" in params) == red.needs_k and "dim" in params and "backend" in params
    assert hasattr(LazyTensor, f"{red.method}_reduction")


def test_generated_methods_keep_pykeops_keywords(rng):
    x, y, b = rng.random((7, 2)), rng.random((11, 2)), rng.random((11, 1))
    D = Vi(x).sqdist(Vj(y))
    d = ((x[:, None] - y[None]) ** 2).sum(-1)
    np.testing.assert_allclose(D.sum_reduction(axis=1), d.sum(1, keepdims=True), rtol=1e-12)
    v, i = D.min_argmin(dim=1)
    np.testing.assert_array_equal(i[:, 0], d.argmin(1))
    v, i = D.Kmin_argKmin(K=3, dim=1)
    np.testing.assert_array_equal(i, np.argsort(d, 1, kind="stable")[:, :3])
    np.testing.assert_array_equal(D.argKmin_reduction(3, 1), i)
    lse_w = (-D).logsumexp(dim=1, other=Vj(b))
    np.testing.assert_allclose(lse_w, np.log((np.exp(-d) * b[None, :, 0]).sum(1, keepdims=True)),
                               rtol=1e-12)
    with pytest.raises(ValueError, match="give the weight once"):
        (-D).logsumexp(dim=1, weight=Vj(b), other=Vj(b))
    assert isinstance(D.sum(), LazyTensor) and isinstance(D.min(-1), LazyTensor)
    with pytest.raises(ValueError, match="dim"):
        D.sum_reduction(-1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        D.sum(dim=1, bogus=1)
