"""Every Python block of README.md runs as written, each in a fresh interpreter.

A block is run from an empty directory with the session's kernel cache; torch.distributed
blocks get a one-process gloo group through the environment (``init_process_group`` reads
it, as under ``torchrun``). A block that needs an optional library that is missing is
skipped, saying which.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks() -> list:
    """(first line number, source) of each ```python block."""
    text = README.read_text()
    return [(text[:m.start()].count("\n") + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def test_the_readme_has_examples():
    assert len(blocks()) >= 6


@pytest.mark.parametrize("line, source", blocks(), ids=[f"line{n}" for n, _ in blocks()])
def test_readme_block_runs(line, source, tmp_path):
    for module in re.findall(r"^\s*(?:import|from) (\w+)", source, re.M):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"README block at line {line} needs {module}")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 2000),
               RANK="0", WORLD_SIZE="1", PYTHONPATH=str(README.parent))
    script = tmp_path / "block.py"
    script.write_text(source)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"README block at line {line} failed:\n{done.stderr[-3000:]}"
