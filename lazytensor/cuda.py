"""CUDA helpers for users: waiting for lazytensor's kernels and seeing their faults.

The CUDA backend itself is :mod:`lazytensor.backends.cuda`; importing this module loads
nothing (no pycuda, no driver).

>>> from lazytensor.cuda import synchronize
>>> synchronize()   # nothing launched yet: nothing to wait for
"""


def synchronize(device=None) -> None:
    """Wait for lazytensor's CUDA kernels and raise, naming the kernel and its formula, if
    one of them failed (see :mod:`lazytensor.backends.cuda.streams`)."""
    from .backends.cuda.streams import synchronize as sync

    sync(device)


__all__ = ["synchronize"]
