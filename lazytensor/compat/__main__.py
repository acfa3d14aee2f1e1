"""``python -m lazytensor.compat``: how to run pykeops code on lazytensor, and what is covered.

>>> main([]) == 0  # doctest: +ELLIPSIS
lazytensor.compat: ...
True
"""

from __future__ import annotations

import sys

USAGE = """\
lazytensor.compat: run code written for pykeops on lazytensor

  import lazytensor.compat.pykeops
  lazytensor.compat.pykeops.install()     # first, before pykeops or a library using it

  from pykeops.torch import LazyTensor    # lazytensor.LazyTensor
  import geomloss, gpytorch               # their pykeops imports get lazytensor too

Aliased modules (pykeops {version} API):
{modules}

float16 inputs compute in float32 (on the CPU too), returned as float16.
install() refuses (PykeopsAlreadyImported) when the real pykeops is already imported;
uninstall() removes the alias. The kernels live in lazytensor's cache
(python -m lazytensor cache info); pykeops.clean_pykeops() empties it.
"""


def main(argv=None) -> int:
    from . import pykeops_modules

    names = sorted(pykeops_modules.BUILDERS)
    print(USAGE.format(version=pykeops_modules.API_VERSION,
                       modules="\n".join(f"  {n}" for n in names)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
