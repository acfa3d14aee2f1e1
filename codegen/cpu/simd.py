"""SIMD helpers of the CPU kernels, as C++ text: vector types, vectorizable functions.

- :func:`prelude_defs`: what the CPU backend adds to the shared prelude (declarations that
  let g++ vectorize calls to libmvec, and ``lt_exp``, a branch-free polynomial ``exp``,
  which the CPU renderer's table of functions puts in place of ``exp``);
- :func:`heap_defs`: the per-thread buffer of formula values too large for the stack;
- :func:`vector_header`: the vector type ``lt_vec`` of the target's width, the row block
  ``LT_R`` of the dot products, flushing denormals (``LtFtz``) and the per-thread staging
  buffer (``LtStage``).

>>> "lt_exp" in prelude_defs() and "LtFtz" in vector_header()
True
"""

from __future__ import annotations

# libmvec has vector versions of these (glibc >= 2.35); declaring them `simd` lets g++
# vectorize the j-loop through calls to them without -ffast-math.
_SIMD_UNARY = ("exp log sin cos tan sinh cosh tanh asin acos atan asinh acosh atanh erf erfc "
               "log1p expm1 exp2 log2 log10 cbrt").split()
_SIMD_BINARY = ("pow", "atan2", "hypot")


def _simd_declarations() -> str:
    lines = []
    for name in _SIMD_UNARY:
        for t, suffix in (("float", "f"), ("double", "")):
            lines.append(f'_Pragma("omp declare simd notinbranch") extern "C" {t} {name}{suffix}({t}) noexcept;')
    for name in _SIMD_BINARY:
        for t, suffix in (("float", "f"), ("double", "")):
            lines.append(f'_Pragma("omp declare simd notinbranch") extern "C" {t} {name}{suffix}({t}, {t}) noexcept;')
    return "\n".join(lines)


# exp(x) = 2^n p(r): n = round(x / ln 2) by adding 1.5 * 2^m (the sum's low bits hold
# n + bias, so its bits shifted left give 2^(n-1) directly), r = x - n ln 2 in two parts
# (Cody-Waite; n * LN2_HI is exact), p(r) = 2 e^r by its Taylor polynomial (|r| <= 0.347:
# degree 7 in float, 13 in double, under 1 ulp). No branch and no call, so the pair loop
# vectorizes through it; the clamp gives inf above the range and 0 below ~2 * the
# smallest normal number (denormals are flushed anyway, see LtFtz), NaN stays NaN.
# libmvec's expf, by contrast, leaves its vector path for every lane that underflows.
_EXP = """LT_INLINE float lt_exp(float x) {
  x = x < -87.6f ? -87.6f : x;
  x = x > 89.0f ? 89.0f : x;
  const float shift = 12583038.0f;  // 1.5 * 2^23 + 126
  const float t = x * 1.44269504088896341f + shift;
  const float n = t - shift;
  float r = x - n * 0.693145751953125f;
  r = r - n * 1.42860682030941723e-6f;
  float p = 2.0f / 5040.0f;
  p = p * r + 2.0f / 720.0f; p = p * r + 2.0f / 120.0f; p = p * r + 2.0f / 24.0f;
  p = p * r + 2.0f / 6.0f; p = p * r + 1.0f; p = p * r + 2.0f; p = p * r + 2.0f;
  uint32_t bits; memcpy(&bits, &t, 4); bits <<= 23;
  float s; memcpy(&s, &bits, 4);
  return p * s;
}
LT_INLINE double lt_exp(double x) {
  x = x < -708.7 ? -708.7 : x;
  x = x > 710.0 ? 710.0 : x;
  const double shift = 6755399441056766.0;  // 1.5 * 2^52 + 1022
  const double t = x * 1.4426950408889634074 + shift;
  const double n = t - shift;
  double r = x - n * 0.693147180369123816490;
  r = r - n * 1.90821492927058770002e-10;
  double p = 2.0 / 6227020800.0;
  p = p * r + 2.0 / 479001600.0; p = p * r + 2.0 / 39916800.0; p = p * r + 2.0 / 3628800.0;
  p = p * r + 2.0 / 362880.0; p = p * r + 2.0 / 40320.0; p = p * r + 2.0 / 5040.0;
  p = p * r + 2.0 / 720.0; p = p * r + 2.0 / 120.0; p = p * r + 2.0 / 24.0;
  p = p * r + 2.0 / 6.0; p = p * r + 1.0; p = p * r + 2.0; p = p * r + 2.0;
  uint64_t bits; memcpy(&bits, &t, 8); bits <<= 52;
  double s; memcpy(&s, &bits, 8);
  return p * s;
}
"""

def prelude_defs() -> str:
    """The CPU's additions to the shared prelude (after ``T``, ``TA`` and ``LT_INLINE``)."""
    return f"""#if defined(__x86_64__) && defined(_OPENMP)
{_simd_declarations()}
#endif
{_EXP}"""


def heap_defs() -> str:
    """``lt_heap``: the per-thread buffer of the formula values too large for the stack
    (:mod:`lazytensor.codegen.footprint`), kept and grown across calls; ``lt_rows``
    reserves it before any function reads ``lt_heap.p``."""
    return """// Formula values too large for the stack, per thread (reserved by lt_rows).
struct LtHeap {
  T* p = 0;
  size_t n = 0;
  ~LtHeap() { free(p); }
  bool reserve(size_t len) {
    if (len > n) {
      free(p);
      void* q = 0;
      p = posix_memalign(&q, 64, sizeof(T) * len) == 0 ? (T*)q : 0;
      n = p ? len : 0;
    }
    return p != 0;
  }
};
static thread_local LtHeap lt_heap;
"""


def vector_header() -> str:
    return """
#if defined(__AVX512F__)
#define LT_VB 64
#elif defined(__AVX__)
#define LT_VB 32
#else
#define LT_VB 16
#endif
typedef T lt_vec __attribute__((vector_size(LT_VB)));
// Dot products: blocks of LT_R rows x panels of LT_NR = 2 vectors of columns, so that the
// LT_R x 2 accumulators, the 2 vectors of B and a broadcast fill the registers (32 with
// AVX-512, 16 below). LT_R is also the row block of kernels with dot products.
#if LT_VB == 64
#define LT_R 12
#else
#define LT_R 6
#endif
enum { LT_W = LT_VB / (int)sizeof(T), LT_NR = 2 * LT_W };
#if defined(__x86_64__) || defined(__i386__)
// Denormals flushed to zero, and read as zero, while a kernel runs (restored after).
struct LtFtz {
  unsigned csr;
  LtFtz() : csr(__builtin_ia32_stmxcsr()) { __builtin_ia32_ldmxcsr(csr | 0x8040); }
  ~LtFtz() { __builtin_ia32_ldmxcsr(csr); }
};
#else
struct LtFtz {};
#endif
// The staging buffer of the calling thread, kept (and grown) across calls.
struct LtStage {
  T* p = 0;
  size_t n = 0;
  ~LtStage() { free(p); }
  T* get(size_t len) {
    if (len > n) {
      free(p);
      void* q = 0;
      p = posix_memalign(&q, 64, sizeof(T) * len) == 0 ? (T*)q : 0;
      n = p ? len : 0;
    }
    return p;
  }
};
static thread_local LtStage lt_stage;
"""
