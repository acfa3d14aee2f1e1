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

Deliberate differences from pykeops {version}:
  - float16 inputs compute in float32 (on the CPU too), returned as float16;
    dtype_acc="float16" (half data only, as pykeops) accumulates in float32.
  - print(K) / repr(K): pykeops's layout; the formula is lazytensor's, in pykeops's
    names (SqDist prints as what it is built of: Sum(Square((a - b)))).
  - K.sum(dim=1, call=False)(*arrays) binds new arrays to every variable; symbolic
    variables (Vi(0, 3), ...) are numbered 0 .. n-1 (a gap is an error).
  - grid_cluster works in any dimension (pykeops: 1 to 3) and gives int64 labels
    (pykeops.torch: int32); sort_clusters keeps the order inside a cluster (stable).
  - K=, opt_arg= and other integer options take ints, NumPy integers and 0-d integer
    arrays or tensors; floats (3.0 too) are refused.
  - np_kernel / torch_kernel with an unknown kernel name raise ValueError (pykeops's
    NumPy helpers return None).

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
