"""CONTRIBUTING.md's module map names every module of the three packages, and nothing else.

Each module of ``lazytensor/``, ``codegen/`` and ``cache/`` appears in its package's part
of the map as ``path`` (relative to the package, without ``.py``; a folder as ``path/`` or
through the modules in it);
every such path written with a slash names a module or folder that exists. A module
added, moved or deleted without its line fails here, so the map stays the one a new
maintainer can trust.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lazytensor", "codegen", "cache")


def _sections() -> dict:
    """package -> the text of its part of the module map."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    body = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    starts = {p: re.search(rf"^`{p}/`", body, re.M) for p in PACKAGES}
    missing = [p for p, m in starts.items() if m is None]
    assert not missing, f"the module map has no part for {missing}"
    # a part: its header line and the bullets below it, up to the first blank line
    return {p: body[m.start():].split("\n\n", 1)[0] for p, m in starts.items()}


def _named(section: str) -> set:
    return set(re.findall(r"`([A-Za-z_][\w/.]*)`", section))


def _modules(package: str) -> set:
    folder = ROOT / package
    names = set()
    for path in folder.rglob("*.py"):
        rel = path.relative_to(folder).with_suffix("")
        if rel.name == "__init__":
            if rel.parent != Path("."):
                names.add(f"{rel.parent.as_posix()}/")
            continue
        names.add(rel.as_posix())
    return names


def test_every_module_is_in_the_map():
    sections = _sections()
    for package in PACKAGES:
        named = _named(sections[package])
        # a folder is named by itself or through the modules in it
        absent = sorted(m for m in _modules(package) if m not in named
                        and m.rstrip("/") not in named
                        and not (m.endswith("/") and any(n.startswith(m) for n in named)))
        assert not absent, (f"CONTRIBUTING.md's module map does not name these modules of "
                            f"{package}/: {absent}")


def test_every_path_in_the_map_exists():
    sections = _sections()
    for package in PACKAGES:
        folder = ROOT / package
        stale = sorted(name for name in _named(sections[package]) - {f"{package}/"} if "/" in name
                       and not (folder / f"{name}.py").is_file()
                       and not (folder / name.rstrip("/")).is_dir())
        assert not stale, f"CONTRIBUTING.md's module map names what {package}/ lacks: {stale}"
