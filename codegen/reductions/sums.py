"""The Sum reduction: Σ_j F, accumulated in float64 unless ``dtype_acc`` says otherwise.

Sum schemes (pykeops's ``sum_scheme``): ``block_sum`` (default: blocks of j summed in T,
then added to the TA accumulator), ``direct_sum`` (every term added to the accumulator)
and ``kahan_scheme`` (compensated). Its gradient is a Sum of the VJP formula, its dual
form a Sum of the formula and its tangents side by side.

>>> import numpy as np
>>> from lazytensor.codegen.reductions import get
>>> r = get("sum"); r.acc_dtype("float32", {}), r.finalize(r.partial(np.ones((4, 1)), {}), {})
('float64', [array([4.])])
"""

from __future__ import annotations

from .. import ir
from ..compositions import concat
from .base import Array, Output, Reduction, register, write_code


@register
class Sum(Reduction):
    """``Σ_j f_ij`` per component (``K.sum(dim=1)``, ``K @ v``, pykeops's ``Sum``):
    ``(N, F)``; 0 for an empty reduction. Accumulated in float64 unless ``dtype_acc``
    says otherwise; differentiable (its gradient is a Sum).

    >>> import numpy as np
    >>> f = np.array([[[0.0], [4.0]], [[1.0], [1.0]], [[9.0], [1.0]]])  # (N, M, F) = (3, 2, 1)
    >>> [out.tolist() for out in Sum().ref(f, {})]
    [[[4.0], [2.0], [10.0]]]
    """

    name = "sum"
    keops_name = "Sum"
    sum_type = True
    sum_schemes = ("direct_sum", "block_sum", "kahan_scheme")
    default_acc = "float64"
    gradient = "sum"
    fusable = True
    wide = "sum"

    def outputs(self, F: int, opts: dict) -> list[Output]:
        return [Output(F, "value", 0.0)]

    def acc_code(self, F: int, opts: dict) -> str:
        scheme = opts.get("sum_scheme", "block_sum")
        add = ("{ TA y = (TA)(x) - c[k]; TA t = s[k] + y; c[k] = (t - s[k]) - y; s[k] = t; }"
               if scheme == "kahan_scheme" else "s[k] += (TA)(x);")
        tile_body = (
            f"for (int k = 0; k < {F}; ++k) {{ for (int jj = 0; jj < nj; ++jj) {{ const T x = fb[k * TJ + jj]; {add} }} }}"
            if scheme in ("direct_sum", "kahan_scheme") else
            f"for (int k = 0; k < {F}; ++k) {{ T t = 0;\n"
            f"      _Pragma(\"omp simd reduction(+:t)\") for (int jj = 0; jj < nj; ++jj) t += fb[k * TJ + jj];\n"
            f"      const T x = t; {add} }}"
        )
        return f"""
struct Acc {{
  TA s[{F}]; TA c[{F}];
  LT_HD LT_INLINE void init() {{ for (int k = 0; k < {F}; ++k) {{ s[k] = 0; c[k] = 0; }} }}
  LT_HD LT_INLINE void push(const T* f, int64_t j) {{ for (int k = 0; k < {F}; ++k) {{ const T x = f[k]; {add} }} }}
  LT_INLINE void tile(const T* fb, int nj, int64_t j0) {{ {tile_body} }}
  LT_HD LT_INLINE void merge(const Acc& o) {{ for (int k = 0; k < {F}; ++k) {{ const TA x = o.s[k] - o.c[k]; {add.replace("(TA)(x)", "x")} }} }}
  LT_HD LT_INLINE void write(void* const* outs, int64_t row) const {{ {write_code(0, "value", F, "(T)(s[k] - c[k])")} }}
}};"""

    def lanes_add(self, opts: dict) -> bool:
        return opts.get("sum_scheme", "block_sum") == "block_sum"

    def partial(self, values: Array, opts: dict, j0: int = 0) -> list:
        return [values.sum(axis=-2)]

    def merge(self, a: list, b: list, opts: dict) -> list:
        return [a[0] + b[0]]

    def vjp_formula(self, F: ir.Node, saved: list, aux: bool, limits: bool = False) -> ir.Node:
        return F

    def dual(self, F: ir.Node, tangents: list) -> tuple:
        return concat([F, *tangents]), "sum", True

    def dual_outputs(self, outs: list, F: int) -> tuple:
        out, J = outs[0][..., :F], outs[0][..., F:]
        # k = J's width / F, explicit: with no rows at all, -1 would be ambiguous
        return out, J.reshape(*J.shape[:-1], J.shape[-1] // F, F)

