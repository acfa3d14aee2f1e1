"""The batch layout every backend's kernels read: one stride per variable and batch dimension.

Batch dimensions (pykeops's leading dimensions, broadcast as NumPy does) reach a kernel
as a shape ``bshape`` and, per variable, its strides along it (0 where it is broadcast).

>>> batch_layout([(2, 3, 5, 4), (3, 7, 4)], ["i", "j"], (2, 3))
([2, 3], [[60, 20], [0, 28]])
"""

from __future__ import annotations


def batch_layout(shapes: list, cats: list, batch: tuple, max_dims: int | None = None,
                 who: str = "a kernel") -> tuple[list, list]:
    """``(bshape, vbs)`` for variables of canonical contiguous ``shapes``.

    ``vbs[v][k]`` is variable v's element stride along batch dim k (0 where it is
    broadcast). Batch dims of size 1 are dropped and neighbours that every variable
    walks alike are merged; more than ``max_dims`` left is refused (``who``: the backend,
    for the message).

    >>> batch_layout([(2, 3, 5, 4), (1, 3, 7, 4)], ["i", "j"], (2, 3))
    ([2, 3], [[60, 20], [0, 28]])
    >>> batch_layout([(2, 3, 5, 4), (2, 3, 7, 4)], ["i", "j"], (2, 3))
    ([6], [[20], [28]])
    """
    nbd = len(batch)
    vbs = []
    for shape, cat in zip(shapes, cats):
        shape = tuple(shape)
        tail = 2 if cat in ("i", "j") else 1
        own = shape[: len(shape) - tail]
        own = (1,) * (nbd - len(own)) + tuple(own)
        stride = 1
        for s in shape[len(shape) - tail:]:
            stride *= s
        strides = [0] * nbd
        for k in range(nbd - 1, -1, -1):
            strides[k] = 0 if own[k] == 1 else stride
            stride *= own[k]
        vbs.append(strides)
    dims = [k for k in range(nbd) if batch[k] != 1]
    bshape = [batch[k] for k in dims]
    vbs = [[s[k] for k in dims] for s in vbs]
    k = len(bshape) - 2
    while k >= 0:  # merge dim k+1 into dim k where every variable allows it
        if all(s[k] == s[k + 1] * bshape[k + 1] for s in vbs):
            bshape[k] *= bshape.pop(k + 1)
            for s in vbs:
                s[k] = s.pop(k + 1)
        k -= 1
    if max_dims is not None and len(bshape) > max_dims:
        raise ValueError(f"{who} takes at most {max_dims} batch dimensions that cannot be "
                         f"merged, got batch shape {tuple(batch)}")
    return bshape, vbs


__all__ = ["batch_layout"]
