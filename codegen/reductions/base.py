"""What a reduction is: one class holds every fact about it.

A :class:`Reduction` sees one formula ``F`` of dimension ``F`` per pair (weighted ones
take ``F = concat(f, w)`` with ``f`` scalar) and carries:

- its outputs and their shapes (:meth:`Reduction.outputs`, ``user_outputs`` of them seen
  by the caller, :meth:`Reduction.shape_output` for the K-min layout), its names
  (``name``, pykeops's ``keops_name``, ``aliases``) and options (``needs_k``,
  ``weighted``, ``weighted_variant``, ``sum_type``, ``sum_schemes``, the accumulator
  dtype rule :meth:`Reduction.acc_dtype`);
- its C hooks: :meth:`Reduction.acc_code` emits ``struct Acc`` with ``init``,
  ``push(f, j)``, ``tile(fb, nj, j0)`` (a tile of terms ``fb[c*TJ + jj]``, the CPU fast
  path; :meth:`Reduction.lanes_add` when tiles may be added lane by lane first), ``merge`` (two partial accumulators) and ``write`` (one row's outputs);
- its reference at array level: :meth:`Reduction.partial` (the state of the
  accumulator over a range of j), :meth:`Reduction.merge` (two states over disjoint
  ranges of j, NumPy or torch), :meth:`Reduction.finalize` (the outputs) and
  :meth:`Reduction.ref` (the three together);
- its gradient: ``gradient`` ("sum": a Sum of :meth:`Reduction.vjp_formula`, "gather":
  through the saved indices, None), ``arg_variant`` (the reduction that also returns the
  indices), and for dual mode ``fusable``, :meth:`Reduction.dual` and
  :meth:`Reduction.dual_outputs`;
- ``wide``: the form the CPU backend's weighted sums of j-vectors take for it.

Adding a reduction is one subclass registered with :func:`register`, and its case in
``tests/test_reductions.py`` (see CONTRIBUTING.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .. import ir

# an array of terms or outputs: float64 NumPy, or a torch tensor where merges run on devices
Array = Any


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

    def acc_code(self, F: int, opts: dict) -> str:
        """C++ of ``struct Acc`` (uses typedefs T, TA and the constant TJ)."""
        raise NotImplementedError

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


def write_code(outs_index: int, kind: str, dim: int, expr_k: str) -> str:
    """C statement writing output ``outs_index`` of row ``row``: ``o[k] = expr_k``."""
    ctype = "T" if kind == "value" else "int64_t"
    return (f"{{ {ctype}* o = ({ctype}*)outs[{outs_index}] + row * {dim}; "
            f"for (int k = 0; k < {dim}; ++k) o[k] = {expr_k}; }}")
