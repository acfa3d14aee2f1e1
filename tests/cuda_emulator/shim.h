// CUDA as host C++: what a generated .cu needs to compile unmodified with g++, so that
// the emulator (runtime.cpp) can run it with one fiber per CUDA thread.
//
// Included (with -include) before the kernel source. The standard headers come first,
// before __CUDACC__ is defined, so that the C library sees a plain C++ compiler; the
// kernel's own #include lines are then no-ops. Built-in variables and barriers are the
// emulator's (thread-local: a block runs on one OS thread, its CUDA threads as fibers).
#pragma once
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <cmath>

#define __CUDACC__ 1
#define __CUDA_ARCH__ 900
#define __NVCC__ 1
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict
#define __grid_constant__
// Block-scope `__shared__ T x[n]` becomes a thread_local static: one copy per OS thread,
// reused by the blocks that thread runs (CUDA leaves shared memory uninitialised too).
// `extern __shared__ unsigned char lt_smem[]` (dynamic shared memory, at namespace
// scope) names the emulator's buffer of that name.
#define __shared__ thread_local

struct lt_emu_dim3 {
  unsigned int x, y, z;
};
typedef lt_emu_dim3 uint3;
typedef lt_emu_dim3 dim3;

extern thread_local lt_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
extern "C" void lt_emu_syncthreads(const char* file, int line);
extern "C" void lt_emu_syncwarp(unsigned mask, const char* file, int line);
extern "C" void lt_emu_trap(const char* file, int line);
#define __syncthreads() lt_emu_syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) lt_emu_syncwarp(0xffffffffu, __FILE__, __LINE__)
#define __trap() lt_emu_trap(__FILE__, __LINE__)
#define warpSize 32

// Read-only loads and the exact-rounding intrinsics: the host operations they name.
template <class T>
static inline T __ldg(const T* p) { return *p; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline double __drcp_rn(double a) { return 1.0 / a; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline float __int_as_float(int v) { float f; memcpy(&f, &v, 4); return f; }
static inline int __float_as_int(float f) { int v; memcpy(&v, &f, 4); return v; }
static inline double __longlong_as_double(long long v) { double f; memcpy(&f, &v, 8); return f; }
static inline long long __double_as_longlong(double f) { long long v; memcpy(&v, &f, 8); return v; }
static inline int __float2int_rn(float f) { return (int)nearbyintf(f); }
static inline float rcbrtf(float a) { return 1.0f / cbrtf(a); }
static inline double rcbrt(double a) { return 1.0 / cbrt(a); }
static inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
static inline double rsqrt(double a) { return 1.0 / sqrt(a); }
static inline float sinpif(float a) { return sinf((float)M_PI * a); }
static inline float cospif(float a) { return cosf((float)M_PI * a); }
static inline double sinpi(double a) { return sin(M_PI * a); }
static inline double cospi(double a) { return cos(M_PI * a); }
static inline float normcdff(float a) { return 0.5f * erfcf(-a * (float)M_SQRT1_2); }
static inline double normcdf(double a) { return 0.5 * erfc(-a * M_SQRT1_2); }
// The fast-math intrinsics (CUDA computes them approximately; here they are exact, which
// is why the emulator cannot show their accuracy). glibc has __expf, __sinf, ... itself.
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __saturatef(float a) { return a < 0.0f ? 0.0f : a > 1.0f ? 1.0f : a; }

// Warp-synchronous intrinsics: a rendezvous of the warp's threads (runtime.cpp).
extern "C" uint64_t lt_emu_warp_exchange(uint64_t value, int src_lane, const char* file, int line);
extern "C" unsigned lt_emu_warp_ballot(int pred, const char* file, int line);
template <class T>
static inline T lt_emu_shfl(T v, int src) {
  static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  bits = lt_emu_warp_exchange(bits, src, __FILE__, __LINE__);
  T out;
  memcpy(&out, &bits, sizeof(T));
  return out;
}
#define __shfl_sync(mask, v, src, ...) lt_emu_shfl((v), (int)(src) & 31)
#define __shfl_xor_sync(mask, v, lm, ...) lt_emu_shfl((v), (int)((threadIdx.x & 31) ^ (lm)))
#define __shfl_down_sync(mask, v, d, ...) lt_emu_shfl((v), (int)((threadIdx.x & 31) + (d)))
#define __shfl_up_sync(mask, v, d, ...) lt_emu_shfl((v), (int)((threadIdx.x & 31) - (d)))
#define __ballot_sync(mask, p) lt_emu_warp_ballot((p), __FILE__, __LINE__)
#define __any_sync(mask, p) (lt_emu_warp_ballot((p), __FILE__, __LINE__) != 0u)
#define __all_sync(mask, p) (lt_emu_warp_ballot((p), __FILE__, __LINE__) == 0xffffffffu)
#define __activemask() 0xffffffffu
