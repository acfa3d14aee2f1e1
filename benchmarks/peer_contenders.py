"""The contenders of the peers suite (``python -m benchmarks.bench --suite peers``), each a
function of the workload's data returning the result on every row.

Workload kinds: ``gauss`` (``a_i = sum_j exp(-|x_i - y_j|^2 / s2) b_j``), ``knn`` (the
indices of the K nearest y_j), ``lse`` (``log sum_j exp(-|x_i - y_j|^2 / s2)``) and ``grad``
(``gauss`` and the gradient in x of ``(a * g).sum()``, as ``(a, gx)``).

- ``torch``: ``|x|^2 + |y|^2 - 2 x y^T`` by BLAS on blocks of rows, then exp / topk /
  logsumexp (chunked autograd for ``grad``);
- ``torch.compile``: inductor on the sum-over-j form (``(x[:, None] - y[None]) ** 2``),
  which it fuses into loops, on blocks of rows (padded: one shape, one compile);
- ``numba``: loops written by hand, ``@njit(parallel=True, fastmath=True)``, ``prange``
  over i and j inner, D unrolled at D = 3, a branch-free polynomial exp that vectorizes
  (rint, a degree-6 polynomial, the scale built from the exponent's bits), float32 row
  accumulators; k-NN by insertion into a sorted list of K;
- ``jax``: ``lax.map`` over blocks of rows of the matrix-product form, ``jit``;
- ``faiss``: ``IndexFlatL2`` (k-NN only).

Optional packages (numba, jax, faiss) are imported when first needed; :func:`missing`
says which are not importable, and their contenders are skipped with that note.
"""

from __future__ import annotations

import importlib

OPTIONAL = {"numba": "numba", "jax": "jax", "faiss": "faiss"}
KNN_K = 10
COMPILE_BLOCK = 1024  # rows per block of the torch.compile contender
_BLOCK_FLOATS = 1 << 25  # rows per block: block x M float32 within 128 MiB


def missing(name: str) -> str | None:
    """Why the optional package behind contender ``name`` cannot be used, or None."""
    module = OPTIONAL.get(name)
    if module is None:
        return None
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any failure to import skips the contender
        return f"skipped: {module} not importable ({type(e).__name__})"
    return None


def _rows(M: int, N: int) -> int:
    return max(1, min(N, _BLOCK_FLOATS // max(1, M)))


# ------------------------------------------------------------------ torch (dense, compile)


def _d2(xc, y, y2):
    import torch

    return torch.addmm(y2[None, :], xc, y.T, alpha=-2).add_((xc * xc).sum(1, keepdim=True)) \
        .clamp_(min=0)


def torch_dense(kind: str, x, y, b, s2, g=None):
    import torch

    y2 = (y * y).sum(1)
    step = _rows(y.shape[0], x.shape[0])
    parts = []
    for i0 in range(0, x.shape[0], step):
        xc = x[i0:i0 + step]
        if kind == "grad":
            xc = xc.clone().requires_grad_(True)
            a = torch.exp(_d2(xc, y, y2) * (-1 / s2)) @ b
            (a[:, 0] * g[i0:i0 + step]).sum().backward()
            parts.append((a.detach(), xc.grad))
            continue
        with torch.no_grad():
            d2 = _d2(xc, y, y2)
            if kind == "gauss":
                parts.append(d2.mul_(-1 / s2).exp_() @ b)
            elif kind == "knn":
                parts.append(d2.topk(KNN_K, dim=1, largest=False).indices)
            else:
                parts.append(torch.logsumexp(d2.mul_(-1 / s2), dim=1))
    if kind == "grad":
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    return torch.cat(parts)


def _sigma_j(kind: str, s2: float):
    """The sum-over-j form of ``kind`` on a block of rows, for torch.compile."""
    import torch

    def d2(xc, y):
        return ((xc[:, None, :] - y[None, :, :]) ** 2).sum(-1)

    if kind in ("gauss", "grad"):
        return lambda xc, y, b: (torch.exp(-d2(xc, y) / s2) * b[None, :, 0]).sum(1, keepdim=True)
    if kind == "knn":
        return lambda xc, y, b: torch.topk(d2(xc, y), KNN_K, dim=1, largest=False).indices
    return lambda xc, y, b: torch.logsumexp(-d2(xc, y) / s2, dim=1)


def torch_compiled(kind: str, s2: float, backend: str = "inductor", block: int = COMPILE_BLOCK):
    """A function of (x, y, b[, g]) running the compiled sum-over-j form on blocks of
    ``block`` rows (the last one padded, so that one shape is compiled)."""
    import torch

    fn = torch.compile(_sigma_j(kind, s2), backend=backend, dynamic=False)

    def run(x, y, b, g=None):
        N = x.shape[0]
        B = min(block, N)
        Np = -(-N // B) * B
        xp = torch.zeros(Np, x.shape[1])
        xp[:N] = x
        parts = []
        for i0 in range(0, Np, B):
            if kind == "grad":
                xc = xp[i0:i0 + B].clone().requires_grad_(True)
                gc = torch.zeros(B)
                gc[: max(0, min(B, N - i0))] = g[i0:i0 + B]
                a = fn(xc, y, b)
                (a[:, 0] * gc).sum().backward()
                parts.append((a.detach(), xc.grad))
            else:
                with torch.no_grad():
                    parts.append(fn(xp[i0:i0 + B], y, b))
        if kind == "grad":
            return torch.cat([p[0] for p in parts])[:N], torch.cat([p[1] for p in parts])[:N]
        return torch.cat(parts)[:N]

    return run


# ------------------------------------------------------------------ numba


def numba_kernels() -> dict:
    """The hand-written numba loops (:mod:`benchmarks.numba_loops`, cached on disk)."""
    from . import numba_loops

    return numba_loops.KERNELS


def numba_contender(kind: str, D: int, threads: int):
    """A function of (x, y, b, s2[, g]) running the numba loop of ``kind``, or None where
    none is written (log-sum-exp at D != 3)."""
    import numpy as np

    if kind in ("lse", "grad") and D != 3:
        return None
    k = numba_kernels()

    def scaled(x, y, s2):
        c = np.float32((1.4426950408889634 / s2) ** 0.5)
        return np.ascontiguousarray(x.numpy() * c), np.ascontiguousarray(y.numpy() * c), c

    def run(x, y, b, s2, g=None):
        k["numba"].set_num_threads(threads)
        N, D = x.shape
        xs, ys, c = scaled(x, y, s2) if kind != "knn" else (x.numpy(), y.numpy(), 1.0)
        yt = [np.ascontiguousarray(ys[:, q]) for q in range(D)] if D == 3 else None
        bb = np.ascontiguousarray(b.numpy()[:, 0])
        if kind == "knn":
            out = np.empty((N, KNN_K), np.int64)
            if D == 3:
                k["knn3"](xs, *yt, KNN_K, out)
            else:
                k["knn"](xs, ys, KNN_K, out)
            return out
        if kind == "lse":
            out = np.empty(N, np.float32)
            k["lse3"](xs, *yt, out)
            return out
        if kind == "grad":
            val, gx = np.empty(N, np.float32), np.empty((N, 3), np.float32)
            k["grad3"](xs, *yt, bb, g.numpy(), np.float32(-2.0 / s2 / c), val, gx)
            return val, gx
        out = np.empty(N, np.float32)
        if D == 3:
            k["gauss3"](xs, *yt, bb, out)
        else:
            k["gauss"](xs, ys, bb, out)
        return out

    return run


# ------------------------------------------------------------------ JAX, faiss


def jax_contender(kind: str, N: int, M: int, s2: float):
    """A jitted function of (x, y, b[, g]) (numpy float32) mapping over blocks of rows."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    B = _rows(M, N)
    nb = -(-N // B)

    def d2(xb, y):
        return jnp.maximum((xb * xb).sum(1)[:, None] + (y * y).sum(1)[None, :] - 2 * xb @ y.T, 0)

    def block(args):
        xb, y, b, gb = args
        if kind == "gauss":
            return jnp.exp(-d2(xb, y) / s2) @ b
        if kind == "knn":
            return jax.lax.top_k(-d2(xb, y), KNN_K)[1]
        if kind == "lse":
            return jax.nn.logsumexp(-d2(xb, y) / s2, axis=1)

        def loss(xb):
            a = jnp.exp(-d2(xb, y) / s2) @ b
            return (a[:, 0] * gb).sum(), a
        (_, a), gx = jax.value_and_grad(loss, has_aux=True)(xb)
        return a, gx

    @jax.jit
    def mapped(xr, y, b, gr):
        n = xr.shape[0]
        return jax.lax.map(lambda a: block((a[0], y, b, a[1])), (xr, gr)) if n else None

    def run(x, y, b, g=None):
        D = x.shape[1]
        xp = np.zeros((nb * B, D), np.float32)
        xp[:N] = x.numpy()
        gp = np.zeros(nb * B, np.float32)
        if g is not None:
            gp[:N] = g.numpy()
        out = mapped(xp.reshape(nb, B, D), y.numpy(), b.numpy(), gp.reshape(nb, B))
        if kind == "grad":
            a, gx = out
            return np.asarray(a).reshape(-1)[:N], np.asarray(gx).reshape(-1, D)[:N]
        out = np.asarray(jax.block_until_ready(out))
        return out.reshape((nb * B,) + out.shape[2:])[:N]

    return run


def faiss_knn(threads: int):
    """k-NN by faiss's exact IndexFlatL2 (index built in the call)."""
    import faiss

    def run(x, y):
        faiss.omp_set_num_threads(threads)
        index = faiss.IndexFlatL2(x.shape[1])
        index.add(y.numpy())
        return index.search(x.numpy(), KNN_K)[1]

    return run
