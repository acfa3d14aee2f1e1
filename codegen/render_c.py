"""C++ emission: the per-pair formula and reduction hooks (shared with CUDA), the CPU skeleton.

The formula becomes ``lt_formula(v0, v1, ..., out)``: one local array per IR node, each
line commented with the node it comes from. It and the reduction's ``Acc`` struct are
emitted by :func:`render_shared` as inline functions that g++ and nvcc both compile.
:func:`render_cpu_kernel` adds the CPU loop structure: OpenMP over blocks of rows,
a vectorizable inner loop over a tile of j (j-data transposed to one array per
component), and a split-j scheme with a merge when there are fewer rows than threads.

>>> from codegen import ir, ops
>>> x, y = ir.var(0, 3, "i"), ir.var(1, 3, "j")
>>> src = render_cpu_kernel(ops.apply("sum", ops.apply("mul", x, y)),
...                         [VarSpec(0, 3, "i"), VarSpec(1, 3, "j")], "sum", {}, "float32")
>>> "lt_run" in src and "lt_formula" in src
True
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ir, ops, reductions


@dataclass(frozen=True)
class VarSpec:
    """A bound variable slot of a kernel: its index, vector dimension and category."""

    index: int
    dim: int
    cat: str


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


def _prelude(dtype: str, acc_dtype: str) -> str:
    t = "float" if dtype == "float32" else "double"
    ta = "float" if acc_dtype == "float32" else "double"
    return f"""#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __CUDACC__
#define LT_HD __host__ __device__
#define LT_INLINE __forceinline__
#else
#define LT_HD
#define LT_INLINE inline __attribute__((always_inline))
#if defined(__x86_64__) && defined(_OPENMP)
{_simd_declarations()}
#endif
#endif
typedef {t} T;
typedef {ta} TA;
"""


def render_formula(formula: ir.Node, var_specs: list[VarSpec], dtype: str) -> str:
    """``lt_formula``: one pair's formula value, from pointers to each variable's data."""
    names: dict[int, str] = {}
    body: list[str] = []
    for v in var_specs:
        names[id(ir.var(v.index, v.dim, v.cat))] = f"v{v.index}"
    for n, node in enumerate(ir.topo_order(formula)):
        if id(node) in names:
            continue
        if node.op == "var":
            raise ValueError(f"formula variable {ir.to_text(node)} is not bound")
        name = f"t{n}"
        names[id(node)] = name
        comment = ir.to_text(node)
        comment = comment if len(comment) < 100 else comment[:97] + "..."
        if node.op == "const":
            vals = ", ".join(ops.c_literal(v, dtype) for v in node.params)
            body.append(f"  const T {name}[{node.dim}] = {{{vals}}};  // {comment}")
            continue
        opdef = ops.get(node.op)
        code = opdef.emit(node, name, [names[id(a)] for a in node.args], dtype)
        body.append(f"  T {name}[{node.dim}];  // {comment}")
        body.append(f"  {code}")
    root = names[id(formula)]
    body.append(f"  for (int k = 0; k < {formula.dim}; ++k) out[k] = {root}[k];")
    params = ", ".join(f"const T* __restrict__ v{v.index}" for v in var_specs)
    return (
        f"// formula: {ir.to_text(formula)[:2000]}\n"
        f"LT_HD LT_INLINE void lt_formula({params}, T* __restrict__ out) {{\n"
        + "\n".join(body)
        + "\n}\n"
    )


def tile_size(F: int, dtype: str) -> int:
    """j-tile length: the tile buffer F x TJ stays within 16 KB of L1."""
    size = 4 if dtype == "float32" else 8
    tj = 256
    while tj > 8 and F * tj * size > 16384:
        tj //= 2
    return tj


def render_shared(formula, var_specs, reduction: str, opts: dict, dtype: str) -> str:
    """The part of the source that both backends compile: prelude, formula, Acc."""
    red = reductions.get(reduction)
    acc_dtype = opts.get("dtype_acc") or ("float64" if reduction == "sum" else dtype)
    return (
        _prelude(dtype, acc_dtype)
        + f"static const int TJ = {tile_size(formula.dim, dtype)};\n"
        + render_formula(formula, var_specs, dtype)
        + red.acc_code(formula.dim, opts)
        + "\n"
    )


def render_cpu_kernel(formula, var_specs, reduction: str, opts: dict, dtype: str) -> str:
    """Complete C++ source of the CPU kernel ``lt_run`` (see the module docstring)."""
    F = formula.dim
    nv = len(var_specs)
    jvars = [v for v in var_specs if v.cat == "j"]
    lines = [render_shared(formula, var_specs, reduction, opts, dtype)]
    lines.append("#ifdef _OPENMP\n#include <omp.h>\n#endif\n")
    # rows: one i at a time, a tile of j at a time
    ptr_args = ", ".join(f"const T* __restrict__ P{v.index}" for v in var_specs)
    loads = []
    call_args = []
    for v in var_specs:
        if v.cat == "i":
            loads.append(f"    const T* v{v.index} = P{v.index} + i * {v.dim};")
            call_args.append(f"v{v.index}")
        elif v.cat == "p":
            call_args.append(f"P{v.index}")
        else:
            call_args.append(f"y{v.index}")
    jloads = "\n".join(
        f"        T y{v.index}[{v.dim}]; for (int k = 0; k < {v.dim}; ++k) y{v.index}[k] = P{v.index}[k * M + j0 + jj];"
        for v in jvars
    )
    lines.append(f"""
// Rows [i0, i1) against columns [jb, je): the j-loop over a tile is vectorized.
static void lt_rows({ptr_args}, int64_t M, int64_t i0, int64_t i1, int64_t jb, int64_t je,
                    Acc* accs) {{
  T fb[{F} * TJ];
  for (int64_t i = i0; i < i1; ++i) {{
{chr(10).join(loads)}
    Acc a; a.init();
    for (int64_t j0 = jb; j0 < je; j0 += TJ) {{
      const int nj = (int)((je - j0) < TJ ? (je - j0) : TJ);
      // GCC ivdep, not omp simd: omp simd privatizes the local arrays before inlining and
      // then fails to vectorize; with ivdep they are scalarized and the loop vectorizes.
      #pragma GCC ivdep
      for (int jj = 0; jj < nj; ++jj) {{
{jloads}
        T o[{F}];
        lt_formula({", ".join(call_args)}, o);
        for (int k = 0; k < {F}; ++k) fb[k * TJ + jj] = o[k];
      }}
      a.tile(fb, nj, j0);
    }}
    accs[i - i0] = a;
  }}
}}
""")
    transposes = "\n".join(
        f"""  if ({v.dim} > 1) {{
    Y[{v.index}] = (T*)malloc(sizeof(T) * (size_t)(vnb[{v.index}] * M * {v.dim} + 1));
    if (!Y[{v.index}]) {{ status = 1; goto done; }}
    #pragma omp parallel for num_threads(nthreads) if (nthreads > 1 && vnb[{v.index}] * M > 65536)
    for (int64_t r = 0; r < vnb[{v.index}] * M; ++r) {{
      const int64_t blk = r / M, j = r % M;
      const T* src = (const T*)vars[{v.index}] + r * {v.dim};
      T* dst = Y[{v.index}] + blk * M * {v.dim} + j;
      for (int k = 0; k < {v.dim}; ++k) dst[k * M] = src[k];
    }}
    base[{v.index}] = Y[{v.index}];
  }}"""
        for v in jvars
    )
    row_ptrs = ", ".join(f"base[{v.index}] + off[{v.index}]" for v in var_specs)
    lines.append(f"""
// Rows per work item; the per-row accumulators of one item stay within 64 KB of stack.
enum {{ LT_MAX_IB = (sizeof(Acc) * 64 <= 65536) ? 64 : (65536 / sizeof(Acc) >= 1 ? (int)(65536 / sizeof(Acc)) : 1) }};
// vars[v]: data of variable v, contiguous (batch..., rows, dim); vbs[v*nbd+k]: its element
// stride along batch dim k (0 where broadcast); vnb[v]: its number of (rows, dim) blocks.
// outs[o]: output o, contiguous (B, N, dim_o). Returns 0, or 1 when out of memory.
extern "C" int lt_run(int64_t N, int64_t M, int nbd, const int64_t* bshape,
                      const void* const* vars, const int64_t* vbs, const int64_t* vnb,
                      void* const* outs, int nthreads, int64_t jchunk) {{
  int status = 0;
  int64_t B = 1;
  for (int k = 0; k < nbd; ++k) B *= bshape[k];
  const T* base[{nv}];
  T* Y[{nv}];
  Acc* part = 0;
  for (int v = 0; v < {nv}; ++v) {{ base[v] = (const T*)vars[v]; Y[v] = 0; }}
  if (nthreads < 1) nthreads = 1;
  {{
{transposes}
  const int64_t nrows = B * N;
  int64_t IB = N / (8 * nthreads) + 1;
  if (IB > LT_MAX_IB) IB = LT_MAX_IB;
  const int64_t nIB = (N + IB - 1) / IB;
  const int64_t JC = (jchunk > 0 && jchunk < M) ? jchunk : (M > 0 ? M : 1);
  const int64_t nJC = (M + JC - 1) / JC > 0 ? (M + JC - 1) / JC : 1;
  if (nJC > 1) {{
    part = (Acc*)malloc(sizeof(Acc) * (size_t)(nrows * nJC));
    if (!part) {{ status = 1; goto done; }}
  }}
  const int64_t W = B * nIB * nJC;
  #pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (nthreads > 1 && W > 1)
  for (int64_t w = 0; w < W; ++w) {{
    const int64_t jc = w % nJC, rest = w / nJC, ib = rest % nIB, b = rest / nIB;
    int64_t off[{nv}];
    for (int v = 0; v < {nv}; ++v) off[v] = 0;
    for (int64_t k = nbd - 1, q = b; k >= 0; --k) {{
      const int64_t idx = q % bshape[k]; q /= bshape[k];
      for (int v = 0; v < {nv}; ++v) off[v] += idx * vbs[v * nbd + k];
    }}
    const int64_t i0 = ib * IB, i1 = (i0 + IB < N) ? i0 + IB : N;
    const int64_t jb = jc * JC, je = (jb + JC < M) ? jb + JC : M;
    Acc accs[LT_MAX_IB];
    lt_rows({row_ptrs}, M, i0, i1, jb, je, accs);
    for (int64_t i = i0; i < i1; ++i) {{
      if (nJC == 1) accs[i - i0].write(outs, b * N + i);
      else part[(b * N + i) * nJC + jc] = accs[i - i0];
    }}
  }}
  if (nJC > 1) {{
    #pragma omp parallel for num_threads(nthreads) if (nthreads > 1 && nrows > 64)
    for (int64_t r = 0; r < nrows; ++r) {{
      Acc a = part[r * nJC];
      for (int64_t c = 1; c < nJC; ++c) a.merge(part[r * nJC + c]);
      a.write(outs, r);
    }}
  }}
  }}
done:
  for (int v = 0; v < {nv}; ++v) free(Y[v]);
  free(part);
  return status;
}}
""")
    return "".join(lines)
