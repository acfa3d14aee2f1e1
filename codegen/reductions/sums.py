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

import numpy as np

from .. import ir
from ..arraymath import namespace_of
from ..compositions import concat
from .base import (
    PAIRS,
    TILES,
    Accumulator,
    Array,
    Hook,
    Output,
    Reduction,
    register,
    unrolled,
    write_code,
)


def _add(scheme: str, x: str) -> str:
    """The C statement adding ``x`` to the total ``s[k]``: compensated (Kahan's step, the
    error kept in ``c[k]``) under ``kahan_scheme``, else a plain add."""
    if scheme != "kahan_scheme":
        return f"s[k] += {x};"
    return (f"{{ const TA y = {x} - c[k]; const TA t = s[k] + y; c[k] = (t - s[k]) - y; "
            "s[k] = t; }")


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
    method = "sum"
    vector_op = "sum"
    method_doc = """\
    Sum over i (dim=0) or j (dim=1); ``dim=-1`` sums the vector (symbolic).

    As in pykeops, ``sum()`` without dim is ``sum(-1)`` (``min``, ``max``, ``argmin`` and
    ``argmax`` too); with reduction options but no dim it asks for the dim.
    Options as pykeops: ``sum_scheme`` ("block_sum" default, "direct_sum",
    "kahan_scheme"), ``dtype_acc`` / ``use_double_acc``, ``backend`` ("CPU", "GPU" ...
    too); ``device_id`` picks the GPU, ``use_fast_math=True`` allows approximate CUDA
    intrinsics; ``enable_chunks`` is accepted without effect;
    ``grad_mode`` for torch gradients; ``group`` (a ``torch.distributed`` process group,
    or a :class:`lazytensor.distributed.Sharding`) runs it over the group's ranks, each
    holding its own rows (:mod:`lazytensor.distributed`; every reduction takes it).
    An empty reduction (no j, or no i for dim=0) gives 0; NaN terms give NaN, +inf and
    -inf terms together give NaN, as in NumPy.

    Shapes: ``(N, M, D)`` gives ``(N, D)`` for ``dim=1`` and ``(M, D)`` for ``dim=0``;
    ``call=False`` returns the function of new arrays (one per variable) instead.

    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
    >>> D = Vi(x).sqdist(Vj(y))     # (3, 2): [[0, 4], [1, 1], [9, 1]]
    >>> D.sum(dim=1).tolist()
    [[4.0], [2.0], [10.0]]
    >>> D.sum(dim=0).tolist()
    [[10.0], [6.0]]
    """

    def outputs(self, F: int, opts: dict) -> list[Output]:
        return [Output(F, "value", 0.0)]

    def accumulator(self, F: int, opts: dict, form: str = TILES) -> Accumulator:
        """TILES: totals ``s`` and Kahan compensations ``c`` in TA; a tile summed in T first
        (``block_sum``), or term by term into TA. PAIRS: also a tile's partial ``p`` in T,
        added to the totals once per tile (one TA add per tile and component, none per
        pair, under ``block_sum``); its merges always compensate."""
        scheme = opts.get("sum_scheme", "block_sum")
        add = _add(scheme, "(TA)(x)")
        comps = f"for (int k = 0; k < {F}; ++k)"
        write = Hook("write", f"{{ {write_code(0, 'value', F, '(T)(s[k] - c[k])')} }}")
        if form == PAIRS:
            return Accumulator("", f"TA s[{F}]; TA c[{F}]; T p[{F}];  // totals, compensation "
                               "(Kahan), this tile's partial", (
                Hook("init", unrolled(f"{comps} {{ s[k] = 0; c[k] = 0; p[k] = 0; }}")),
                Hook("push", unrolled(f"{comps} p[k] += o[k];" if scheme == "block_sum" else
                                      f"{comps} s[k] += (TA)o[k];" if scheme == "direct_sum" else
                                      f"{comps} {{ const T x = o[k]; {add} }}")),
                Hook("flush", unrolled(f"{comps} {{ s[k] += (TA)p[k]; p[k] = 0; }}"
                                       if scheme == "block_sum" else "")),
                Hook("tile", "{\n#pragma unroll 2\n    for (int jj = 0; jj < nj; ++jj) "
                             f"{{ T o[{F}]; eval(jj, o); push(o, j0 + jj); }}\n    flush();\n  }}"),
                Hook("merge", unrolled(f"{comps} {{ const TA x = o.s[k] - o.c[k]; "
                                       f"{_add('kahan_scheme', 'x')} }}")),
                write), arg="o")
        tile_body = (
            f"{comps} {{ for (int jj = 0; jj < nj; ++jj) {{ const T x = fb[k * TJ + jj]; {add} }} }}"
            if scheme in ("direct_sum", "kahan_scheme") else
            f"{comps} {{ T t = 0;\n"
            f"      _Pragma(\"omp simd reduction(+:t)\") for (int jj = 0; jj < nj; ++jj) t += fb[k * TJ + jj];\n"
            f"      const T x = t; {add} }}"
        )
        return Accumulator("", f"TA s[{F}]; TA c[{F}];", (
            Hook("init", f"{{ {comps} {{ s[k] = 0; c[k] = 0; }} }}"),
            Hook("push", f"{{ {comps} {{ const T x = f[k]; {add} }} }}"),
            Hook("tile", f"{{ {tile_body} }}"),
            Hook("merge", f"{{ {comps} {{ const TA x = o.s[k] - o.c[k]; {_add(scheme, 'x')} }} }}"),
            write))

    def lanes_add(self, opts: dict) -> bool:
        return opts.get("sum_scheme", "block_sum") == "block_sum"

    def partial(self, values: Array, opts: dict, j0: int = 0) -> list:
        """(the sum, its compensation): float64, the compensation 0 for one block."""
        s = values.sum(axis=-2)
        return [s, np.zeros_like(s)]

    def merge(self, a: list, b: list, opts: dict) -> list:
        """Sums and compensations added; under ``kahan_scheme`` the rounding error of the
        sums' addition joins the compensation, exactly (Knuth's two-sum; none where the
        sum is infinite)."""
        s = a[0] + b[0]
        if opts.get("sum_scheme") != "kahan_scheme":
            return [s, a[1] + b[1]]
        bv = s - a[0]
        err = (a[0] - (s - bv)) + (b[0] - bv)
        xp = namespace_of(s)
        err = xp.where(s - s == 0, err, xp.zeros_like(err))
        return [s, a[1] + b[1] + err]

    def finalize(self, state: list, opts: dict) -> list:
        return [state[0] + state[1]]

    block_runs = (("sum", "all"),)

    def state_layout(self, opts: dict, dim: int) -> list:
        return [((dim,), "wide", 0.0), ((dim,), "wide", 0.0)]

    def from_block(self, outs: list, opts: dict, offset: int, dim: int) -> list:
        xp = namespace_of(outs[0])
        s = xp.float64(outs[0])
        return [s, xp.zeros_like(s)]

    def to_block(self, state: list, opts: dict, offset: int, m: int) -> list:
        return [state[0] + state[1]]

    def vjp_formula(self, F: ir.Node, saved: list, aux: bool, limits: bool = False) -> ir.Node:
        return F

    def dual(self, F: ir.Node, tangents: list) -> tuple:
        return concat([F, *tangents]), "sum", True

    def dual_outputs(self, outs: list, F: int) -> tuple:
        out, J = outs[0][..., :F], outs[0][..., F:]
        # k = J's width / F, explicit: with no rows at all, -1 would be ambiguous
        return out, J.reshape(*J.shape[:-1], J.shape[-1] // F, F)

