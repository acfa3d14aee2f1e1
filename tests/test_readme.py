"""Every Python block of README.md runs as written, each in a fresh interpreter.

A block runs as a user runs it, ``python block.py`` from an empty directory, with the
session's kernel cache and none of torchrun's environment (the torch.distributed block
then makes its group of one process); the torch.distributed block runs under torchrun
too, on two ranks. A block that needs an optional library that is missing is skipped,
saying which. The README's install commands name extras that pyproject.toml declares.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_FENCE = re.compile(r"^```(\S*)\n(.*?)^```", re.S | re.M)
# what torchrun sets; a block run "as it stands" sees none of it
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")


def blocks() -> list:
    """(first line number, source) of each ```python block."""
    text = README.read_text()
    return [(text[:m.start()].count("\n") + 1, m.group(1)) for m in _BLOCK.finditer(text)]


def _run(args: list, cwd, env=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in (env or os.environ).items() if k not in TORCHRUN_ENV}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def test_the_readme_has_examples():
    assert len(blocks()) >= 6


def test_every_python_block_is_one_that_runs():
    """No Python escapes the runner under another fence (```py, ```python3, or none)."""
    text = README.read_text()
    for m in _FENCE.finditer(text):
        line = text[:m.start()].count("\n") + 1
        lang, body = m.group(1), m.group(2)
        assert lang == "python" or not re.search(r"^\s*(import|from) \w+", body, re.M), \
            f"README line {line}: a block of Python fenced as {lang!r}: fence it as ```python"
        assert lang not in ("py", "python3", "pycon", "ipython"), f"README line {line}"


def _skip_if_missing(line: int, source: str) -> None:
    for module in re.findall(r"^\s*(?:import|from) (\w+)", source, re.M):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"README block at line {line} needs {module}")


@pytest.mark.parametrize("line, source", blocks(), ids=[f"line{n}" for n, _ in blocks()])
def test_readme_block_runs(line, source, tmp_path):
    _skip_if_missing(line, source)
    script = tmp_path / "block.py"
    script.write_text(source)
    done = _run([sys.executable, str(script)], tmp_path)
    assert done.returncode == 0, f"README block at line {line} failed:\n{done.stderr[-3000:]}"


def _distributed_block() -> tuple:
    found = [(n, s) for n, s in blocks() if "init_process_group" in s]
    assert len(found) == 1, "the README has one torch.distributed block"
    return found[0]


@pytest.mark.distributed
def test_the_torch_distributed_block_runs_under_torchrun(tmp_path):
    """As the README says to launch it, on two ranks (each its own rows and slice)."""
    line, source = _distributed_block()
    _skip_if_missing(line, source)
    script = tmp_path / "block.py"
    script.write_text(source)
    env = dict(os.environ, OMP_NUM_THREADS="1")  # two ranks share the cores
    done = _run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", "2", str(script)], tmp_path, env)
    assert done.returncode == 0, f"README block at line {line} under torchrun failed:\n" \
                                 f"{done.stderr[-3000:]}"


def test_the_install_extras_in_the_readme_exist():
    """Every ``pip install '...[extra]'`` of the README names an extra of pyproject.toml."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    section = pyproject.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    declared = set(re.findall(r"^(\w[\w-]*) = \[", section, re.M))
    named = set(re.findall(r"pip install[^`\n]*\[([\w,-]+)\]", README.read_text()))
    extras = {e for group in named for e in group.split(",")}
    assert "distributed" in extras and extras <= declared, (extras, declared)
