"""The benchmark's command line: its usage line, its suites described in --help, its plan.

No measurement runs here (``make bench`` does that); these only check what a user reads.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from benchmarks import bench

ROOT = Path(__file__).resolve().parents[1]


def test_help_names_the_command_and_describes_every_suite():
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.startswith("usage: python -m benchmarks.bench")
    suites = out.split("suites (--suite):")[1]
    for name in bench.SUITES:
        assert f"\n  {name} " in suites
    assert "[k/n]" in out


def _titles(suite: str, quick: bool = True) -> list:
    args = argparse.Namespace(suite=suite, quick=quick)
    return [title for title, _ in bench._plan(args)]


def test_each_suite_plans_its_tables_and_all_plans_every_table():
    core, grad, cpu = _titles("core"), _titles("grad"), _titles("cpu")
    assert "call overheads" in core and "peak memory" in core
    assert grad == ["gradient D = 3", "gradient D = 64"]
    assert "Gaussian D = 256" in cpu and "vector-valued terms" in cpu
    dual, gpytorch = _titles("dual"), _titles("gpytorch")
    assert dual == ["fused gradients"] and gpytorch == ["GPyTorch-shaped products"]
    assert set(_titles("all")) == set(core) | set(grad) | set(cpu) | set(dual) | set(gpytorch)
    assert len(_titles("all")) == len(set(_titles("all")))


def test_ranges_suite_plans_its_two_tables():
    assert _titles("ranges") == ["block-sparse ranges", "geomloss Sinkhorn"]
