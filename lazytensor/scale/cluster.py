"""Clustering helpers for block-sparse reductions (the names of ``pykeops.torch.cluster``).

The recipe, for points x (N, D) and y (M, D) and a kernel that is negligible beyond some
distance: label the points by cells of a grid (:func:`grid_cluster`), sort them so that
each cluster is contiguous (:func:`sort_clusters`), get each cluster's rows and centroid
(:func:`cluster_ranges_centroids`), decide which pairs of clusters interact from their
centroids, and turn that boolean matrix into the ``ranges`` of a reduction
(:func:`from_matrix`)::

    x_lab, y_lab = grid_cluster(x, eps), grid_cluster(y, eps)
    x, x_lab = sort_clusters(x, x_lab)
    (y, b), y_lab = sort_clusters((y, b), y_lab)
    ranges_x, centroids_x, _ = cluster_ranges_centroids(x, x_lab)
    ranges_y, centroids_y, _ = cluster_ranges_centroids(y, y_lab)
    keep = ((centroids_x[:, None] - centroids_y[None]) ** 2).sum(-1) < radius ** 2
    K = (-Vi(x).sqdist(Vj(y)) / s2).exp()
    K.ranges = from_matrix(ranges_x, ranges_y, keep)
    a = K @ b

Every function takes NumPy arrays or torch tensors and returns the same kind; labels and
ranges are int64. :func:`grid_cluster` works in any dimension.
"""

from __future__ import annotations

import numpy as np

from ..core.binding import is_torch

__all__ = [
    "cluster_centroids",
    "cluster_ranges",
    "cluster_ranges_centroids",
    "from_matrix",
    "grid_cluster",
    "sort_clusters",
    "swap_axes",
]


def grid_cluster(x, size, anchor: str = "min"):
    """Labels in ``[0, C)`` of the cubic cells of side ``size`` (a number, or one per
    dimension) that hold the points ``x`` (N, D); cells are numbered in lexicographic
    order of their grid coordinates, empty cells get no label.

    ``anchor`` places the grid: ``"min"`` (pykeops.torch's) puts a cell corner at the
    points' minimum, ``floor((x - x.min(0)) / size)``; ``"origin"`` (pykeops.numpy's) at
    0, ``floor(x / size)``. The pykeops alias gives each of its two modules its own.

    >>> grid_cluster(np.array([[0.0], [0.1], [0.9], [0.05], [0.5]]), 0.2).tolist()
    [0, 0, 2, 0, 1]
    >>> x = np.array([[0.07], [0.12], [0.13], [0.26]])
    >>> grid_cluster(x, 0.1).tolist(), grid_cluster(x, 0.1, anchor="origin").tolist()
    ([0, 0, 0, 1], [0, 1, 1, 2])
    """
    if x.ndim != 2:
        raise ValueError(f"grid_cluster: x must have shape (N, D), got {tuple(x.shape)}")
    if anchor not in ("min", "origin"):
        raise ValueError(f"grid_cluster: anchor must be 'min' or 'origin', got {anchor!r}")
    if is_torch(x):
        import torch

        with torch.no_grad():
            size_t = torch.as_tensor(size, dtype=x.dtype, device=x.device)
            if torch.any(size_t <= 0):
                raise ValueError(f"grid_cluster: size must be positive, got {size!r}")
            if x.shape[0] == 0:
                return torch.zeros(0, dtype=torch.int64, device=x.device)
            corner = x.min(0).values if anchor == "min" else 0
            cells = torch.floor((x - corner) / size_t).long()
            _, labels = torch.unique(cells, dim=0, return_inverse=True)
        return labels
    size_a = np.asarray(size, dtype=np.float64)
    if np.any(size_a <= 0):
        raise ValueError(f"grid_cluster: size must be positive, got {size!r}")
    x = np.asarray(x)
    if x.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    corner = x.min(0) if anchor == "min" else 0
    cells = np.floor((x - corner) / size_a).astype(np.int64)
    _, labels = np.unique(cells, axis=0, return_inverse=True)
    return labels.reshape(-1).astype(np.int64)


def grid_cluster_at_origin(x, size):
    """pykeops.numpy.cluster's ``grid_cluster``: the grid anchored at 0,
    ``floor(x / size)`` (:func:`grid_cluster` with ``anchor="origin"``).

    >>> grid_cluster_at_origin(np.array([[0.07], [0.12], [0.13], [0.26]]), 0.1).tolist()
    [0, 1, 1, 2]
    """
    return grid_cluster(x, size, anchor="origin")


def sort_clusters(x, labels):
    """``(x sorted by label, sorted labels)``; ``x`` may be one array or a tuple/list of
    arrays with the same rows (sorted alike).

    The sort is stable: inside a cluster the points keep their order (pykeops leaves that
    order unspecified), so equal labels give the same result on NumPy, torch and every run.

    >>> sort_clusters(np.array([10.0, 11.0, 12.0, 13.0]), np.array([1, 0, 1, 0]))
    (array([11., 13., 10., 12.]), array([0, 0, 1, 1]))
    """
    if is_torch(labels):
        import torch

        sorted_labels, perm = torch.sort(labels.reshape(-1), stable=True)
    else:
        labels = np.asarray(labels).reshape(-1)
        perm = np.argsort(labels, kind="stable")
        sorted_labels = labels[perm]
    if isinstance(x, (tuple, list)):
        return type(x)(a[perm] for a in x), sorted_labels
    return x[perm], sorted_labels


def _bincount(labels, weights=None, minlength=0):
    if is_torch(labels):
        import torch

        return torch.bincount(labels.reshape(-1), weights=weights, minlength=minlength)
    return np.bincount(np.asarray(labels).reshape(-1), weights=weights, minlength=minlength)


def cluster_ranges(labels, Nlab=None):
    """(C, 2) ``[start, end)`` rows of each cluster of *sorted* labels (or of the counts
    ``Nlab`` per label)."""
    counts = _bincount(labels) if Nlab is None else Nlab
    if is_torch(counts):
        import torch

        ends = torch.cumsum(counts.long(), 0)
        return torch.stack([ends - counts.long(), ends], 1)
    counts = np.asarray(counts).astype(np.int64)
    ends = np.cumsum(counts)
    return np.stack([ends - counts, ends], 1)


def cluster_centroids(x, labels, Nlab=None, weights=None, weights_c=None):
    """(C, D) centroids ``Σ w_i x_i / Σ w_i`` of each label (weights 1 by default)."""
    C = int(labels.max()) + 1 if len(labels) else 0
    if is_torch(x):
        import torch

        lab = labels.reshape(-1).long()
        w = torch.ones(x.shape[0], dtype=x.dtype, device=x.device) if weights is None \
            else weights.reshape(-1).to(x.dtype)
        total = torch.zeros(C, x.shape[1], dtype=x.dtype, device=x.device)
        total.index_add_(0, lab, x * w[:, None])
        wc = torch.zeros(C, dtype=x.dtype, device=x.device).index_add_(0, lab, w) \
            if weights_c is None else weights_c.reshape(-1).to(x.dtype)
        return total / wc[:, None]
    x = np.asarray(x)
    lab = np.asarray(labels).reshape(-1)
    w = np.ones(x.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64).reshape(-1)
    total = np.zeros((C, x.shape[1]))
    np.add.at(total, lab, x * w[:, None])
    wc = np.bincount(lab, weights=w, minlength=C) if weights_c is None \
        else np.asarray(weights_c, dtype=np.float64).reshape(-1)
    return (total / wc[:, None]).astype(x.dtype)


def cluster_ranges_centroids(x, labels, weights=None, min_weight=1e-9):
    """``(ranges, centroids, weight of each cluster)`` of sorted labels; weights below
    ``min_weight`` count as ``min_weight`` (no cluster of zero weight)."""
    if weights is not None:
        if is_torch(weights):
            weights = weights.clamp(min=min_weight)
        else:
            weights = np.maximum(np.asarray(weights, dtype=np.float64), min_weight)
        wc = _bincount(labels, weights=weights.reshape(-1))
    else:
        wc = _bincount(labels)
        wc = wc.to(x.dtype) if is_torch(wc) else wc.astype(np.asarray(x).dtype)
    counts = _bincount(labels)
    return (cluster_ranges(labels, counts),
            cluster_centroids(x, labels, counts, weights=weights, weights_c=wc), wc)


def from_matrix(ranges_i, ranges_j, keep):
    """The ``ranges`` 6-tuple of a reduction from cluster ranges and a (Ci, Cj) boolean
    matrix ``keep`` of the pairs of clusters that interact.

    >>> r = from_matrix(np.array([[0, 2], [2, 5]]), np.array([[0, 3], [3, 4]]),
    ...                 np.array([[True, False], [True, True]]))
    >>> [a.tolist() for a in r]  # doctest: +NORMALIZE_WHITESPACE
    [[[0, 2], [2, 5]], [1, 3], [[0, 3], [0, 3], [3, 4]],
     [[0, 3], [3, 4]], [2, 3], [[0, 2], [2, 5], [2, 5]]]
    """
    shape = tuple(keep.shape)
    if shape != (len(ranges_i), len(ranges_j)):
        raise ValueError(f"from_matrix: keep has shape {shape}, expected "
                         f"({len(ranges_i)}, {len(ranges_j)}) (clusters of i, clusters of j)")
    if is_torch(keep) and keep.device.type == "cpu":  # NumPy's nonzero: several times faster
        import torch

        out = from_matrix(*(a.detach().numpy() for a in (ranges_i, ranges_j, keep)))
        return tuple(torch.from_numpy(a) for a in out)
    if is_torch(keep):
        import torch

        keep_b = keep.bool()
        _, cj = torch.nonzero(keep_b, as_tuple=True)  # row-major: by i, then j
        _, ci_t = torch.nonzero(keep_b.t(), as_tuple=True)  # by j, then i
        ranges_i, ranges_j = ranges_i.long(), ranges_j.long()
        return (ranges_i, keep_b.sum(1).cumsum(0), ranges_j[cj],
                ranges_j, keep_b.sum(0).cumsum(0), ranges_i[ci_t])
    keep_b = np.asarray(keep).astype(bool, copy=False)
    ranges_i, ranges_j = np.asarray(ranges_i, np.int64), np.asarray(ranges_j, np.int64)
    _, cj = np.nonzero(keep_b)
    _, ci_t = np.nonzero(np.ascontiguousarray(keep_b.T))
    return (ranges_i, np.cumsum(keep_b.sum(1)), ranges_j[cj],
            ranges_j, np.cumsum(keep_b.sum(0)), ranges_i[ci_t])


def swap_axes(ranges):
    """The ranges of the transposed reduction (i and j exchanged); None stays None."""
    return None if ranges is None else (*ranges[3:6], *ranges[0:3])
