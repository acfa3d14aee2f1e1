"""The modules one reduction passes through, in the order it first enters them.

``python -m tools.call_path`` runs ``(-Vi(x).sqdist(Vj(y))).exp() @ b`` three times in a
fresh process: *cold* (nothing built: the kernel is compiled), *disk* (a new process
whose kernel is on disk: planned, loaded, run) and *warm* (the same call again: the plan
and the kernel are in memory), and prints, for each, the lazytensor modules whose code
ran (``lazytensor.codegen.*`` and ``lazytensor.cache.*`` included) and how many.

    python -m tools.call_path            # the three runs
    python -m tools.call_path --run warm # one of them
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, sys
import numpy as np
from lazytensor import Vi, Vj

x, y, b = np.random.rand(200, 3), np.random.rand(300, 3), np.random.rand(300, 1)
call = lambda: (-Vi(x).sqdist(Vj(y))).exp() @ b
if sys.argv[1] == "warm":
    call()
seen = []
def trace(frame, event, arg):
    if event == "call":
        name = frame.f_globals.get("__name__", "")
        if name.startswith("lazytensor") and name not in seen:
            seen.append(name)
    return None
sys.setprofile(trace)
call()
sys.setprofile(None)
print(json.dumps(seen))
"""


def modules_of(run: str, cache_dir: str) -> list:
    """The modules of one run ("cold", "disk" or "warm") with ``cache_dir`` as the cache."""
    env = dict(os.environ, LAZYTENSOR_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", _CHILD, run], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", choices=("cold", "disk", "warm"), action="append")
    args = parser.parse_args(argv)
    runs = args.run or ["cold", "disk", "warm"]
    with tempfile.TemporaryDirectory(prefix="lazytensor-call-path-") as tmp:
        for run in ("cold", "disk", "warm"):
            if run not in runs and not (run == "cold" and "disk" in runs):
                continue
            mods = modules_of(run, tmp)
            if run in runs:
                print(f"{run}: {len(mods)} modules")
                for m in mods:
                    print(f"  {m}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
