"""Formula IR, op and reduction registries, differentiation, C++/CUDA emission, compilers.

Pure: IR in, source and binaries out. Never imports ``lazytensor`` or ``cache``.
Importing the package registers every built-in op (scalar functions in
:mod:`~lazytensor.codegen.elementwise`, vector structure in
:mod:`~lazytensor.codegen.vector_ops`) and every reduction.
"""

from . import elementwise, ir, ops, reductions, vector_ops  # noqa: F401  (registers them)
