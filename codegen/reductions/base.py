"""What a reduction is: one class holds every fact about it.

A :class:`Reduction` sees one formula ``F`` of dimension ``F`` per pair (weighted ones
take ``F = concat(f, w)`` with ``f`` scalar) and carries:

- its outputs and their shapes (:meth:`Reduction.outputs`, ``user_outputs`` of them seen
  by the caller, :meth:`Reduction.shape_output` for the K-min layout), its names
  (``name``, pykeops's ``keops_name``, ``aliases``) and options (``needs_k``,
  ``weighted``, ``weighted_variant``, ``sum_type``, ``sum_schemes``, the accumulator
  dtype rule :meth:`Reduction.acc_dtype`);
- its accumulator: :meth:`Reduction.accumulator` describes ``struct Acc`` (an
  :class:`Accumulator`: helpers, state, hooks ``init``, ``push``, ``tile``, ``flush``,
  ``merge`` of two partial accumulators, ``write`` of one row's outputs) in the form a
  renderer asks for: :data:`TILES` (the CPU's: ``tile(fb, nj, j0)`` takes a tile of terms
  ``fb[c*TJ + jj]``; :meth:`Reduction.lanes_add` when tiles may be added lane by lane
  first) or :data:`PAIRS` (the GPU's: the pairs one at a time, the state in registers);
  every renderer assembles it with :meth:`Accumulator.struct`;
- its reference at array level: :meth:`Reduction.partial` (the state of the
  accumulator over a range of j), :meth:`Reduction.merge` (two states over disjoint
  ranges of j, NumPy or torch), :meth:`Reduction.finalize` (the outputs) and
  :meth:`Reduction.ref` (the three together);
- its gradient: ``gradient`` ("sum": a Sum of :meth:`Reduction.vjp_formula`, "gather":
  through the saved indices, None), ``arg_variant`` (the reduction that also returns the
  indices), and for dual mode ``fusable``, :meth:`Reduction.dual` and
  :meth:`Reduction.dual_outputs`;
- its merge over blocks of the reduced axis (split-j, ranks, Dask chunks; run by
  :mod:`lazytensor.scale.merge`): ``block_runs`` on each block, :meth:`Reduction.from_block`,
  :meth:`Reduction.merge`, :meth:`Reduction.block_outputs`, the state's
  :meth:`Reduction.state_layout`, and for gradients ``grad_block_runs`` and
  :meth:`Reduction.to_block`;
- ``wide``: the form the backends' weighted sums of j-vectors take for it (None: none);
- its ``LazyTensor`` method: ``method`` (pykeops's spelling), ``vector_op`` (what the
  call without dim builds), ``method_doc``.

Adding a reduction is one subclass registered with :func:`register`, and its test case
(see CONTRIBUTING.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .. import ir

# an array of terms or outputs: float64 NumPy, or a torch tensor where merges run on devices
Array = Any


# The two forms of accumulator the renderers assemble. TILES (the CPU's): ``tile`` takes a
# buffer of a tile's terms, ``fb[c * TJ + jj]``. PAIRS (the GPU's, where such a buffer would
# be local memory): the state stays in registers, ``push`` takes the pairs one at a time
# in increasing j, ``tile(eval, nj, j0)`` a whole tile through ``eval(jj, o)`` (pair jj's
# values), and ``flush`` ends a tile (its partial into the totals).
TILES = "tiles"
PAIRS = "pairs"

# The signature of each hook, per form; ``insert`` and the like are the record's own.
SIGNATURES = {
    "init": "LT_HD LT_INLINE void init()",
    "push": "LT_HD LT_INLINE void push(const T* {f}, int64_t j)",
    "flush": "LT_HD LT_INLINE void flush()",
    "tile": {TILES: "LT_INLINE void tile(const T* fb, int nj, int64_t j0)",
             PAIRS: "template <class Eval>\n"
                    "  LT_HD LT_INLINE void tile(Eval&& eval, int nj, int64_t j0)"},
    "merge": "LT_HD LT_INLINE void merge(const Acc& o)",
    "write": "LT_HD LT_INLINE void write(void* const* outs, int64_t row) const",
}


@dataclass(frozen=True)
class Hook:
    """One member function of ``struct Acc``: its C block (braces included), the comment
    lines above it, and its signature where it is not one of :data:`SIGNATURES`."""

    name: str
    block: str
    comment: str = ""
    signature: str = ""


@dataclass(frozen=True)
class Accumulator:
    """A reduction's accumulator as C text: the ``helpers`` its hooks call (before the
    struct), its ``state`` (the member declarations) and its hooks in order (``init``,
    ``push(f, j)`` or ``push(o, j)``, ``tile``, ``flush`` for PAIRS, ``merge`` of two
    partial accumulators, ``write`` of one row's outputs). ``arg``: the name of push's
    values. Every renderer assembles it with :meth:`struct`."""

    helpers: str
    state: str
    hooks: tuple
    arg: str = "f"

    def struct(self, form: str) -> str:
        """The C++ of ``struct Acc``, the helpers in front."""
        lines = [f"{self.helpers}\nstruct Acc {{", f"  {self.state}"]
        for h in self.hooks:
            sig = h.signature or SIGNATURES[h.name]
            sig = sig[form] if isinstance(sig, dict) else sig
            comment = "".join(f"  {c}\n" for c in h.comment.splitlines())
            lines.append(f"{comment}  {sig.format(f=self.arg)} {h.block}")
        return "\n".join(lines) + "\n};"


@dataclass(frozen=True)
class Output:
    """One output: ``dim`` components per row, ``kind`` "value" (dtype T) or "index"
    (int64); ``empty`` is the value of a slot no term reached (an empty reduction)."""

    dim: int
    kind: str
    empty: float = 0.0


class Reduction:
    """Base class: the defaults below are those of a reduction without options or
    gradient; subclasses override what differs."""

    name: str = ""
    keops_name: str = ""
    aliases: tuple = ()
    needs_k = False
    weighted = False
    weighted_variant: Optional[str] = None
    sum_type = False
    sum_schemes: tuple = ()
    default_acc: Optional[str] = None
    user_outputs = 1
    arg_variant: Optional[str] = None
    partial_variant: Optional[str] = None
    gradient: Optional[str] = None
    fusable = False
    wide: Optional[str] = None
    # Its LazyTensor method (lazytensor.api.lazy makes it from these): the name as pykeops
    # spells it (None: no method of its own), also callable as ``<method>_reduction``; the
    # op that its call without dim (or with the vector's dim) builds instead, as pykeops
    # (``sum(-1)``, ``min(-1)`` ...); and the method's docstring.
    method: Optional[str] = None
    vector_op: Optional[str] = None
    method_doc: str = ""

    # ------------------------------------------------------------------ shapes, options

    def outputs(self, F: int, opts: dict) -> list[Output]:
        raise NotImplementedError

    def check(self, F: int, opts: dict, M: int | None = None) -> None:
        """Raise ValueError for a formula dimension or options this reduction can't take."""

    @property
    def options(self) -> tuple:
        """The option names its kernels read."""
        names = ("K",) if self.needs_k else ()
        if self.sum_type:
            names += ("dtype_acc",)
        if self.sum_schemes:
            names += ("sum_scheme",)
        return names

    def acc_dtype(self, dtype: str, opts: dict) -> str:
        """The accumulator's dtype: ``dtype_acc``, else the rule of the reduction."""
        return opts.get("dtype_acc") or self.default_acc or dtype

    def shape_output(self, out: Array, F: int, opts: dict) -> Array:
        """An output as the caller sees it (the K-min family: ``(..., K, F)`` for F > 1)."""
        return out

    # ------------------------------------------------------------------ C hooks

    def accumulator(self, F: int, opts: dict, form: str = TILES) -> Accumulator:
        """The accumulator of ``form`` (:data:`TILES` or :data:`PAIRS`) for a formula of
        dimension ``F``: the description a renderer assembles into ``struct Acc``."""
        raise NotImplementedError(f"the {self.name} reduction has no {form} accumulator")

    def acc_code(self, F: int, opts: dict, form: str = TILES) -> str:
        """C++ of ``struct Acc`` of ``form`` (uses typedefs T, TA and the constant TJ)."""
        return self.accumulator(F, opts, form).struct(form)

    def lanes_add(self, opts: dict) -> bool:
        """Whether ``Acc::tile`` only sums its terms (in T, then into TA): the CPU pair loop
        may then add several tiles lane by lane into one buffer (``fb[k*TJ + jj] +=``)
        and hand that buffer to ``tile`` once for all of them."""
        return False

    # ------------------------------------------------------------------ array level

    def partial(self, values: Array, opts: dict, j0: int = 0) -> list:
        """The accumulator's state over the pair axis -2 of ``values`` (..., M, F),
        float64 NumPy; ``j0`` is the global index of the first term."""
        raise NotImplementedError

    def merge(self, a: list, b: list, opts: dict) -> list:
        """The state over the terms of ``a`` and of ``b`` (NumPy arrays or torch tensors).
        Within ties the lower index wins, wherever it comes from."""
        raise NotImplementedError

    def finalize(self, state: list, opts: dict) -> list:
        """The outputs of a state."""
        return list(state)

    def ref(self, values: Array, opts: dict, j0: int = 0) -> list:
        """Reference outputs over the pair axis -2 of ``values`` (..., M, F), float64."""
        return self.finalize(self.partial(values, opts, j0), opts)

    # ------------------------------------------------------------------ blocks
    # A reduction split over blocks of its reduced axis (split-j, ranks of a process group,
    # Dask chunks): ``block_runs`` are the ordinary reductions run on each block, ``(name,
    # part)`` with part "all" (the whole formula) or "f" (its component 0, weighted ones);
    # :meth:`from_block` turns their outputs into a state that :meth:`merge` merges and
    # :meth:`block_outputs` finishes. ``grad_block_runs``: the runs gradients flow through
    # (None: the same; () none), whose outputs :meth:`grad_from_block` reads and
    # :meth:`to_block` gives back from a state. Array code (torch or NumPy) throughout.
    block_runs: tuple = ()
    grad_block_runs: Optional[tuple] = None

    def block_opts(self, opts: dict, m: int) -> dict:
        """The options of the runs on a block of ``m`` reduced points."""
        return dict(opts)

    def state_layout(self, opts: dict, dim: int) -> list:
        """``(trailing shape, kind, fill)`` of each state array: kind "value" (the data's
        dtype), "index" (int64) or "wide" (float64); ``fill`` is an empty block's value."""
        raise NotImplementedError

    def from_block(self, outs: list, opts: dict, offset: int, dim: int) -> list:
        """The state of one block from the outputs of ``block_runs`` (indices made global
        by ``offset``); ``dim`` is the formula's dimension."""
        raise NotImplementedError

    def grad_from_block(self, outs: list, opts: dict, offset: int, dim: int) -> list:
        """The state from the outputs of ``grad_block_runs``, differentiably."""
        return self.from_block(outs, opts, offset, dim)

    def to_block(self, state: list, opts: dict, offset: int, m: int) -> list:
        """The outputs of ``grad_block_runs`` that give ``state`` (a block of ``m`` points)."""
        raise NotImplementedError

    def block_outputs(self, state: list, opts: dict) -> list:
        """The outputs of a merged state, as one reduction over all blocks returns them."""
        return self.finalize(state, opts)[: self.user_outputs]

    # ------------------------------------------------------------------ gradients

    def vjp_formula(self, F: ir.Node, saved: list, aux: bool, limits: bool = False) -> ir.Node:
        """``G`` such that the gradient is the Sum of ``(∂G/∂v)ᵀ g`` (``gradient ==
        "sum"``); ``saved`` are i-variables holding the forward's outputs (``vjp_saves``
        of them); with ``aux``, ``G`` has more components for the cotangent of the outputs
        beyond ``user_outputs`` (concatenated after the first output's). ``limits``: the
        softmax weights of the log-sum-exp family follow the forward's limit at +inf (for
        gradients normalized by :meth:`normalizer`)."""
        raise NotImplementedError(
            f"the {self.name} reduction has no gradient (use logsumexp / min_argmin instead)")

    vjp_saves = 0
    # The saved output (an index into ``outputs``) that is the log-sum-exp of the formula's
    # first component, in whose softmax weights exp(f - lse) the j-side gradients use
    # instead the row maximum and the sum of exp(f - max) (see lazytensor.autodiff.autograd).
    lse_output: int | None = None

    def normalizer(self, F: ir.Node, saved: list) -> ir.Node | None:
        """For softmax-weighted gradients, the weight ``e_ij`` whose sum over j is 1 by
        definition (every term of ``G`` carries it): the gradients of i-variables and
        parameters are then computed as ``Σ_j e_ij C_ij / Σ_j e_ij``, exact whatever
        common factor the weights of a row are off by (the log-sum-exp's rounding, a
        maximum at +inf). None: gradients are plain sums."""
        return None

    def dual(self, F: ir.Node, tangents: list) -> tuple:
        """``(formula, reduction, keeps options)`` of the forward that also accumulates the
        tangent formulas (``fusable`` reductions)."""
        raise NotImplementedError

    def dual_outputs(self, outs: list, F: int) -> tuple:
        """``(output, J)`` from the fused forward's outputs; J is ``(..., k, F)``."""
        raise NotImplementedError


REDUCTIONS: dict[str, Reduction] = {}


def register(cls):
    """Register an instance of ``cls`` under its name and aliases (class decorator)."""
    r = cls()
    for n in (r.name, *r.aliases, r.keops_name):
        if n:
            REDUCTIONS[n.lower()] = r
    return cls


def get(name: str) -> Reduction:
    """The reduction called ``name`` (any case, pykeops's ``..._Reduction`` suffix too)."""
    try:
        return REDUCTIONS[name.lower().replace("_reduction", "")]
    except KeyError:
        raise ValueError(
            f"unknown reduction {name!r}; known: {sorted(set(r.name for r in REDUCTIONS.values()))}"
        ) from None


def all_reductions() -> list[Reduction]:
    """Each registered reduction once, by name."""
    return sorted({id(r): r for r in REDUCTIONS.values()}.values(), key=lambda r: r.name)


def unrolled(body: str, unroll: str = "") -> str:
    """A PAIRS hook's block: ``body`` (statements on lines of their own after the first)
    under ``#pragma unroll``, so that the state's arrays, indexed by constants once the
    loops are unrolled, live in registers."""
    pragma = f"#pragma unroll {unroll}".rstrip()
    return f"{{\n{pragma}\n    {body}\n  }}"


def write_code(outs_index: int, kind: str, dim: int, expr_k: str) -> str:
    """C statement writing output ``outs_index`` of row ``row``: ``o[k] = expr_k``."""
    ctype = "T" if kind == "value" else "int64_t"
    return (f"{{ {ctype}* o = ({ctype}*)outs[{outs_index}] + row * {dim}; "
            f"for (int k = 0; k < {dim}; ++k) o[k] = {expr_k}; }}")
