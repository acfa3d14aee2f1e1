"""The log-sum-exp family: LogSumExp (weighted too), SumSoftMaxWeight, Max_SumShiftExp.

Each accumulates ``(m, s)``: the running maximum ``m`` of the scalar formula ``f`` and sums
``s[c] = Σ_j exp(f_j - m) w_cj`` (``w = 1`` unweighted; SumSoftMaxWeight keeps the plain
``Σ_j exp(f_j - m)`` in ``s[0]``, ``total_sum``). Their gradients are Sums of formulas that
read the saved outputs; LogSumExp's dual form is a softmax-weighted sum of its tangents.

>>> import numpy as np
>>> from lazytensor.codegen.reductions import get
>>> r = get("logsumexp"); f = np.log(np.array([[1.0], [2.0], [5.0]]))
>>> both = r.merge(r.partial(f[:1], {}), r.partial(f[1:], {}, 1), {})
>>> round(float(np.exp(r.finalize(both, {})[0][0])), 12)
8.0
"""

from __future__ import annotations

import numpy as np

from .. import ir
from ..arraymath import namespace_of
from ..compositions import concat
from ..ops import apply
from .base import PAIRS, TILES, Accumulator, Array, Hook, Output, Reduction, register, write_code

# Online log-sum-exp: (m, s) represents exp(m) * s. Tiles take their max first so the
# sum of exponentials vectorizes; NaN propagates through s. Infinite terms follow the
# limits (and the reference): with m = +inf each +inf term counts exp(0) = 1 and the finite
# ones 0; -inf terms count 0, so a row of -inf only keeps s = 0 (as an empty row).
LSE_ADD = """
// (m, s) stands for exp(m) * s. Adds the terms t (relative to tm); NaN propagates, +inf
// terms count 1 each (exp(inf - inf) would be NaN), -inf terms nothing.
LT_HD LT_INLINE void lt_lse_add(TA& m, TA* s, const TA* t, int n, TA tm) {
  if (tm != tm) { m = tm; for (int c = 0; c < n; ++c) s[c] = tm; return; }  // NaN max, as numpy
  if (tm > m) { const TA sc = exp(m - tm); for (int c = 0; c < n; ++c) s[c] = s[c] * sc + t[c]; m = tm; }
  else if (tm == m) { for (int c = 0; c < n; ++c) s[c] += t[c]; }
  else { const TA sc = exp(tm - m); for (int c = 0; c < n; ++c) s[c] += t[c] * sc; }
}
"""
_TILE_MAX = """// The largest of a tile's terms, NaN if one is NaN (the CPU tiles' first pass).
LT_INLINE T lt_tile_max(const T* f, int nj) {
  T tm = -(T)INFINITY; int nan = 0;
  _Pragma("omp simd reduction(max:tm) reduction(|:nan)")
  for (int jj = 0; jj < nj; ++jj) { const T x = f[jj]; nan |= (x != x); tm = x > tm ? x : tm; }
  return nan ? (T)NAN : tm;
}
"""
# The TILES form's helpers (the CPU's wide softmax-weighted sums use them too).
LSE_HELPERS = LSE_ADD + _TILE_MAX
_NMAX = """// max that keeps a NaN
LT_HD LT_INLINE T lt_nmax(T a, T b) { return (a != a || a > b) ? a : b; }
"""


def lse_subtile(F: int) -> int:
    """Pairs per sub-tile of the PAIRS form: their F values each stay in registers."""
    s = 16
    while s > 1 and s * F > 32:
        s //= 2
    return s


class _LSEBase(Reduction):
    """m (scalar) and sums s[0..nsum) of exp(f - m) * w (w = 1 for s[0] when unweighted)."""

    sum_type = True
    total_sum = False  # s[0] is Σ exp(f - m) itself, the weights' sums follow

    def check(self, F: int, opts: dict, M: int | None = None) -> None:
        if self.weighted and F < 2:
            raise ValueError(f"{self.name}: needs a weight (formula dimension {F})")
        if not self.weighted and F != 1:
            raise ValueError(f"{self.name}: the formula must be scalar, got dimension {F}")

    def n_sums(self, F: int) -> int:
        return 1

    def weight_code(self) -> str:
        """C expression of the weight of sum c for the term at ``{f}[{jj}]`` (row stride
        ``{stride}`` between components)."""
        return "(T)1"

    def writes(self, F: int) -> str:
        """C statements writing one row's outputs from ``m`` and ``s``."""
        raise NotImplementedError

    def accumulator(self, F: int, opts: dict, form: str = TILES) -> Accumulator:
        """``m`` and the sums ``s`` in TA (``exp(m) * s``), joined by ``lt_lse_add``. TILES:
        a tile's max first, then its exponentials in a vectorized pass. PAIRS: a tile's
        partial ``(pm, ps)`` in T, in sub-tiles of :func:`lse_subtile` pairs (their max,
        then one exp per pair), joined to the totals once per tile."""
        nsum, weights, writes = self.n_sums(F), self.weight_code(), self.writes(F)
        init = f"m = -(TA)INFINITY; for (int c = 0; c < {nsum}; ++c) s[c] = 0;"
        merge = Hook("merge", "{ if (o.m != -(TA)INFINITY || o.m != o.m) "
                              f"lt_lse_add(m, s, o.s, {nsum}, o.m); }}")
        write = Hook("write", f"{{ {writes} }}")
        if form == PAIRS:
            return self._pairs(F, nsum, weights, merge, write)
        return Accumulator(LSE_HELPERS, f"TA m; TA s[{nsum}];", (
            Hook("init", f"{{ {init} }}"),
            Hook("push", f"""{{
    if (f[0] == -(T)INFINITY) return;
    TA t[{nsum}]; for (int c = 0; c < {nsum}; ++c) t[c] = {weights.format(f="f", jj="0", stride="1")};
    lt_lse_add(m, s, t, {nsum}, (TA)f[0]); }}"""),
            Hook("tile", f"""{{
    const T tm = lt_tile_max(fb, nj);
    if (tm == -(T)INFINITY) return;
    TA t[{nsum}];
    if (tm == (T)INFINITY) {{  // exp(inf - inf) would be NaN: count the +inf terms
      for (int c = 0; c < {nsum}; ++c) {{ T a = 0;
        for (int jj = 0; jj < nj; ++jj) if (fb[jj] == tm) a += {weights.format(f="fb", jj="jj", stride="TJ")};
        t[c] = a; }}
      lt_lse_add(m, s, t, {nsum}, (TA)tm); return;
    }}
    for (int c = 0; c < {nsum}; ++c) {{ T a = 0;
      _Pragma("omp simd reduction(+:a)") for (int jj = 0; jj < nj; ++jj) a += lt_exp(fb[jj] - tm) * {weights.format(f="fb", jj="jj", stride="TJ")};
      t[c] = a; }}
    lt_lse_add(m, s, t, {nsum}, (TA)tm); }}"""),
            merge, write))

    def _pairs(self, F: int, nsum: int, weights: str, merge: Hook, write: Hook) -> Accumulator:
        S = lse_subtile(F)
        w_of = weights.format(f="ov[q]", jj="0", stride="1")
        w_push = weights.format(f="o", jj="0", stride="1")
        return Accumulator(LSE_ADD + _NMAX, f"""TA m; TA s[{nsum}];   // totals: exp(m) * s
  T pm; T ps[{nsum}];   // this tile's partial""", (
            Hook("init", f"""{{
    m = -(TA)INFINITY; pm = -(T)INFINITY;
#pragma unroll
    for (int c = 0; c < {nsum}; ++c) {{ s[c] = 0; ps[c] = 0; }}
  }}"""),
            Hook("push", f"""{{
    const T x = o[0];
    if (x == -(T)INFINITY) return;
    const bool up = x > pm;
    const T e = x == pm ? (T)1 : exp(-fabs(x - pm));
    const T sc = up ? e : (T)1, et = up ? (T)1 : e;
#pragma unroll
    for (int c = 0; c < {nsum}; ++c) ps[c] = ps[c] * sc + et * {w_push};
    pm = up || x != x ? x : pm;
  }}""", comment="// one pair: exp(-|f - pm|) is either the new term or the old partial's scale"),
            Hook("flush", f"""{{
    if (pm == -(T)INFINITY && !(ps[0] != ps[0])) return;
    TA t[{nsum}];
#pragma unroll
    for (int c = 0; c < {nsum}; ++c) {{ t[c] = (TA)ps[c]; ps[c] = 0; }}
    lt_lse_add(m, s, t, {nsum}, (TA)pm);
    pm = -(T)INFINITY;
  }}"""),
            Hook("tile", f"""{{
    for (int jb = 0; jb < nj; jb += {S}) {{
      T ov[{S}][{F}];
      T bm = -(T)INFINITY;
#pragma unroll
      for (int q = 0; q < {S}; ++q) {{
        if (jb + q < nj) eval(jb + q, ov[q]);
        else {{
#pragma unroll
          for (int k = 0; k < {F}; ++k) ov[q][k] = k == 0 ? -(T)INFINITY : (T)0;
        }}
        bm = lt_nmax(bm, ov[q][0]);
      }}
      const T nm = lt_nmax(pm, bm);
      if (nm == -(T)INFINITY) continue;
      const T sc = pm == nm ? (T)1 : exp(pm - nm);
#pragma unroll
      for (int c = 0; c < {nsum}; ++c) ps[c] *= sc;
#pragma unroll
      for (int q = 0; q < {S}; ++q) {{
        const T x = ov[q][0];
        const T e = x == nm ? (T)1 : exp(x - nm);
#pragma unroll
        for (int c = 0; c < {nsum}; ++c) ps[c] += e * {w_of};
      }}
      pm = nm;
    }}
    flush();
  }}""", comment=f"// Sub-tiles of {S} pairs: their values in registers, their max, then one exp per pair."),
            merge, write), arg="o")

    # ------------------------------------------------------------------ array level

    def weights(self, values: Array) -> Array:
        """The weights of the sums, (..., M, nsum), for values (..., M, F)."""
        return np.ones_like(values[..., :1])

    def partial(self, values: Array, opts: dict, j0: int = 0) -> list:
        f = values[..., :1]
        m = _ref_max(f)
        with np.errstate(all="ignore"):
            s = (_ref_shifted_exp(f, m) * self.weights(values)).sum(axis=-2)
        return [m, s]

    def merge(self, a: list, b: list, opts: dict) -> list:
        """As ``lt_lse_add``: both sums rescaled to the larger maximum (the terms at +inf
        count 1 each, as in the kernels)."""
        (ma, sa), (mb, sb) = a, b
        xp = namespace_of(ma)
        m = xp.maximum(ma, mb)  # NaN propagates
        with np.errstate(all="ignore"):
            s = sa * _scale(xp, ma, m) + sb * _scale(xp, mb, m)
        return [m, xp.where(m != m, m + s * 0, s)]

    def finalize(self, state: list, opts: dict) -> list:
        m, s = state
        with np.errstate(all="ignore"):
            return [m + _log(s)]

    vjp_saves = 1

    # On blocks the state is ``(m, cat(s, t))`` (float64): ``Σ exp(f) = exp(m) s`` and
    # ``Σ exp(f) w = exp(m) t`` (no t without a weight), whatever the reduction keeps. A
    # weighted one runs the softmax-weighted sum of w (exp(m) s counts the +inf terms when
    # m = +inf) and Max_SumShiftExp of f; its gradients flow through the softmax and the
    # log-sum-exp of f.
    block_runs = (("sumsoftmaxweight", "all"), ("max_sumshiftexp", "f"))
    grad_block_runs = (("sumsoftmaxweight", "all"), ("logsumexp", "f"))

    def state_layout(self, opts: dict, dim: int) -> list:
        return [((1,), "wide", float("-inf")), ((dim if self.weighted else 1,), "wide", 0.0)]

    def from_block(self, outs: list, opts: dict, offset: int, dim: int) -> list:
        xp = namespace_of(outs[0])
        r, ms = xp.float64(outs[0]), xp.float64(outs[1])
        m, s = ms[..., :1], ms[..., 1:]
        return [m, xp.cat([s, xp.where(s == 0, xp.zeros_like(r), r * s)], -1)]

    def grad_from_block(self, outs: list, opts: dict, offset: int, dim: int) -> list:
        if not self.weighted:
            return self.from_block(outs, opts, offset, dim)
        xp = namespace_of(outs[0])
        r, m = xp.float64(outs[0]), xp.float64(outs[1])
        t = xp.where(m == float("-inf"), xp.zeros_like(r), r)
        return [m, xp.cat([xp.zeros_like(m) + 1, t], -1)]

    def to_block(self, state: list, opts: dict, offset: int, m_block: int) -> list:
        m, st = state
        s = st[..., :1]
        lse = m + _log(s)
        return [st[..., 1:] / s, lse] if self.weighted else [lse]

    def block_outputs(self, state: list, opts: dict) -> list:
        m, st = state
        return self.finalize([m, st[..., 1:] if self.weighted and not self.total_sum else st],
                             opts)[: self.user_outputs]


def _scale(xp, m_part, m):
    """``exp(m_part - m)`` for ``m = max(m_part, ...)``: 1 where they are equal (an infinite
    maximum counts its terms, as ``lt_lse_add``; no NaN in gradients), 0 for -inf."""
    same = m_part == m
    zero = xp.zeros_like(m)
    return xp.where(same, zero + 1, xp.exp(xp.where(same, zero, m_part - m)))


def _log(s):
    return namespace_of(s).log(s)


@register
class LogSumExp(_LSEBase):
    """``log Σ_j exp(f_ij)`` of a scalar formula, computed stably (``K.logsumexp(dim=1)``,
    pykeops's ``LogSumExp``): ``(N, 1)``; -inf for an empty reduction.

    >>> f = -np.array([[[0.0], [4.0]], [[1.0], [1.0]], [[9.0], [1.0]]])  # (N, M, 1) = (3, 2, 1)
    >>> [out.round(4).tolist() for out in LogSumExp().ref(f, {})]
    [[[0.0181], [-0.3069], [-0.9997]]]
    """

    name = "logsumexp"
    keops_name = "LogSumExp"
    aliases = ("lse",)
    weighted_variant = "logsumexp_weight"
    method = "logsumexp"
    method_doc = """\
    ``log Σ exp(self)`` (stable); with ``weight`` (or ``other``, as pykeops calls it):
    ``log Σ exp(self) * weight``.

    An empty reduction (or all terms -inf) gives -inf; a NaN term gives NaN. Shapes: a
    scalar formula gives ``(N, 1)`` for ``dim=1``; with a weight of dimension E,
    ``(N, E)``.

    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
    >>> D = Vi(x).sqdist(Vj(y))     # (3, 2): [[0, 4], [1, 1], [9, 1]]
    >>> (-D).logsumexp(dim=1).round(4).tolist()
    [[0.0181], [-0.3069], [-0.9997]]
    >>> (-D).logsumexp(dim=1, weight=Vj(np.array([[1.0], [2.0]]))).round(4).tolist()
    [[0.036], [0.0986], [-0.3067]]
    """
    gradient = "sum"
    fusable = True
    lse_output = 0
    block_runs = (("logsumexp", "all"),)
    grad_block_runs = None

    def from_block(self, outs: list, opts: dict, offset: int, dim: int) -> list:
        m = namespace_of(outs[0]).float64(outs[0])  # exp(lse) * 1
        return [m, namespace_of(m).zeros_like(m) + 1]

    def outputs(self, F: int, opts: dict) -> list[Output]:
        return [Output(1, "value", float("-inf"))]

    def check(self, F: int, opts: dict, M: int | None = None) -> None:
        if F != 1:
            raise ValueError(
                f"logsumexp: the formula must be scalar (dimension 1), got dimension {F}"
            )

    def writes(self, F: int) -> str:
        return write_code(0, "value", 1, "(T)(m + log(s[0]))")

    def vjp_formula(self, F: ir.Node, saved: list, aux: bool, limits: bool = False) -> ir.Node:
        return _weight(F, saved[0], limits)

    def normalizer(self, F: ir.Node, saved: list) -> ir.Node | None:
        return _weight(F, saved[0], True)

    def dual(self, F: ir.Node, tangents: list) -> tuple:
        # d lse = Σ_j softmax_j(F) dF_j: the softmax-weighted sum of the tangents, whose
        # second output is the log-sum-exp itself
        return concat([F, *tangents]), "sumsoftmaxweight", False

    def dual_outputs(self, outs: list, F: int) -> tuple:
        return outs[1], outs[0][..., None]


@register
class LogSumExpWeight(_LSEBase):
    """``log Σ_j exp(f_ij) w_j`` for the formula ``concat(f, w)``, f scalar and w of
    dimension E (``K.logsumexp(dim=1, weight=w)``, pykeops's ``LogSumExp`` with a second
    formula): ``(N, E)``.

    >>> f = -np.array([[[0.0], [4.0]], [[1.0], [1.0]], [[9.0], [1.0]]])  # (N, M, 1) = (3, 2, 1)
    >>> w = np.broadcast_to([[1.0], [2.0]], f.shape)
    >>> [out.round(4).tolist() for out in LogSumExpWeight().ref(np.concatenate([f, w], -1), {})]
    [[[0.036], [0.0986], [-0.3067]]]
    """

    name = "logsumexp_weight"
    weighted = True
    gradient = "sum"
    wide = "softmax"

    def outputs(self, F: int, opts: dict) -> list[Output]:
        return [Output(F - 1, "value", float("-inf"))]

    def n_sums(self, F: int) -> int:
        return F - 1

    def weight_code(self) -> str:
        return "{f}[(1 + c) * {stride} + {jj}]"

    def writes(self, F: int) -> str:
        return write_code(0, "value", F - 1, "(T)(m + log(s[k]))")

    def weights(self, values: Array) -> Array:
        return values[..., 1:]

    def vjp_formula(self, F: ir.Node, saved: list, aux: bool, limits: bool = False) -> ir.Node:
        f, w = _split(F)
        return apply("mul", _weight(f, saved[0], limits), w)


@register
class SumSoftMaxWeight(_LSEBase):
    """Σ_j softmax_j(f) w_j; also writes the log-sum-exp of f (second output, for gradients).

    The formula is ``concat(f, w)``, f scalar and w of dimension E
    (``K.sumsoftmaxweight(w, dim=1)``): ``(N, E)``, NaN (0/0) for an empty reduction.

    >>> f = -np.array([[[0.0], [4.0]], [[1.0], [1.0]], [[9.0], [1.0]]])  # (N, M, 1) = (3, 2, 1)
    >>> w = np.broadcast_to([[1.0], [2.0]], f.shape)
    >>> out, lse = SumSoftMaxWeight().ref(np.concatenate([f, w], -1), {})
    >>> out.round(4).tolist()
    [[1.018], [1.5], [1.9997]]
    """

    name = "sumsoftmaxweight"
    keops_name = "SumSoftMaxWeight"
    aliases = ("sum_softmax_weight", "softmax")
    method = "sumsoftmaxweight"
    method_doc = """\
    ``Σ_j softmax_j(self) weight_j`` for a scalar formula ``self`` (NaN, i.e. 0/0, for
    an empty reduction): attention, with shape ``(N, E)`` for a weight of dimension E.

    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
    >>> D = Vi(x).sqdist(Vj(y))     # (3, 2): [[0, 4], [1, 1], [9, 1]]
    >>> (-D).sumsoftmaxweight(Vj(y), dim=1).round(4).tolist()
    [[0.036], [1.0], [1.9993]]
    """
    weighted = True
    total_sum = True
    gradient = "sum"
    wide = "softmax"
    vjp_saves = 2
    lse_output = 1

    def outputs(self, F: int, opts: dict) -> list[Output]:
        return [Output(F - 1, "value", float("nan")), Output(1, "value", float("-inf"))]

    def n_sums(self, F: int) -> int:
        return F

    def weight_code(self) -> str:
        return "(c == 0 ? (T)1 : {f}[c * {stride} + {jj}])"

    def writes(self, F: int) -> str:
        return (write_code(0, "value", F - 1, "(T)(s[1 + k] / s[0])") + " "
                + write_code(1, "value", 1, "(T)(m + log(s[0]))"))

    def weights(self, values: Array) -> Array:
        return np.concatenate([np.ones_like(values[..., :1]), values[..., 1:]], axis=-1)

    def finalize(self, state: list, opts: dict) -> list:
        m, s = state
        with np.errstate(all="ignore"):
            return [s[..., 1:] / s[..., :1], m + _log(s[..., :1])]

    def vjp_formula(self, F: ir.Node, saved: list, aux: bool, limits: bool = False) -> ir.Node:
        f, w = _split(F)
        softmax = _weight(f, saved[1], limits)
        G = apply("mul", softmax, apply("sub", w, saved[0]))
        # The auxiliary log-sum-exp output is used by first-order gradients, so it receives
        # a cotangent in double backward: d lse = Σ_j softmax_ij df_ij.
        return apply("concat", G, softmax) if aux else G

    def normalizer(self, F: ir.Node, saved: list) -> ir.Node | None:
        return _weight(_split(F)[0], saved[1], True)


@register
class MaxSumShiftExp(_LSEBase):
    """(m, s) with m = max_j f and s = Σ_j exp(f - m): KeOps's Max_SumShiftExp.

    One ``(N, 2)`` output, m and s side by side, for a scalar formula
    (``K.max_sumshiftexp(dim=1)``); ``m + log(s)`` is the log-sum-exp.

    >>> f = np.array([[[0.0], [4.0]], [[1.0], [1.0]], [[9.0], [1.0]]])  # (N, M, 1) = (3, 2, 1)
    >>> [out.round(4).tolist() for out in MaxSumShiftExp().ref(f, {})]
    [[[4.0, 1.0183], [1.0, 2.0], [9.0, 1.0003]]]
    """

    name = "max_sumshiftexp"
    keops_name = "Max_SumShiftExp"
    aliases = ("maxsumshiftexp",)
    method = "max_sumshiftexp"
    method_doc = """\
    ``(m, s)`` with ``m = max_j f`` and ``s = Σ_j exp(f - m)`` for a scalar formula f,
    side by side: shape ``(N, 2)`` for ``dim=1`` (pykeops's ``Max_SumShiftExp``;
    ``m + log(s)`` is the log-sum-exp).

    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
    >>> D = Vi(x).sqdist(Vj(y))     # (3, 2): [[0, 4], [1, 1], [9, 1]]
    >>> D.max_sumshiftexp(dim=1).round(4).tolist()
    [[4.0, 1.0183], [1.0, 2.0], [9.0, 1.0003]]
    """
    block_runs = (("max_sumshiftexp", "all"),)
    grad_block_runs = ()

    def from_block(self, outs: list, opts: dict, offset: int, dim: int) -> list:
        ms = namespace_of(outs[0]).float64(outs[0])
        return [ms[..., :1], ms[..., 1:]]

    def outputs(self, F: int, opts: dict) -> list[Output]:
        return [Output(2, "value", float("nan"))]

    def writes(self, F: int) -> str:
        return "{ T* o = (T*)outs[0] + row * 2; o[0] = (T)m; o[1] = (T)s[0]; }"

    def finalize(self, state: list, opts: dict) -> list:
        return [namespace_of(state[0]).concat(list(state))]


@register
class MaxSumShiftExpWeight(_LSEBase):
    """(m, s) with m = max_j f and s = Σ_j exp(f - m) w_j: KeOps's Max_SumShiftExpWeight.

    For the formula ``concat(f, w)``, f scalar and w of dimension E
    (``K.max_sumshiftexpweight(w, dim=1)``, pykeops's ``Max_SumShiftExpWeight`` with
    ``formula2=w``): one ``(N, 1 + E)`` output, m then s; ``m + log(s)`` is the weighted
    log-sum-exp. No gradient (as Max_SumShiftExp: differentiate the log-sum-exp instead).

    >>> f = np.array([[[0.0], [4.0]], [[1.0], [1.0]], [[9.0], [1.0]]])  # (N, M, 1) = (3, 2, 1)
    >>> w = np.broadcast_to([[1.0], [2.0]], f.shape)
    >>> [out.round(4).tolist() for out in MaxSumShiftExpWeight().ref(np.concatenate([f, w], -1), {})]
    [[[4.0, 2.0183], [1.0, 3.0], [9.0, 1.0007]]]
    """

    name = "max_sumshiftexp_weight"
    keops_name = "Max_SumShiftExpWeight"
    aliases = ("max_sumshiftexpweight",)
    weighted = True
    grad_block_runs = ()
    method = "max_sumshiftexpweight"
    method_doc = """\
    ``(m, s)`` with ``m = max_j f`` and ``s = Σ_j exp(f - m) weight_j`` for a scalar formula
    f, side by side: shape ``(N, 1 + E)`` for ``dim=1`` and a weight of dimension E
    (pykeops's ``Max_SumShiftExpWeight``; ``m + log(s)`` is ``logsumexp(weight=)``).

    >>> x, y = np.array([[0.0], [1.0], [3.0]]), np.array([[0.0], [2.0]])
    >>> D = Vi(x).sqdist(Vj(y))     # (3, 2): [[0, 4], [1, 1], [9, 1]]
    >>> D.max_sumshiftexpweight(Vj(np.array([[1.0], [2.0]])), dim=1).round(4).tolist()
    [[4.0, 2.0183], [1.0, 3.0], [9.0, 1.0007]]
    """

    def outputs(self, F: int, opts: dict) -> list[Output]:
        return [Output(F, "value", float("nan"))]

    def n_sums(self, F: int) -> int:
        return F - 1

    def weight_code(self) -> str:
        return "{f}[(1 + c) * {stride} + {jj}]"

    def writes(self, F: int) -> str:
        return (f"{{ T* o = (T*)outs[0] + row * {F}; o[0] = (T)m; "
                f"for (int k = 0; k < {F - 1}; ++k) o[1 + k] = (T)s[k]; }}")

    def weights(self, values: Array) -> Array:
        return values[..., 1:]

    def finalize(self, state: list, opts: dict) -> list:
        return [namespace_of(state[0]).concat(list(state))]


def _weight(f: ir.Node, lse: ir.Node, limits: bool) -> ir.Node:
    """The softmax weight ``exp(f - lse)`` of the gradients (op ``softmax_weight``: f
    evaluated as the forward stored it; ``limits``: 1 at +inf where lse is +inf)."""
    return apply("softmax_weight", f, lse, params=(bool(limits),))


def _split(F: ir.Node) -> tuple:
    """(f, w): the scalar formula and the weight of a weighted reduction's formula."""
    return apply("slice", F, params=(0, 1)), apply("slice", F, params=(1, F.dim - 1))


def _ref_max(f):
    """Max over the pair axis; -inf for empty reductions, NaN if any NaN."""
    if f.shape[-2] == 0:
        return np.full(f.shape[:-2] + f.shape[-1:], -np.inf)
    with np.errstate(all="ignore"):
        m = f.max(axis=-2)
    return np.where(np.isinf(m) & (m < 0), -np.inf, m)


def _ref_shifted_exp(f, m):
    """``exp(f - m)`` for ``m = max f`` (over axis -2), with the limits the kernels use:
    where ``m = +inf`` each +inf term counts 1 and the others 0 (so ``logsumexp`` is +inf,
    as ``scipy.special.logsumexp``, and softmax averages the weights of the +inf terms);
    where ``m = -inf`` (all terms -inf, or none) every term counts 0. NaN propagates."""
    mb = m[..., None, :]
    with np.errstate(all="ignore"):
        e = np.exp(f - mb)
    e = np.where(np.isposinf(mb), (f == mb).astype(e.dtype), e)
    return np.where(np.isneginf(mb), 0.0, e)
