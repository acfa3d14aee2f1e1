"""CUDA code generation: the kernel skeleton (:mod:`.render`), nvcc (:mod:`.nvcc`).

Pure like the rest of ``codegen``: IR in, CUDA source and cubins out. The runtime that
loads and launches the kernels is :mod:`lazytensor.cuda`.
"""
