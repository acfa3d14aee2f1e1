"""Sphinx configuration of the API reference (``make docs``), built from the docstrings."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))  # a source checkout works without installing

project = "lazytensor"
author = "the lazytensor authors"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_title = "lazytensor API reference"

autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "description"
autodoc_preserve_defaults = True
autoclass_content = "both"  # the class docstring and __init__'s
autodoc_inherit_docstrings = False  # not torch's, whose references point into its own docs

# Broken references are errors (-W -n): every reference to lazytensor's own names must
# resolve. Names of other libraries (numpy, torch, the standard library) cannot: no
# inventory of theirs is fetched (CI has no network), so they are not checked.
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(?!lazytensor\.).*")]
