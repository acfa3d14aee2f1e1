"""Docstrings of the ``LazyTensor`` methods that build one registered op, from its record.

An op record (:class:`~lazytensor.codegen.ops.OpDef`) names the ``LazyTensor`` method
that builds it (``method``), says what the op computes (``doc``) and carries a doctest of
that method (``example``). A method without a docstring of its own (``def exp(self):
return self._op("exp")``) takes :func:`op_docstring` of its record when the class is
created, so a new op's method is documented, with a runnable example, by its record.
``tests/test_api_docs.py`` checks that every record with a method has both.

>>> from lazytensor import LazyTensor
>>> doc = LazyTensor.exp.__doc__
>>> doc.splitlines()[0], ">>> x.exp()" in doc
('Exponential exp(a).', True)
"""

from __future__ import annotations

from ..codegen import ops

_ELEMENTWISE_SHAPES = (
    "Componentwise: the result has the operands' shape ``(*batch, N, M, D)``; an operand\n"
    "of dimension 1 is broadcast against dimension D.")


def op_docstring(opdef: ops.OpDef) -> str:
    """The docstring of ``opdef.method``: what the op computes, the shapes in and out, its
    names in formula strings, and the record's example.

    >>> from lazytensor.codegen import ops
    >>> op_docstring(ops.get("square")).splitlines()[0]
    'a * a.'
    """
    what = opdef.doc or f"``{opdef.name}(self)``"
    summary = what[0].upper() + what[1:] if what[:2].isalpha() else what  # not "a * a"
    lines = [summary if summary.endswith(".") else summary + ".", ""]
    if opdef.elementwise:
        lines.append(_ELEMENTWISE_SHAPES)
    if opdef.keops:
        names = ", ".join(f"``{n}``" for n in opdef.keops)
        lines.append(f"In formula strings (:class:`~lazytensor.api.genred.Genred`): {names}.")
    text = "\n".join(lines).rstrip("\n")
    if opdef.example:
        text += "\n\n" + opdef.example.strip("\n") + "\n"
    return text


def document_op_methods(cls: type) -> None:
    """Give each method of ``cls`` named by an op record, and without a docstring, the
    record's :func:`op_docstring`."""
    for opdef in ops.REGISTRY.values():
        if not opdef.method:
            continue
        method = cls.__dict__.get(opdef.method)
        if callable(method) and not (method.__doc__ or "").strip():
            method.__doc__ = op_docstring(opdef)
