"""Formula IR, op and reduction registries, differentiation, C++/CUDA emission, compilers.

Pure: IR in, source and binaries out. Never imports ``lazytensor`` or ``cache``.
"""

from . import ir, ops, reductions  # noqa: F401
