"""What ``python -m lazytensor doctor`` reports: one :class:`Check` per line, and the
helpers the backends' checks share (running a tool for its version).

>>> Check("C++ compiler", "ok", "g++").status in STATUSES
True
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

STATUSES = ("ok", "warn", "fail", "off")  # off: absent and optional, or not checked


@dataclass
class Check:
    """One line of the report: a status (``ok``; ``warn``: works, but not as well as it
    could; ``fail``: the backend cannot work; ``off``: an optional part is absent, or it
    was not checked because of an earlier failure), what was found, and the fix."""

    name: str
    status: str
    detail: str
    fix: str = ""


def run_tool(cmd: list, timeout: float = 60) -> subprocess.CompletedProcess:
    """``cmd``'s output (text), no input, never raising for its exit status."""
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, check=False)


def first_line(text: str) -> str:
    """The first line of ``text`` that is not blank, stripped."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")
