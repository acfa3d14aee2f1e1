"""C++ emission: the per-pair formula and reduction hooks (shared with CUDA), the CPU skeleton.

The formula becomes ``lt_formula(v0, v1, ..., out)``: one local array per IR node, each
line commented with the node it comes from. It and the reduction's ``Acc`` struct are
emitted by :func:`render_shared` as inline functions that g++ and nvcc both compile.
The CPU skeleton around them (:func:`render_cpu_kernel`) is in :mod:`lazytensor.codegen.render_cpu`.

>>> from lazytensor.codegen import ir, ops
>>> x, y = ir.var(0, 3, "i"), ir.var(1, 3, "j")
>>> src = render_cpu_kernel(ops.apply("sum", ops.apply("mul", x, y)),
...                         [VarSpec(0, 3, "i"), VarSpec(1, 3, "j")], "sum", {}, "float32")
>>> "lt_run" in src and "lt_formula" in src
True
"""

from __future__ import annotations

import re
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


# exp(x) = 2^n p(r): n = round(x / ln 2) by adding 1.5 * 2^m (the sum's low bits hold
# n + bias, so its bits shifted left give 2^(n-1) directly), r = x - n ln 2 in two parts
# (Cody-Waite; n * LN2_HI is exact), p(r) = 2 e^r by its Taylor polynomial (|r| <= 0.347:
# degree 7 in float, 13 in double, under 1 ulp). No branch and no call, so the pair loop
# vectorizes through it; the clamp gives inf above the range and 0 below ~2 * the
# smallest normal number (denormals are flushed anyway, see LtFtz), NaN stays NaN.
# libmvec's expf, by contrast, leaves its vector path for every lane that underflows.
_EXP = """#ifdef __CUDACC__
LT_HD LT_INLINE float lt_exp(float x) { return expf(x); }
LT_HD LT_INLINE double lt_exp(double x) { return exp(x); }
#else
LT_INLINE float lt_exp(float x) {
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
#endif
"""

# Function names the CPU kernel replaces by its own inline versions.
_CPU_RENAMES = re.compile(r"\bexpf?\(")


def cpu_renames(code: str) -> str:
    """``exp``/``expf`` calls -> ``lt_exp`` (vectorizable, see _EXP)."""
    return _CPU_RENAMES.sub("lt_exp(", code)


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
{_EXP}"""


def render_function(name: str, roots: list, var_specs: list, dtype: str,
                    rename=None, qualifiers: str = "LT_HD LT_INLINE") -> str:
    """``name(v..., out)``: the values of ``roots`` one after the other in ``out``.

    One local array per IR node, each commented with the node it comes from; ``rename``
    (a function of the code text) adapts it to a backend.
    """
    names: dict[int, str] = {}
    body: list[str] = []
    for v in var_specs:
        names[id(ir.var(v.index, v.dim, v.cat))] = f"v{v.index}"
    for n, node in enumerate(ir.topo_order(roots)):
        if id(node) in names:
            continue
        if node.op == "var":
            raise ValueError(f"formula variable {ir.to_text(node)} is not bound")
        tname = f"t{n}"
        names[id(node)] = tname
        comment = ir.to_text(node)
        comment = comment if len(comment) < 100 else comment[:97] + "..."
        if node.op == "const":
            vals = ", ".join(ops.c_literal(v, dtype) for v in node.params)
            body.append(f"  const T {tname}[{node.dim}] = {{{vals}}};  // {comment}")
            continue
        opdef = ops.get(node.op)
        code = opdef.emit(node, tname, [names[id(a)] for a in node.args], dtype)
        body.append(f"  T {tname}[{node.dim}];  // {comment}")
        body.append(f"  {rename(code) if rename else code}")
    offset = 0
    for root in roots:
        body.append(f"  for (int k = 0; k < {root.dim}; ++k) out[{offset} + k] = {names[id(root)]}[k];")
        offset += root.dim
    params = "".join(f"const T* __restrict__ v{v.index}, " for v in var_specs)
    return (
        f"{qualifiers} void {name}({params}T* __restrict__ out) {{\n"
        + "\n".join(body)
        + "\n}\n"
    )


def render_formula(formula: ir.Node, var_specs: list[VarSpec], dtype: str, rename=None) -> str:
    """``lt_formula``: one pair's formula value, from pointers to each variable's data."""
    return (f"// formula: {ir.to_text(formula)[:2000]}\n"
            + render_function("lt_formula", [formula], var_specs, dtype, rename))


def tile_size(F: int, dtype: str) -> int:
    """j-tile length: the tile buffer F x TJ stays within 16 KB of L1."""
    size = 4 if dtype == "float32" else 8
    tj = 256
    while tj > 8 and F * tj * size > 16384:
        tj //= 2
    return tj


def render_shared(formula, var_specs, reduction: str, opts: dict, dtype: str, *,
                  tj: int | None = None, rename=None) -> str:
    """The part of the source that both backends compile: prelude, formula, Acc.

    The CPU skeleton passes its planned formula, its tile length and its renames.
    """
    red = reductions.get(reduction)
    acc_dtype = red.acc_dtype(dtype, opts)
    return (
        _prelude(dtype, acc_dtype)
        + f"static const int TJ = {tj or tile_size(formula.dim, dtype)};\n"
        + render_formula(formula, var_specs, dtype, rename)
        + red.acc_code(formula.dim, opts)
        + "\n"
    )


from .render_cpu import render_cpu_kernel  # noqa: E402, F401  (re-exported; it uses the above)
