"""Running a reduction: checks, i/j swap, backend choice, dispatch, output shapes.

``reduce(formula, variables, "sum", axis=1)`` is what every LazyTensor reduction and
``Genred`` call comes down to. Reductions over i (axis 0) run the same kernel with the
roles of i and j exchanged. Torch inputs that require grad go through
:class:`lazytensor.autograd.KernelReduction`.
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass

import numpy as np

from . import reference, runtime
from .binding import Signature, Variable, bind, is_torch
from .codegen import ir, reductions
from .codegen.render_c import VarSpec

BACKENDS = ("auto", "cpu", "cuda", "numpy")
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
        if not device.startswith("cuda"):
            raise NotImplementedError(f"tensors on {device}: only CPU and CUDA are supported")
        return "numpy" if backend == "numpy" else "cuda"
    if backend == "cuda":
        raise ValueError("backend='cuda' needs torch CUDA tensors; move them with .cuda()")
    if backend == "auto":
        from .codegen.compilers import cpu_compiler

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
    if call.backend == "cpu":
        return _execute_cpu(call, arrays)
    spec = runtime.KernelSpec(
        call.formula,
        tuple(VarSpec(k, d, c) for k, (d, c) in enumerate(zip(call.dims, call.cats))),
        call.reduction, call.opts, call.dtype,
    )
    if call.backend == "cuda":
        from . import cuda_runtime  # loads the driver, only for CUDA tensors

        kernel = cuda_runtime.get_cuda_kernel(spec, call.device)
    else:
        kernel = runtime.get_cpu_kernel(spec)
    contiguous = [_contiguous(a) for a in arrays]
    outs = _alloc(call, arrays[0] if arrays else None)
    if call.N > 0 and all(s > 0 for s in call.batch):
        if call.backend == "cuda":
            cuda_runtime.launch_cuda(kernel, contiguous, list(call.cats), call.batch, call.N,
                                     call.M, outs)
        else:
            runtime.launch_cpu(kernel, contiguous, list(call.cats), call.batch, call.N,
                               call.M, outs, _ptr)
    return outs


# call -> (shapes, CpuLaunch, output specs): a call that comes back (the reduce cache
# hands out the same call object) neither rebuilds its kernel spec nor its arguments.
_cpu_calls: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _execute_cpu(call: ReductionCall, arrays: list) -> list:
    torch_lib = call.library == "torch"
    if torch_lib:
        arrays = [a if a.is_contiguous() else a.detach().contiguous() for a in arrays]
    else:
        arrays = [np.ascontiguousarray(a) for a in arrays]
    shapes = tuple(a.shape for a in arrays)
    hit = _cpu_calls.get(call)
    if hit is None or hit[0] != shapes:
        spec = runtime.KernelSpec(
            call.formula,
            tuple(VarSpec(k, d, c) for k, (d, c) in enumerate(zip(call.dims, call.cats))),
            call.reduction, call.opts, call.dtype,
        )
        kernel = runtime.get_cpu_kernel(spec)
        launch = runtime.cpu_launch(kernel, tuple(tuple(s) for s in shapes), call.cats,
                                    call.batch, call.N, call.M)
        hit = _cpu_calls[call] = (shapes, launch, _out_specs(call))
    _, launch, specs = hit
    if torch_lib:
        import torch

        outs = [torch.empty(shape, dtype=dt) for shape, dt in specs]
        ptr = _torch_ptr
    else:
        outs = [np.empty(shape, dtype=dt) for shape, dt in specs]
        ptr = _numpy_ptr
    if launch.rows > 0:
        launch(arrays, outs, ptr)
    return outs


def _torch_ptr(a) -> int:
    return a.data_ptr()


def _numpy_ptr(a) -> int:
    return a.ctypes.data


def _out_specs(call: ReductionCall) -> list:
    """(shape, dtype) of each output, in the call's library."""
    specs = []
    for o in call.outputs():
        shape = (*call.batch, call.N, o.dim)
        if call.library == "torch":
            import torch

            specs.append((shape, getattr(torch, call.dtype) if o.kind == "value" else torch.int64))
        else:
            specs.append((shape, np.dtype(call.dtype if o.kind == "value" else np.int64)))
    return specs


def _contiguous(a):
    if is_torch(a):
        return a if a.is_contiguous() else a.detach().contiguous()
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
    key = _call_key(formula, variables, reduction, axis, opts, backend)
    hit = _prepared.get(key) if key is not None else None
    if hit is None:
        hit = _prepare(formula, variables, reduction, axis, opts, backend)
        if key is not None:
            if len(_prepared) > 4096:
                _prepared.clear()
            _prepared[key] = hit
    call, red, opts = hit
    arrays = [_scalar_array(v.data, call) if v.is_scalar else v.data for v in variables]
    if call.library == "torch" and _needs_grad(arrays):
        from .autograd import apply_with_grad

        outs = apply_with_grad(call, arrays, grad_mode)
    else:
        outs = execute(call, arrays)
    outs = [red.shape_output(o, call.formula.dim, opts) for o in outs[: red.user_outputs]]
    return outs[0] if len(outs) == 1 else tuple(outs)


# A repeated reduction (same formula, options, and variables of the same kinds, dtypes,
# devices and shapes) skips binding and checking: they passed for this key before.
_prepared: dict = {}


def _call_key(formula, variables, reduction, axis, opts, backend):
    try:
        vk = tuple((v.cat, v.dim) if v.is_scalar else
                   (v.cat, v.dim, type(v.data), v.data.dtype, v.data.shape,
                    getattr(v.data, "device", None)) for v in variables)
        key = (formula, reduction, axis, tuple(opts.items()) if opts else (), backend, vk)
        hash(key)
        return key
    except (TypeError, AttributeError):
        return None


def _prepare(formula, variables, reduction, axis, opts, backend):
    """(call, reduction, opts): bind and check the variables, build the call."""
    red = reductions.get(reduction)
    # K=np.int64(5) must hash (JSON) and compile like K=5.
    opts = {k: int(v) if isinstance(v, np.integer) else v for k, v in opts.items()}
    if axis not in (0, 1):
        raise ValueError(f"reduction axis must be 0 (over i) or 1 (over j), got {axis!r}")
    if not variables:
        raise ValueError(f"{red.name}: the formula {ir.to_text(formula, limit=80)} has no variables, "
                         "so nothing is indexed by i or j; reduce a formula of Vi/Vj/Pm variables")
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
    call = ReductionCall(formula, tuple(cats), tuple(dims), red.name,
                         tuple(sorted(opts.items())), backend, sig.library, sig.dtype,
                         sig.device, sig.batch, N, M)
    return call, red, opts


_scalars: dict = {}


def _scalar_array(value: float, call: ReductionCall):
    """A Python number as a 1-element array of the call's library, dtype and device."""
    key = (float(value), call.library, call.dtype, call.device)
    a = _scalars.get(key)
    if a is None:
        if len(_scalars) > 1024:
            _scalars.clear()
        a = _scalars[key] = scalar_array(value, call)
    return a


def _needs_grad(arrays) -> bool:
    import torch

    return torch.is_grad_enabled() and any(a.requires_grad for a in arrays)


__all__ = ["ReductionCall", "Variable", "execute", "reduce"]
