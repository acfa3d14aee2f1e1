"""Running a reduction: checks, i/j swap, backend choice, dispatch, output shapes.

``reduce(formula, variables, "sum", axis=1)`` is what every LazyTensor reduction and
``Genred`` call comes down to. Reductions over i (axis 0) run the same kernel with the
roles of i and j exchanged. Torch inputs that require grad go through
:class:`lazytensor.autograd.KernelReduction`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from codegen import ir, reductions
from codegen.render_c import VarSpec

from . import reference, runtime
from .binding import Signature, Variable, bind, is_torch

BACKENDS = ("auto", "cpu", "numpy")
_SWAP = {"i": "j", "j": "i", "p": "p"}


@dataclass(frozen=True, eq=False)
class ReductionCall:
    """A bound reduction over j: the formula, its variables' layout, options, sizes."""

    formula: ir.Node
    cats: tuple
    dims: tuple
    reduction: str
    opts: tuple
    backend: str
    library: str
    dtype: str
    device: str
    batch: tuple
    N: int
    M: int

    @property
    def opts_dict(self) -> dict:
        return dict(self.opts)

    def outputs(self):
        return reductions.get(self.reduction).outputs(self.formula.dim, self.opts_dict)

    def with_formula(self, formula, cats, dims, reduction="sum", opts=(), axis=1):
        """A new call on the same sizes (used by gradients); axis 0 swaps i and j."""
        N, M = self.N, self.M
        if axis == 0:
            formula = ir.swap_ij(formula)
            cats = tuple(_SWAP[c] for c in cats)
            N, M = M, N
        return ReductionCall(formula, tuple(cats), tuple(dims), reduction, tuple(opts),
                             self.backend, self.library, self.dtype, self.device, self.batch, N, M)


_warned_fallback = False


def _resolve_backend(backend: str, device: str) -> str:
    global _warned_fallback
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    if device != "cpu":
        if backend == "cpu":
            raise ValueError(f"backend='cpu' got tensors on {device}; move them with .cpu()")
        raise NotImplementedError(
            f"tensors on {device}: the CUDA runtime is not available in this build; "
            "move the inputs to the CPU with .cpu()"
        )
    if backend == "auto":
        from codegen.compilers import cpu_compiler

        if cpu_compiler().available:
            return "cpu"
        if not _warned_fallback:
            _warned_fallback = True
            warnings.warn("no C++ compiler found: falling back to the (slow) NumPy reference "
                          "backend; install g++ or set $CXX", RuntimeWarning, stacklevel=4)
        return "numpy"
    return backend


def _ptr(a) -> int:
    return a.data_ptr() if is_torch(a) else a.ctypes.data


def _alloc(call: ReductionCall, like):
    outs = []
    for o in call.outputs():
        shape = (*call.batch, call.N, o.dim)
        if call.library == "torch":
            import torch

            dt = getattr(torch, call.dtype) if o.kind == "value" else torch.int64
            outs.append(torch.empty(shape, dtype=dt, device=call.device))
        else:
            outs.append(np.empty(shape, dtype=call.dtype if o.kind == "value" else np.int64))
    return outs


def execute(call: ReductionCall, arrays: list) -> list:
    """Outputs of ``call`` on canonical arrays (no autograd)."""
    if call.backend == "numpy":
        data = [a.detach().cpu().numpy() if is_torch(a) else a for a in arrays]
        res = reference.reduce(call.formula, data, list(call.cats), call.batch, call.N, call.M,
                               call.reduction, call.opts_dict)
        outs = []
        for r, o in zip(res, call.outputs()):
            r = r.astype(call.dtype if o.kind == "value" else np.int64)
            if call.library == "torch":
                import torch

                r = torch.from_numpy(r).to(call.device)
            outs.append(r)
        return outs
    spec = runtime.KernelSpec(
        call.formula,
        tuple(VarSpec(k, d, c) for k, (d, c) in enumerate(zip(call.dims, call.cats))),
        call.reduction, call.opts, call.dtype,
    )
    kernel = runtime.get_cpu_kernel(spec)
    contiguous = [_contiguous(a) for a in arrays]
    outs = _alloc(call, arrays[0] if arrays else None)
    if call.N > 0 and all(s > 0 for s in call.batch):
        runtime.launch_cpu(kernel, contiguous, list(call.cats), call.batch, call.N, call.M,
                           outs, _ptr)
    return outs


def _contiguous(a):
    if is_torch(a):
        return a.detach().contiguous()
    return np.ascontiguousarray(a)


def scalar_array(value: float, sig: Signature):
    if sig.library == "torch":
        import torch

        return torch.full((1,), float(value), dtype=getattr(torch, sig.dtype), device=sig.device)
    return np.full((1,), float(value), dtype=sig.dtype)


def reduce(formula: ir.Node, variables: list, reduction: str, axis: int, opts: dict,
           backend: str = "auto", grad_mode: str | None = None):
    """Evaluate ``reduction`` of ``formula`` over ``axis`` (0: over i, 1: over j).

    Returns one array (or a tuple for two-output reductions) in the inputs' library.
    ``grad_mode`` ("auto", "symbolic", "dual"; default: the process-wide default) chooses
    how torch gradients are computed (see :mod:`lazytensor.mixed`).
    """
    red = reductions.get(reduction)
    if axis not in (0, 1):
        raise ValueError(f"reduction axis must be 0 (over i) or 1 (over j), got {axis!r}")
    sig = bind(variables)
    cats = [v.cat for v in variables]
    dims = [v.dim for v in variables]
    N, M = sig.N, sig.M
    if axis == 0:
        formula = ir.swap_ij(formula)
        cats = [_SWAP[c] for c in cats]
        N, M = M, N
    red.check(formula.dim, opts, M)
    backend = _resolve_backend(backend, sig.device)
    arrays = [scalar_array(v.data, sig) if v.is_scalar else v.data for v in variables]
    call = ReductionCall(formula, tuple(cats), tuple(dims), red.name,
                         tuple(sorted(opts.items())), backend, sig.library, sig.dtype,
                         sig.device, sig.batch, N, M)
    if sig.library == "torch" and _needs_grad(arrays):
        from .autograd import apply_with_grad

        outs = apply_with_grad(call, arrays, grad_mode)
    else:
        outs = execute(call, arrays)
    outs = [_shape_output(o, red, formula.dim, opts) for o in outs[: _n_user_outputs(red)]]
    return outs[0] if len(outs) == 1 else tuple(outs)


def _needs_grad(arrays) -> bool:
    import torch

    return torch.is_grad_enabled() and any(a.requires_grad for a in arrays)


_TWO_OUTPUTS = ("min_argmin", "max_argmax", "kmin_argkmin")


def _n_user_outputs(red) -> int:
    """Outputs the user sees (sumsoftmaxweight's second output is for gradients only)."""
    return 2 if red.name in _TWO_OUTPUTS else 1


def _shape_output(out, red, F: int, opts: dict):
    if red.name in ("kmin", "argkmin", "kmin_argkmin") and F > 1:
        K = int(opts["K"])
        return out.reshape(*out.shape[:-1], K, F)
    return out


__all__ = ["reduce", "execute", "ReductionCall", "Variable"]
