"""The numba loops of the peers suite, written as an expert would (see
:mod:`benchmarks.peer_contenders`); compiled on first call, cached on disk (``cache=True``).
Importing this module needs numba."""

import llvmlite.ir as lir
import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from .expert import EXP2_COEFFS


@intrinsic
def as_float(typingctx, bits):  # reinterpret int32 bits as float32 (vectorizes)
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], lir.FloatType())
    return types.float32(types.int32), codegen


c = [np.float32(v) for v in EXP2_COEFFS]
c0, c1, c2, c3, c4, c5, c6 = c
lim, zero, inf = np.float32(125.0), np.float32(0.0), np.float32(np.inf)


@njit(fastmath=True, inline="always", cache=True)
def exp2neg(d):  # 2^-d, d >= 0, float32
    d = min(d, lim)
    n = np.rint(d)
    q = d - n
    p = c6 * q + c5
    p = p * q + c4
    p = p * q + c3
    p = p * q + c2
    p = p * q + c1
    p = p * q + c0
    return p * as_float(np.int32(127 - np.int32(n)) << 23)


@njit(parallel=True, fastmath=True, cache=True)
def gauss3(x, y0, y1, y2, b, out):  # scaled coordinates; y component-major
    for i in prange(x.shape[0]):
        a0, a1, a2 = x[i, 0], x[i, 1], x[i, 2]
        s = zero
        for j in range(b.shape[0]):
            d0, d1, d2 = a0 - y0[j], a1 - y1[j], a2 - y2[j]
            s += exp2neg(d0 * d0 + d1 * d1 + d2 * d2) * b[j]
        out[i] = s


@njit(parallel=True, fastmath=True, cache=True)
def gauss(x, y, b, out):  # scaled coordinates; y row-major (the k loop vectorizes)
    for i in prange(x.shape[0]):
        s = zero
        for j in range(y.shape[0]):
            d = zero
            for k in range(x.shape[1]):
                t = x[i, k] - y[j, k]
                d += t * t
            s += exp2neg(d) * b[j]
        out[i] = s


@njit(parallel=True, fastmath=True, cache=True)
def grad3(x, y0, y1, y2, b, g, coef, val, gx):  # value and gradient in one loop
    for i in prange(x.shape[0]):
        a0, a1, a2 = x[i, 0], x[i, 1], x[i, 2]
        s, t0, t1, t2 = zero, zero, zero, zero
        for j in range(b.shape[0]):
            d0, d1, d2 = a0 - y0[j], a1 - y1[j], a2 - y2[j]
            w = exp2neg(d0 * d0 + d1 * d1 + d2 * d2) * b[j]
            s += w
            t0 += w * d0
            t1 += w * d1
            t2 += w * d2
        val[i] = s
        f = coef * g[i]
        gx[i, 0], gx[i, 1], gx[i, 2] = f * t0, f * t1, f * t2


@njit(parallel=True, fastmath=True, cache=True)
def lse3(x, y0, y1, y2, out):  # two passes: the smallest distance, then the sum
    for i in prange(x.shape[0]):
        a0, a1, a2 = x[i, 0], x[i, 1], x[i, 2]
        m = inf
        for j in range(y0.shape[0]):
            d0, d1, d2 = a0 - y0[j], a1 - y1[j], a2 - y2[j]
            m = min(m, d0 * d0 + d1 * d1 + d2 * d2)
        s = zero
        for j in range(y0.shape[0]):
            d0, d1, d2 = a0 - y0[j], a1 - y1[j], a2 - y2[j]
            s += exp2neg(d0 * d0 + d1 * d1 + d2 * d2 - m)
        out[i] = np.float32(np.log(s)) - m * np.float32(np.log(2.0))


@njit(parallel=True, fastmath=True, cache=True)
def knn(x, y, K, out):  # y row-major; insertion into the sorted K best
    for i in prange(x.shape[0]):
        bd = np.full(K, inf, dtype=np.float32)
        bi = np.full(K, -1, dtype=np.int64)
        for j in range(y.shape[0]):
            d = zero
            for k in range(x.shape[1]):
                t = x[i, k] - y[j, k]
                d += t * t
            if d < bd[K - 1]:
                p = K - 1
                while p > 0 and bd[p - 1] > d:
                    bd[p], bi[p] = bd[p - 1], bi[p - 1]
                    p -= 1
                bd[p], bi[p] = d, j
        out[i, :] = bi


@njit(parallel=True, fastmath=True, cache=True)
def knn3(x, y0, y1, y2, K, out):  # D = 3 unrolled, y component-major
    for i in prange(x.shape[0]):
        a0, a1, a2 = x[i, 0], x[i, 1], x[i, 2]
        bd = np.full(K, inf, dtype=np.float32)
        bi = np.full(K, -1, dtype=np.int64)
        for j in range(y0.shape[0]):
            d0, d1, d2 = a0 - y0[j], a1 - y1[j], a2 - y2[j]
            d = d0 * d0 + d1 * d1 + d2 * d2
            if d < bd[K - 1]:
                p = K - 1
                while p > 0 and bd[p - 1] > d:
                    bd[p], bi[p] = bd[p - 1], bi[p - 1]
                    p -= 1
                bd[p], bi[p] = d, j
        out[i, :] = bi


KERNELS = {"numba": numba, "gauss3": gauss3, "gauss": gauss, "grad3": grad3, "lse3": lse3,
           "knn": knn, "knn3": knn3}


