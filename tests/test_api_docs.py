"""The public API documents itself: a docstring with a runnable example and type hints.

Every public ``LazyTensor`` method and property, every name of ``lazytensor.__all__``, every
registered reduction and every op record that names a ``LazyTensor`` method (whose
docstring it gives, see :mod:`lazytensor.api.method_docs`) has a docstring with a ``>>>``
example; ``tests/test_doctests.py`` runs those examples. Public methods and functions
annotate every parameter and their return value.
"""

from __future__ import annotations

import inspect

import pytest
from lazytensor.codegen import ops, reductions

import lazytensor
from lazytensor import LazyTensor


def _public_members(cls: type) -> dict:
    """name -> function or property, for the public methods and properties of ``cls``."""
    out = {}
    for name in dir(cls):
        if name.startswith("_"):
            continue
        attr = inspect.getattr_static(cls, name)
        if isinstance(attr, (staticmethod, classmethod)):
            attr = attr.__func__
        if inspect.isfunction(attr) or isinstance(attr, property):
            out[name] = attr
    return out


def _missing_hints(obj) -> list:
    """The parameters (and "return") of ``obj`` without an annotation."""
    func = obj.fget if isinstance(obj, property) else obj
    sig = inspect.signature(func)
    missing = [name for name, p in sig.parameters.items()
               if name not in ("self", "cls") and p.annotation is inspect.Parameter.empty]
    if sig.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


def _has_example(obj) -> bool:
    doc = inspect.getdoc(obj) or ""
    return bool(doc.strip()) and ">>>" in doc


METHODS = _public_members(LazyTensor)
PUBLIC_NAMES = [n for n in lazytensor.__all__ if not n.startswith("__")]


def test_the_public_surface_is_what_the_checks_walk():
    assert {"exp", "sum", "argKmin", "sqdist", "shape", "T", "reduction", "solve"} <= set(METHODS)
    assert len(METHODS) > 100


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_public_lazytensor_method_has_a_docstring_with_an_example(name):
    assert _has_example(METHODS[name]), f"LazyTensor.{name} has no docstring with a >>> example"


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_public_lazytensor_method_has_type_hints(name):
    missing = _missing_hints(METHODS[name])
    assert not missing, f"LazyTensor.{name}: no type hint for {missing}"


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_every_exported_name_has_a_docstring_with_an_example(name):
    assert _has_example(getattr(lazytensor, name)), f"lazytensor.{name} has no >>> example"


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_every_exported_callable_has_type_hints(name):
    obj = getattr(lazytensor, name)
    targets = {name: obj}
    if inspect.isclass(obj):  # its constructor and its call
        targets = {f"{name}.{m}": getattr(obj, m) for m in ("__init__", "__call__")
                   if m in vars(obj)}
    for label, func in targets.items():
        missing = _missing_hints(func)
        if label.endswith("__init__"):
            missing = [m for m in missing if m != "return"]
        assert not missing, f"{label}: no type hint for {missing}"


@pytest.mark.parametrize("opdef", [d for d in ops.REGISTRY.values() if d.method and not d.user],
                         ids=lambda d: d.name)
def test_op_records_with_a_method_carry_its_doc_and_example(opdef):
    assert opdef.doc and ">>>" in opdef.example, (
        f"op {opdef.name!r} names LazyTensor.{opdef.method}: give its record a doc and an "
        "example (they become the method's docstring)")
    if not opdef.method.startswith("__"):  # operators are called as operators
        assert f".{opdef.method}(" in opdef.example, (
            f"op {opdef.name!r}: the example does not call .{opdef.method}()")


def test_a_method_without_a_docstring_takes_its_op_record():
    record = ops.get("exp")
    assert LazyTensor.exp.__doc__.startswith(record.doc[0].upper() + record.doc[1:])
    assert record.example.strip() in LazyTensor.exp.__doc__
    assert "``Exp``" in LazyTensor.exp.__doc__


@pytest.mark.parametrize("reduction", reductions.all_reductions(), ids=lambda r: r.name)
def test_every_reduction_has_a_docstring_with_an_example(reduction):
    cls = type(reduction)
    assert ">>>" in (cls.__doc__ or ""), f"reduction {reduction.name} ({cls.__name__}) has no " \
        ">>> example in its class docstring"
