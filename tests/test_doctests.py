"""The examples in the docstrings run and print what they say (``python -m doctest`` style)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import lazytensor
from lazytensor import cache, codegen, distributed

# the command line (its example would touch the real cache)
_SKIP = {"lazytensor.__main__"}


def _modules():
    for pkg in (lazytensor, codegen, cache, distributed):
        yield pkg.__name__
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if info.name not in _SKIP:
                yield info.name


@pytest.mark.parametrize("name", sorted(_modules()))
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} docstring example(s) of {name} failed (see above)"
