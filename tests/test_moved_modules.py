"""Modules that moved into the layered subpackages keep their old import paths.

``import lazytensor.<old>`` gives the module at its new place (the same object), ``from
lazytensor import doctor`` works as before, the backends' checks are reachable from the
doctor by name, and ``lazytensor.engine`` / ``lazytensor.interop`` (modules once, packages
now) still export the names they had.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import lazytensor


@pytest.mark.parametrize("old,new", sorted(lazytensor.MOVED_MODULES.items()))
def test_old_path_is_the_new_module(old, new):
    moved = importlib.import_module(f"lazytensor.{old}")
    assert moved is importlib.import_module(f"lazytensor.{new}")
    assert moved.__name__ == f"lazytensor.{new}"


def test_old_paths_in_a_fresh_process():
    code = ("from lazytensor import doctor, Vi, options\n"
            "from lazytensor.genred import Genred\n"
            "from lazytensor.ranges import reduce as ranged_reduce\n"
            "from lazytensor.engine import reduce, prepare\n"
            "from lazytensor.interop import array_ufunc\n"
            "import lazytensor.reference, lazytensor.distributed.gather\n"
            "assert callable(options) and doctor.check_nvcc().name == 'nvcc'\n"
            "assert callable(doctor.check_compiler) and doctor.run_checks\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_unknown_names_still_raise():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("lazytensor.no_such_module")
    doctor = importlib.import_module("lazytensor.cli.doctor")
    with pytest.raises(AttributeError, match="check_nothing"):
        doctor.check_nothing  # noqa: B018
