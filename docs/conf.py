"""Sphinx configuration of the API reference (``make docs``), built from the docstrings.

Broken references are errors (``-W -n``): a reference to a name that does not exist, in
lazytensor (``:func:`lazytensor.api.solve.solve```, or a name relative to the module the
docstring is in), fails the build. A reference to a lazytensor name that exists but has
no page of its own (an internal module or class) is rendered as plain text. Names of other
libraries (numpy, torch, the standard library) are not checked: no inventory of theirs is
fetched (CI has no network).
"""

import builtins
import importlib
import os
import sys

sys.path.insert(0, os.path.abspath(".."))  # a source checkout works without installing

project = "lazytensor"
author = "the lazytensor authors"
extensions = ["sphinx.ext.autodoc"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_title = "lazytensor API reference"

autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "description"
autodoc_preserve_defaults = True
autoclass_content = "both"  # the class docstring and __init__'s
autodoc_inherit_docstrings = False  # not torch's, whose references point into its own docs
nitpicky = True


def _find(dotted: str):
    """The object named ``dotted`` (modules imported as needed), or None."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except Exception:  # noqa: BLE001 - not a module (or not importable): try shorter
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name, None)
            if obj is None:
                return None
        return obj
    return None


def _candidates(target: str, module: str | None, cls: str | None) -> list:
    names = [target, f"lazytensor.{target}"]
    if module:
        names.append(f"{module}.{target}")
        if cls:
            names.append(f"{module}.{cls}.{target}")
    return [n for n in names if n.split(".")[0] == "lazytensor"]


def _external(target: str) -> bool:
    """A name of another library or of Python itself (not checked)."""
    head = target.split(".")[0]
    if head == "lazytensor":
        return False
    if hasattr(builtins, head) or target in ("typing", "collections.abc"):
        return True
    try:
        importlib.import_module(head)
    except Exception:  # noqa: BLE001
        return False
    return True


def _resolve_existing(app, env, node, contnode):
    """missing-reference: plain text for names that exist; a warning (an error under -W)
    for a lazytensor name that does not."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "").lstrip(".~")
    module, cls = node.get("py:module"), node.get("py:class")
    if any(_find(name) is not None for name in _candidates(target, module, cls)):
        return contnode
    if _external(target):
        return contnode
    return None


def setup(app):
    app.connect("missing-reference", _resolve_existing)
