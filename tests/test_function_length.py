"""No function or method of ``lazytensor/``, ``codegen/`` or ``cache/`` is over 100 lines.

Templates of generated code are named pieces (a function per piece of the kernel), and a
function reads at once. Every ``def`` counts, methods and nested functions alike, from its
``def`` line to its last line (parsed with ``ast``, nothing is imported).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("lazytensor", "codegen", "cache")
MAX_LINES = 100


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """(qualified name, first line, number of lines) of every function in ``source``."""
    out = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def test_the_count_sees_methods_and_nested_functions():
    source = ("class A:\n"
              "    def f(self):\n"
              "        def g():\n"
              + "".join(f"            x{k} = {k}\n" for k in range(5))
              + "        return g\n"
              "\n"
              "def h(): return 0\n")
    lengths = {name: (line, n) for name, line, n in function_lengths(source)}
    assert lengths == {"A.f": (2, 8), "A.f.g": (3, 6), "h": (11, 1)}


def test_no_function_is_over_100_lines():
    long = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for name, line, n in function_lengths(path.read_text()):
                if n > MAX_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{line} {name}: {n} lines")
    assert not long, f"functions over {MAX_LINES} lines (split them into named pieces): {long}"
