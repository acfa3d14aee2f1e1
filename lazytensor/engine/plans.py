"""Running a reduction in two stages: ``prepare`` once, ``run`` on every call.

``reduce(formula, variables, "sum", axis=1)`` is what every LazyTensor reduction and
``Genred`` call comes down to. It looks up the :class:`Plan` of the call in one bounded
LRU cache, keyed by the formula, the reduction and its options, the backend, the kind of
each variable (category, dimension, library, dtype, shape, device, whether it requires a
gradient), whether torch records gradients and the gradient mode. On a miss,
:func:`prepare` does all the symbolic work: binding and checks, the i↔j swap of a
reduction over i (axis 0), the backend, the route through autograd (plain, symbolic
gradient, gradient through indices, fused dual numbers of :mod:`lazytensor.autodiff.dual`), the
tangent formulas of dual mode and the VJP formulas of the expected backward
(:func:`lazytensor.autodiff.autograd.vjp_formulas`). :meth:`Plan.run` then only makes Python numbers
into arrays, allocates, launches (the kernels and launch arguments are kept by the calls,
:mod:`lazytensor.core.call`) and shapes the outputs.

The plan cache holds :data:`PLAN_CACHE_SIZE` plans, least recently used first out. A
plan holds its calls, their loaded kernels and launch arguments and its gradient plans: a
few kB (formulas are shared by hash-consing), so a full cache stays within tens of MB.
Block-sparse reductions (:mod:`lazytensor.scale.ranges`) share the plan of their formula and
inputs; the ranges are data of the run. :func:`clear_plans` empties it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .. import forks
from ..codegen import ir, reductions
from ..core import backend as backends
from ..core import half
from ..core.binding import bind
from ..core.call import ReductionCall, execute, scalar_array
from ..core.options import accumulator_for_data, check_grad_mode, default_grad_mode

PLAN_CACHE_SIZE = 4096

@dataclass(eq=False)
class Plan:
    """A prepared reduction: everything but the arrays.

    ``route``: "plain" (no autograd), "op" (the torch.library op of
    :mod:`lazytensor.integrations.torch_library` on ``run_call``: FakeTensor and meta inputs), "grad"
    (:class:`~lazytensor.autodiff.autograd.KernelReduction` on ``call``), "arg" (the same on the reduction's ``arg_variant``, whose indices the
    gradient gathers through) or "dual" (:class:`~lazytensor.autodiff.dual.FusedReduction` with
    the fused inputs ``dual_slots``); ``apply`` is the autograd Function's ``apply``.
    """

    call: ReductionCall
    red: reductions.Reduction
    opts: dict
    route: str = "plain"
    apply: Callable | None = None
    run_call: ReductionCall | None = None
    dual_slots: tuple = ()
    scalars: dict = field(default_factory=dict)  # float.hex(value) -> 1-element array

    def run(self, variables: list, ranges=None):
        """The outputs of the reduction on ``variables`` (of the kinds it was prepared for),
        block-sparse with ``ranges`` (a :class:`lazytensor.scale.ranges.BlockRanges` of the
        call's reduction over j)."""
        call = self.call
        arrays = [self._scalar(v.data) if v.is_scalar else v.data for v in variables]
        route = self.route
        if route == "plain":
            outs = execute(call, arrays, ranges)
        elif route == "grad":
            outs = self.apply(call, ranges, *arrays)
        elif route == "arg":
            outs = self.apply(self.run_call, ranges, *arrays)[:1]
        elif route == "op":  # torch.library op (lazytensor.integrations.torch_library)
            outs = self.apply(self.run_call, ranges, *arrays)[: len(call.outputs())]
        else:
            outs = [self.apply(call, self.dual_slots, ranges, *arrays)]
        red, F = self.red, call.formula.dim
        outs = [red.shape_output(o, F, self.opts) for o in outs[: red.user_outputs]]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _scalar(self, value: float):
        call = self.call
        if self.route == "op":  # FakeTensor or meta inputs: a tensor made now belongs to the
            # fake mode of this call (torch.compile makes one per trace), never to the next
            return scalar_array(value, call.library, call.dtype, call.device)
        # keyed by the bits: -0.0 == 0.0 (and hashes alike) but atan2, 1/x, copysign tell them apart
        key = float(value).hex()
        a = self.scalars.get(key)
        if a is None:
            if len(self.scalars) >= 16:
                self.scalars.clear()
            a = self.scalars[key] = scalar_array(value, call.library, call.dtype, call.device)
        return a


class PlanCache:
    """The plans of recent calls: at most ``size``, least recently used first out."""

    def __init__(self, size: int):
        self.size = size
        self._plans: OrderedDict = OrderedDict()
        self._lock = forks.lock()

    def get(self, key):
        plan = self._plans.get(key)
        if plan is not None:
            try:
                self._plans.move_to_end(key)
            except KeyError:  # evicted by another thread meanwhile
                pass
        return plan

    def put(self, key, plan: Plan) -> None:
        with self._lock:
            self._plans[key] = plan
            while len(self._plans) > self.size:
                self._plans.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)


_plans = PlanCache(PLAN_CACHE_SIZE)


def clear_plans() -> None:
    """Forget every prepared reduction (kernels stay loaded and on disk)."""
    _plans.clear()


def reduce(formula: ir.Node, variables: list, reduction: str, axis: int, opts: dict,
           backend: str = "auto", grad_mode: str | None = None, ranges=None):
    """Evaluate ``reduction`` of ``formula`` over ``axis`` (0: over i, 1: over j).

    Returns one array (or a tuple for two-output reductions) in the inputs' library.
    ``grad_mode`` ("auto", "symbolic", "dual"; default: the process-wide default) chooses
    how torch gradients are computed (see :mod:`lazytensor.autodiff.dual`). ``ranges``: a
    :class:`lazytensor.scale.ranges.BlockRanges` of the reduction over ``axis`` (block-sparse).
    """
    grad_mode = grad_mode or default_grad_mode()
    ranged = ranges is not None
    key = _plan_key(formula, variables, reduction, axis, opts, backend, grad_mode, ranged)
    plan = _plans.get(key) if key is not None else None
    if plan is None:
        plan = prepare(formula, variables, reduction, axis, opts, backend, grad_mode, ranged)
        if key is not None:
            _plans.put(key, plan)
    return plan.run(variables, ranges)


def _plan_key(formula, variables, reduction, axis, opts, backend, grad_mode, ranged=False):
    """The key of a call's plan, or None when something in it cannot be hashed."""
    try:
        vk = tuple((v.cat, v.dim) if v.is_scalar else
                   (v.cat, v.dim, type(v.data), v.data.dtype, v.io_dtype, v.data.shape,
                    getattr(v.data, "device", None), getattr(v.data, "requires_grad", False))
                   for v in variables)
        key = (formula, reduction, axis, tuple(opts.items()) if opts else (), backend, vk,
               _grad_enabled(), _transforms_active(), grad_mode, ranged)
        hash(key)
        return key
    except (TypeError, AttributeError):
        return None


def _grad_enabled() -> bool:
    torch = sys.modules.get("torch")  # not imported for NumPy users
    return torch is not None and torch.is_grad_enabled()


_TORCH_LIBRARY = importlib.util.resolve_name("..integrations.torch_library", __package__)


def torch_library():
    """:mod:`lazytensor.integrations.torch_library`, loaded by name: it sits above the user API (it
    registers the op and runs LazyTensor's interop table before any trace), which calls
    it under torch.compile/export and for fake inputs. (Found in ``sys.modules`` once
    loaded: torch dynamo traces a dict lookup, not ``importlib``.)"""
    module = sys.modules.get(_TORCH_LIBRARY)
    if module is None:
        module = importlib.import_module("..integrations.torch_library", __package__)
    return module


def torch_compiling() -> bool:
    """torch.compile (dynamo) or torch.export is tracing the caller: reductions then go
    through the torch.library op (:mod:`lazytensor.integrations.torch_library`)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def _transforms_active() -> bool:
    """Inside a torch.func transform or a ``torch.autograd.forward_ad`` dual level:
    reductions then go through the autograd Function even when no input requires a
    gradient, so that the transforms see them (:mod:`lazytensor.autodiff.transforms`)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if torch._C._are_functorch_transforms_active():
        return True
    forward_ad = sys.modules.get("torch.autograd.forward_ad")
    return forward_ad is not None and forward_ad._current_level >= 0


def prepare(formula: ir.Node, variables: list, reduction: str, axis: int, opts: dict,
            backend: str = "auto", grad_mode: str = "auto", ranged: bool = False) -> Plan:
    """Bind and check the variables, build the call and its route through autograd, and
    work out the symbolic part of the gradients the call will need (``ranged``: for
    block-sparse runs, whose K-min blocks may see fewer than K points and pad)."""
    call, red, opts = bound_call(formula, variables, reduction, axis, opts, backend)
    plan = Plan(call, red, opts)
    if call.library == "torch" and _traced(variables):
        # FakeTensor or meta inputs: the torch.library op, whose fake kernel gives the
        # outputs' shapes without launching anything
        return torch_library().route_through_op(plan)
    requires = tuple(bool(getattr(v.data, "requires_grad", False)) for v in variables)
    if call.library == "torch" and _transforms_active():
        # torch.func transforms and forward-mode AD see reductions through the autograd
        # Function's vmap and jvp rules; the fused dual-number form has none.
        _prepare_gradients(plan, requires, "symbolic")
    elif call.library == "torch" and _grad_enabled() and any(requires):
        _prepare_gradients(plan, requires, grad_mode)
    return plan


def bound_call(formula: ir.Node, variables: list, reduction: str, axis: int, opts: dict,
               backend: str = "auto", device: str | None = None) -> tuple:
    """``(call, reduction, opts)``: the variables bound and checked, the reduction over i
    turned into one over j, the backend resolved (for ``device`` when given: the device
    of the tensors that meta stand-ins describe)."""
    red = reductions.get(reduction)
    # K=np.int64(5) must hash (JSON) and compile like K=5.
    opts = {k: int(v) if isinstance(v, np.integer) else v for k, v in opts.items()}
    if axis not in (0, 1):
        raise ValueError(f"reduction axis must be 0 (over i) or 1 (over j), got {axis!r}")
    if not variables:
        raise ValueError(f"{red.name}: the formula {ir.to_text(formula, limit=80)} has no variables, "
                         "so nothing is indexed by i or j; reduce a formula of Vi/Vj/Pm variables")
    sig = bind(variables)
    opts = accumulator_for_data(opts, sig.dtype, half.output_dtype(variables))
    cats = [v.cat for v in variables]
    dims = [v.dim for v in variables]
    N, M = sig.N, sig.M
    if axis == 0:
        formula = ir.swap_ij(formula)
        cats = [ir.swap_cat(c) for c in cats]
        N, M = M, N
    red.check(formula.dim, opts, M)  # K > M refused, with ranges too (blocks pad)
    device = device or sig.device
    resolved = backends.resolve(backend, device, sig.library)
    index = None
    if backends.get(resolved).device not in (None, "cpu"):  # a GPU: which one
        device = backends.target_device(backend, sig) if device == sig.device else device
        index = backends.device_index(device)
    call = ReductionCall(formula, tuple(cats), tuple(dims), red.name,
                         tuple(sorted(opts.items())), resolved, sig.library, sig.dtype,
                         device, sig.batch, N, M, index)
    return call, red, opts


def _traced(variables: list) -> bool:
    """Some input is a FakeTensor or lives on the meta device (shapes, no values)."""
    from torch._subclasses.fake_tensor import is_fake

    return any(not v.is_scalar and (v.data.device.type == "meta" or is_fake(v.data))
               for v in variables)


def _prepare_gradients(plan: Plan, requires: tuple, grad_mode: str) -> None:
    """The route of a call whose inputs require a gradient, and its symbolic parts."""
    from ..autodiff import dual
    from ..autodiff.autograd import KernelReduction

    call, red = plan.call, plan.red
    ks = dual.dual_slots(call, requires, check_grad_mode(grad_mode))
    if call.M == 0:  # no term to fuse: the symbolic gradients (0), not the fused 0/0
        ks = ()
    plan.apply = KernelReduction.apply
    if ks:
        plan.route, plan.dual_slots, plan.apply = "dual", ks, dual.FusedReduction.apply
        dual.fused_call(call, ks)
        rest = tuple(r and k not in ks for k, r in enumerate(requires))
        if any(rest):
            _prepare_vjp(call, rest)
    elif red.arg_variant is not None:
        plan.route = "arg"
        plan.run_call = call.with_formula(call.formula, call.cats, call.dims, red.arg_variant,
                                          call.opts)
    else:
        plan.route = "grad"
        if red.gradient == "sum" and any(requires):
            _prepare_vjp(call, requires)


def _prepare_vjp(call: ReductionCall, needs: tuple) -> None:
    """The VJP formulas of the first backward, when they exist (a formula without a
    derivative raises at backward time, as it would without this preparation)."""
    from ..autodiff.autograd import vjp_formulas

    try:
        vjp_formulas(call, needs, False)
    except NotImplementedError:
        pass


__all__ = ["Plan", "ReductionCall", "bound_call", "clear_plans", "prepare", "reduce",
           "torch_compiling", "torch_library"]
