"""An expert's hand-written C loops for the Gaussian kernel product at D = 3, and the
machine's peak FMA throughput: the references of ``python -m benchmarks.bench --suite peers``.

Both are compiled at bench time with the compiler and flags of the kernels
(:func:`lazytensor.codegen.compilers.cpu_compiler`), so that they see the same vector width.

The loops (``a_i = sum_j exp(-|x_i - y_j|^2 / s2) b_j`` and its fused value + gradient in
x) are written as an expert would for this one formula:

- coordinates scaled once by ``sqrt(log2(e) / s2)``, so that a pair's exponent is
  ``-|x'_i - y'_j|^2`` in base 2: no multiply by 1/s2, no Cody-Waite reduction;
- ``2^-d = 2^-n * Q(d - n)`` with ``n = round(d)``, ``Q`` a degree-6 polynomial fitted
  (weighted least squares, Lawson's iteration) to ``2^-q`` on [-1/2, 1/2] in relative
  error: 1.1 ulp in float32 Horner. With AVX-512, n by ``vrndscaleps`` and the scaling by
  ``vscalefps`` (which also underflows to 0: no clamp); below it, n by the 1.5 * 2^23 shift
  and the scale built from its bits, ``d`` clamped at 125 (the exponent is never positive);
- y component-major and padded to the vector width (b = 0 in the padding), read once per
  ``R`` = 4 rows (2 for the value + gradient loop; each loaded vector of y_j serves that
  many rows' accumulators);
- float32 vector accumulators over blocks of ``JB`` columns (``JB / W`` terms per lane),
  added into float64 once per block: sums of 10^6 terms within 1e-6 of float64;
- OpenMP over blocks of rows, denormals flushed (as the kernels run).
"""

from __future__ import annotations

import ctypes
import tempfile
import time
from pathlib import Path

# Q(q) ~ 2^-q on [-1/2, 1/2] (coefficients of q^0 .. q^6)
EXP2_COEFFS = (1.0, -0.6931471824645996, 0.24022646248340607, -0.05550328642129898,
               0.009618489071726799, -0.0013399930903688073, 0.00015345810970757157)

EXPERT_CPP = r"""
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__)
#define VB 64
#elif defined(__AVX__)
#define VB 32
#else
#define VB 16
#endif
typedef float vf __attribute__((vector_size(VB)));
typedef int32_t vi __attribute__((vector_size(VB)));
enum { W = VB / 4, R = 4, RG = 2, JB = 1024 };  // rows a block: R, RG (with gradient)

extern "C" int vector_bytes() { return VB; }

#if defined(__AVX512F__)
#include <immintrin.h>
// 2^-d for d >= 0: n = round(-d) and q = -d - n by vrndscaleps, 2^n by vscalefps, which
// also takes the underflow (no clamp).
static inline vf exp2neg(vf d) {
  const vf u = -d;
  const vf n = (vf)_mm512_roundscale_ps((__m512)u, 0);
  const vf q = n - u;                   // round(d) - d, in [-1/2, 1/2]
  vf p = vf{} + C6;
  p = p * q + C5; p = p * q + C4; p = p * q + C3; p = p * q + C2; p = p * q + C1;
  p = p * q + C0;
  return (vf)_mm512_scalef_ps((__m512)p, (__m512)n);
}
#else
static inline vf exp2neg(vf d) {  // 2^-d for d >= 0
  d = d < 125.0f ? d : 125.0f;
  const vf shift = vf{} + 12583039.0f;  // 1.5 * 2^23 + 127
  const vf t = shift - d;               // low bits: 127 - round(d)
  const vf q = d + (t - shift);         // d - round(d), in [-1/2, 1/2]
  vf p = vf{} + C6;
  p = p * q + C5; p = p * q + C4; p = p * q + C3; p = p * q + C2; p = p * q + C1;
  p = p * q + C0;
  return p * (vf)((vi)t << 23);
}
#endif

static inline vf load(const float* p) { vf v; memcpy(&v, p, sizeof v); return v; }

struct Ftz {
  unsigned csr;
  Ftz() : csr(__builtin_ia32_stmxcsr()) { __builtin_ia32_ldmxcsr(csr | 0x8040); }
  ~Ftz() { __builtin_ia32_ldmxcsr(csr); }
};

// out_i = sum_j 2^(-|x_i - y_j|^2) b_j; x: N x 3 (N a multiple of R), y: 3 x M (M a
// multiple of W, b = 0 past the points), coordinates already scaled.
extern "C" void gauss3(int64_t N, int64_t M, const float* x, const float* y, const float* b,
                       float* out, int nthreads) {
  const float *y0 = y, *y1 = y + M, *y2 = y + 2 * M;
  #pragma omp parallel num_threads(nthreads)
  {
    Ftz ftz;
    #pragma omp for schedule(dynamic, 4)
    for (int64_t i = 0; i < N; i += R) {
      float a[R][3];
      double s[R][W];
      for (int r = 0; r < R; ++r) {
        for (int k = 0; k < 3; ++k) a[r][k] = x[3 * (i + r) + k];
        for (int l = 0; l < W; ++l) s[r][l] = 0;
      }
      for (int64_t j0 = 0; j0 < M; j0 += JB) {
        const int64_t j1 = j0 + JB < M ? j0 + JB : M;
        vf acc[R];
        for (int r = 0; r < R; ++r) acc[r] = vf{};
        for (int64_t j = j0; j < j1; j += W) {
          const vf u0 = load(y0 + j), u1 = load(y1 + j), u2 = load(y2 + j), bj = load(b + j);
          #pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            const vf d0 = a[r][0] - u0, d1 = a[r][1] - u1, d2 = a[r][2] - u2;
            acc[r] += exp2neg(d0 * d0 + d1 * d1 + d2 * d2) * bj;
          }
        }
        for (int r = 0; r < R; ++r) {
          float t[W];
          memcpy(t, &acc[r], sizeof t);
          for (int l = 0; l < W; ++l) s[r][l] += t[l];
        }
      }
      for (int r = 0; r < R; ++r) {
        double t = 0;
        for (int l = 0; l < W; ++l) t += s[r][l];
        out[i + r] = (float)t;
      }
    }
  }
}

// The value and its gradient in one loop (blocks of RG rows: its 4 accumulators a row fill
// the registers sooner): val_i = sum_j e_ij b_j and
// gx_i = coef * g_i * sum_j e_ij b_j (x_i - y_j) (scaled coordinates).
extern "C" void gauss3_grad(int64_t N, int64_t M, const float* x, const float* y,
                            const float* b, const float* g, float coef, float* val,
                            float* gx, int nthreads) {
  const float *y0 = y, *y1 = y + M, *y2 = y + 2 * M;
  #pragma omp parallel num_threads(nthreads)
  {
    Ftz ftz;
    #pragma omp for schedule(dynamic, 4)
    for (int64_t i = 0; i < N; i += RG) {
      float a[RG][3];
      double s[RG][4][W];
      for (int r = 0; r < RG; ++r) {
        for (int k = 0; k < 3; ++k) a[r][k] = x[3 * (i + r) + k];
        for (int c = 0; c < 4; ++c) for (int l = 0; l < W; ++l) s[r][c][l] = 0;
      }
      for (int64_t j0 = 0; j0 < M; j0 += JB) {
        const int64_t j1 = j0 + JB < M ? j0 + JB : M;
        vf acc[RG][4];
        for (int r = 0; r < RG; ++r) for (int c = 0; c < 4; ++c) acc[r][c] = vf{};
        for (int64_t j = j0; j < j1; j += W) {
          const vf u0 = load(y0 + j), u1 = load(y1 + j), u2 = load(y2 + j), bj = load(b + j);
          #pragma GCC unroll 8
          for (int r = 0; r < RG; ++r) {
            const vf d0 = a[r][0] - u0, d1 = a[r][1] - u1, d2 = a[r][2] - u2;
            const vf w = exp2neg(d0 * d0 + d1 * d1 + d2 * d2) * bj;
            acc[r][0] += w; acc[r][1] += w * d0; acc[r][2] += w * d1; acc[r][3] += w * d2;
          }
        }
        for (int r = 0; r < RG; ++r)
          for (int c = 0; c < 4; ++c) {
            float t[W];
            memcpy(t, &acc[r][c], sizeof t);
            for (int l = 0; l < W; ++l) s[r][c][l] += t[l];
          }
      }
      for (int r = 0; r < RG; ++r) {
        double t[4] = {0, 0, 0, 0};
        for (int c = 0; c < 4; ++c) for (int l = 0; l < W; ++l) t[c] += s[r][c][l];
        val[i + r] = (float)t[0];
        const double f = (double)coef * g[i + r];
        for (int k = 0; k < 3; ++k) gx[3 * (i + r) + k] = (float)(f * t[k + 1]);
      }
    }
  }
}

// Peak: 12 independent chains of vector operations per thread, `iters` steps each (kind
// 0: FMAs, 1: adds, 2: 6 chains of each); returns a sum so that nothing is optimised away.
#define CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define HALF(X) X(0) X(2) X(4) X(6) X(8) X(10)
#define OTHER(X) X(1) X(3) X(5) X(7) X(9) X(11)
#define DECL(k) vf a##k = vf{} + (float)k;
#define FMA(k) a##k = a##k * m + c;
#define ADD(k) a##k = a##k + c;
#define SUM(k) + a##k
static vf chains(int64_t iters, int kind) {
  const vf m = vf{} + 0.999999f, c = vf{} + 1e-6f;
  CHAINS(DECL)
  if (kind == 0) for (int64_t it = 0; it < iters; ++it) { CHAINS(FMA) }
  else if (kind == 1) for (int64_t it = 0; it < iters; ++it) { CHAINS(ADD) }
  else for (int64_t it = 0; it < iters; ++it) { HALF(FMA) OTHER(ADD) }
  return vf{} CHAINS(SUM);
}
extern "C" float peak(int64_t iters, int kind, int nthreads) {
  float total = 0;
  #pragma omp parallel num_threads(nthreads) reduction(+:total)
  {
    float t[W];
    const vf s = chains(iters, kind);
    memcpy(t, &s, sizeof t);
    for (int l = 0; l < W; ++l) total += t[l];
  }
  return total;
}

"""


def _source() -> str:
    consts = "".join(f"#define C{k} {c!r}f\n" for k, c in enumerate(EXP2_COEFFS))
    return EXPERT_CPP.replace("#include <stdint.h>", consts + "#include <stdint.h>", 1)


class ExpertLoops:
    """The C loops above, compiled like the kernels; call :meth:`gauss3`, :meth:`gauss3_grad`."""

    R = 4

    def __init__(self):
        from lazytensor.codegen.compilers import cpu_compiler

        with tempfile.TemporaryDirectory(prefix="lazytensor-expert-") as tmp:
            path = cpu_compiler().compile(_source(), Path(tmp), "expert", "expert loops")
            self.lib = ctypes.CDLL(str(path))
        i64, vp, ci, cf = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        self.lib.gauss3.argtypes = [i64, i64, vp, vp, vp, vp, ci]
        self.lib.gauss3_grad.argtypes = [i64, i64, vp, vp, vp, vp, cf, vp, vp, ci]
        self.lib.peak.argtypes = [i64, ci, ci]
        self.lib.peak.restype = cf
        self.width = self.lib.vector_bytes() // 4  # float32 lanes

    def _prepare(self, x, y, b, s2):
        """Scaled, padded copies: x (rows a multiple of R), y component-major, b."""
        import torch

        c = (1.4426950408889634 / s2) ** 0.5
        N, M, W = x.shape[0], y.shape[0], self.width
        Np, Mp = -(-N // self.R) * self.R, -(-M // W) * W
        xs = torch.zeros(Np, 3)
        xs[:N] = x * c
        ys = torch.zeros(3, Mp)
        ys[:, :M] = (y * c).T
        bs = torch.zeros(Mp)
        bs[:M] = b.reshape(-1)
        return c, xs, ys, bs

    def gauss3(self, x, y, b, s2, threads: int):
        """``sum_j exp(-|x_i - y_j|^2 / s2) b_j`` (x: N x 3, y: M x 3, b: M x 1) as N x 1."""
        import torch

        _, xs, ys, bs = self._prepare(x, y, b, s2)
        out = torch.empty(xs.shape[0])
        self.lib.gauss3(xs.shape[0], ys.shape[1], xs.data_ptr(), ys.data_ptr(), bs.data_ptr(),
                        out.data_ptr(), threads)
        return out[: x.shape[0], None]

    def gauss3_grad(self, x, y, b, s2, g, threads: int):
        """(value N x 1, gradient in x of ``(value * g).sum()``, N x 3), in one loop."""
        import torch

        c, xs, ys, bs = self._prepare(x, y, b, s2)
        gs = torch.zeros(xs.shape[0])
        gs[: x.shape[0]] = g.reshape(-1)
        val, gx = torch.empty(xs.shape[0]), torch.empty(xs.shape[0], 3)
        coef = -2.0 / s2 / c  # d/dx of -|x - y|^2 / s2, with x - y = (x' - y') / c
        self.lib.gauss3_grad(xs.shape[0], ys.shape[1], xs.data_ptr(), ys.data_ptr(),
                             bs.data_ptr(), gs.data_ptr(), coef, val.data_ptr(), gx.data_ptr(),
                             threads)
        N = x.shape[0]
        return val[:N, None], gx[:N]

    def rate(self, kind: str, seconds: float = 0.3) -> float:
        """Float32 operations per second of one core (lanes) of ``kind``: "fma", "add", or
        "mixed" (as many of each, independent). Timed in CPU time of this process on one
        thread, so that other jobs sharing the cores do not lower it."""
        code = {"fma": 0, "add": 1, "mixed": 2}[kind]

        def cpu_time(n):
            t = time.process_time()
            self.lib.peak(n, code, 1)
            return time.process_time() - t

        iters = 1 << 14
        while cpu_time(iters) < seconds / 3:
            iters *= 2
        best = min(cpu_time(iters) for _ in range(3))
        return iters * 12 * self.width / best


# The expert loops' operations per pair and vector lane, counted in the source above by the
# rules of benchmarks.floor: "fma" the multiply class (mul, FMA, vscalefps), "add" the rest
# (add, sub, negation, rounding, min).
EXPERT_OPS = {
    # d^2: 3 sub, 1 mul + 2 FMA; exp2neg: neg, round, sub, 6 FMA, scalef; the FMA into acc
    "gauss": {"fma": 3 + 6 + 1 + 1, "add": 3 + 3},
    # and w = e * b, acc0 += w, 3 FMAs acc_k += w * d_k in place of the FMA into acc
    "grad": {"fma": 3 + 6 + 1 + 1 + 3, "add": 3 + 3 + 1},
}
