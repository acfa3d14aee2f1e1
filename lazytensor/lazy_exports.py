"""Names a package exports without importing their modules until first use (PEP 562).

``lazytensor`` and ``lazytensor.distributed`` keep ``import lazytensor`` cheap: the public
names live in submodules that load only when a name is first read.

>>> ns = {"__name__": "json"}
>>> getattr_, dir_ = lazy_exports(ns, {"JSONEncoder": "encoder"})
>>> getattr_("JSONEncoder")().encode({"a": 1}), "JSONEncoder" in dir_(), "JSONEncoder" in ns
('{"a": 1}', True, True)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(namespace: dict[str, Any], exports: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Module ``__getattr__`` and ``__dir__`` for ``namespace`` (a package's ``globals()``).

    ``exports`` maps each public name to the submodule defining it; a name read once is
    stored in ``namespace``, so later reads are plain attribute lookups.
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
