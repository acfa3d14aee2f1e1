"""Reductions as a ``torch.library`` custom op: torch.compile, torch.export, FakeTensor, meta.

``lazytensor::reduction(str key, Tensor[] inputs) -> Tensor[]`` runs one prepared
reduction (a :class:`~lazytensor.core.call.ReductionCall`) named by ``key`` in a registry
of this process. The key is a content hash of the call (formula, layout, reduction,
options, backend, dtype, device, sizes), so the same formula on the same kinds of inputs
gets the same key in every process that builds it. The op has

- a fake kernel: empty outputs of the call's shapes and dtypes (int64 indices, K columns
  for the K-min family, every output of a two-output reduction), no kernel launched;
  it also serves meta-device tensors;
- an autograd formula (``register_autograd``) whose backward runs the gradient
  reductions of :mod:`lazytensor.autodiff.autograd` (the VJP plans that ``engine.prepare`` works
  out, kept in the call's memo) as the same op, so double backward works too; min, max
  and K-min run as their value-and-index variant and differentiate through the indices.

When torch is tracing (``torch.compiler.is_compiling()``: ``torch.compile`` and
``torch.export``), LazyTensor reductions and ``Genred`` calls come here
(:func:`traced_reduce`): the key is computed at trace time from the formula and the
inputs' shapes, dtypes and devices (a function dynamo calls once and keeps as a constant,
as it does for IR node construction), and the graph holds one op call per reduction, so
``torch.compile(fullgraph=True)`` has no graph break. Eager FakeTensor or meta inputs go
through the same op (the plan's "op" route). Eager calls on real tensors keep the
autograd Function of :mod:`lazytensor.autodiff.autograd`.

Supported under compile: static shapes (``torch.compile(..., dynamic=False)``: a new size
compiles a new graph; a symbolic size, from ``dynamic=True`` or from the automatic dynamic
shapes that ``dynamic=None`` turns on at a second size, cannot enter the key and stops the
trace with an ``assume_constant_result`` error naming ``_traced_key``), CPU and CUDA
tensors, gradients (double backward through the op in eager code; the symbolic mode: the
fused dual-number mode is eager-only). Not supported: block-sparse ``ranges`` and
distributed reductions (refused with an error), torch.func transforms of a compiled
reduction, ``K @ t`` where ``t @ K`` fits the shapes too (dynamo passes both as
``Tensor.__matmul__(t, K)``: refused, see :func:`lazytensor.interop.protocols.torch_function`). A
program keeps keys, not formulas: an exported program runs in a process that has built the
same reductions (running the module once, or tracing it again).

>>> import torch
>>> from lazytensor import Vi, Vj
>>> def f(x, y, b):
...     return (-Vi(x).sqdist(Vj(y))).exp() @ b
>>> x, y, b = torch.randn(5, 3), torch.randn(4, 3), torch.randn(4, 2)
>>> from torch._subclasses.fake_tensor import FakeTensorMode
>>> with FakeTensorMode() as mode:        # shapes only: no kernel runs
...     out = f(*(mode.from_tensor(t) for t in (x, y, b)))
>>> tuple(out.shape), out.dtype
((5, 2), torch.float32)
"""

from __future__ import annotations

import hashlib
import sys

import torch

from ..autodiff.autograd import reduction_vjp
from ..codegen import ir, reductions
from ..core.binding import Variable
from ..core.call import ReductionCall, execute
from ..engine import plans as engine
from ..interop import protocols as interop

OP_NAME = "lazytensor::reduction"

_calls: dict[str, ReductionCall] = {}


def register(call: ReductionCall) -> str:
    """The op key of ``call``, which the op then runs (the same call on every use)."""
    key = call.memo.get("op_key")
    if key is None:
        text = repr((call.formula.key, call.cats, call.dims, call.reduction, call.opts,
                     call.backend, call.library, call.dtype, call.device, call.batch, call.N,
                     call.M, call.device_index))
        key = f"{call.reduction}-{hashlib.sha256(text.encode()).hexdigest()[:40]}"
        call = _calls.setdefault(key, call)
        call.memo["op_key"] = key
    return key


def lookup(key: str) -> ReductionCall:
    """The call registered under ``key``."""
    call = _calls.get(key)
    if call is None:
        raise KeyError(f"{OP_NAME}: no reduction {key!r} in this process; a traced or exported "
                       "program names its reductions by key: build them here first (run the "
                       "module once, or trace it again)")
    return call


@torch.library.custom_op(OP_NAME, mutates_args=())
def reduction_op(key: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The outputs of the registered reduction ``key`` on ``inputs`` (one tensor per
    variable, Python numbers as 1-element tensors)."""
    return list(execute(lookup(key), list(inputs)))


@reduction_op.register_fake
def _reduction_fake(key: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    call = lookup(key)
    device = inputs[0].device if inputs else torch.device(call.device)
    value = getattr(torch, call.dtype)
    return [torch.empty((*call.batch, call.N, o.dim), device=device,
                        dtype=value if o.kind == "value" else torch.int64)
            for o in call.outputs()]


def _setup_context(ctx, inputs, output) -> None:
    key, tensors = inputs
    ctx.key, ctx.n_in = key, len(tensors)
    ctx.save_for_backward(*tensors, *output)


def _backward(ctx, grads):
    saved = ctx.saved_tensors
    inputs, outs = list(saved[: ctx.n_in]), list(saved[ctx.n_in:])
    needs = tuple(bool(n) for n in ctx.needs_input_grad[1])
    # index outputs have no cotangent (torch may hand zeros of their int64 dtype)
    grads = [None if g is None or not (g.is_floating_point() or g.is_complex()) else g
             for g in grads]
    return None, reduction_vjp(lookup(ctx.key), inputs, outs, grads, needs, None, apply_op)


reduction_op.register_autograd(_backward, setup_context=_setup_context)


def apply_op(call: ReductionCall, ranges, *tensors) -> tuple:
    """``call`` on ``tensors`` through the op (the ``apply`` of gradients and plans)."""
    if ranges is not None:
        raise NotImplementedError("block-sparse ranges are not supported through the "
                                  f"torch.library op ({OP_NAME}): under torch.compile/export, "
                                  "or with FakeTensor or meta inputs")
    return tuple(reduction_op(register(call), list(tensors)))


def op_call(call: ReductionCall, red: reductions.Reduction) -> ReductionCall:
    """The call the op runs for ``red``: its value-and-index variant where its gradient
    gathers through the indices (min, max, K-min)."""
    if red.arg_variant is None:
        return call
    return call.with_formula(call.formula, call.cats, call.dims, red.arg_variant, call.opts)


def route_through_op(plan: engine.Plan) -> engine.Plan:
    """``plan`` (of FakeTensor or meta inputs) run through the op."""
    plan.route, plan.apply, plan.run_call = "op", apply_op, op_call(plan.call, plan.red)
    return plan


def traced_reduce(formula: ir.Node, variables: list, reduction: str, axis: int, opts: dict,
                  backend: str = "auto"):
    """:func:`lazytensor.engine.plans.reduce` while torch traces (compile, export): one op call,
    its key worked out at trace time from the inputs' kinds."""
    tensors = [v.data for v in variables if not v.is_scalar]
    if not tensors:
        raise ValueError(f"{reduction}: under torch.compile/export a reduction needs at least "
                         "one tensor input")
    kinds = tuple((v.cat, v.dim, v.label, v.io_dtype, v.data) if v.is_scalar else
                  (v.cat, v.dim, v.label, v.io_dtype, tuple(v.data.shape),
                   v.data.dtype, str(v.data.device)) for v in variables)
    opts = tuple(sorted((opts or {}).items()))
    key = _traced_key(formula, kinds, reduction, axis, opts, backend)
    first = tensors[0]
    arrays = [torch.full((1,), float(v.data), dtype=first.dtype, device=first.device)
              if v.is_scalar else v.data for v in variables]
    outs = reduction_op(key, arrays)
    count, F = _user_outputs(reduction, formula.dim, opts)
    outs = [_shape_output(reduction, o, F, opts) for o in outs[:count]]
    return outs[0] if len(outs) == 1 else tuple(outs)


def _traced_key(formula, kinds, reduction, axis, opts, backend) -> str:
    """The op key of a reduction on inputs of ``kinds`` (meta stand-ins are bound and
    checked in place of the tensors)."""
    variables, device = [], None
    for kind in kinds:
        cat, dim, label, io_dtype = kind[:4]
        if len(kind) == 5:
            variables.append(Variable(kind[4], cat, dim, label, io_dtype))
            continue
        shape, dtype, device = kind[4:]
        variables.append(Variable(torch.empty(shape, dtype=dtype, device="meta"), cat, dim,
                                  label, io_dtype))
    call, red, _ = engine.bound_call(formula, variables, reduction, axis, dict(opts), backend,
                                     device)
    return register(op_call(call, red))


def _user_outputs(reduction: str, F: int, opts: tuple) -> tuple:
    """(number of outputs the user gets, the formula's dimension)."""
    return reductions.get(reduction).user_outputs, F


def _shape_output(reduction: str, out, F: int, opts: tuple):
    return reductions.get(reduction).shape_output(out, F, dict(opts))


def _register_formula_types() -> None:
    """IR nodes as opaque values of dynamo: it keeps them as constants (guarded by
    identity, which is structure under hash-consing) and calls the interner's ``node``
    as it is (with its lock and sha256), so that building a formula inside a compiled
    function adds nothing to the graph and breaks nothing."""
    from torch._library.opaque_object import MemberType, register_opaque_type

    ir.Node.__fx_repr__ = _node_fx_repr
    ir.Interner.__fx_repr__ = _interner_fx_repr
    register_opaque_type(ir.Node, typ="value")
    register_opaque_type(ir.Interner, typ="value", members={
        name: MemberType.USE_REAL for name in ("node", "var", "substitute", "swap_ij")})


# Nodes that a graph names (dynamo hands the nodes it stored into our caches while
# tracing, such as the variables of K @ v, back through the graph's outputs).
_graph_nodes: dict[str, ir.Node] = {}


def _node_by_key(key: str) -> ir.Node:
    return _graph_nodes[key]


def _node_fx_repr(node: ir.Node) -> tuple:
    _graph_nodes[node.key] = node
    return f"lazytensor_ir_node({node.key!r})", {"lazytensor_ir_node": _node_by_key}


def _interner_fx_repr(interner: ir.Interner) -> tuple:
    return "lazytensor_ir_interner", {"lazytensor_ir_interner": ir.interner}


_register_formula_types()
# torch functions on LazyTensors (K @ t) resolved by dict lookups that dynamo reads as they are;
# not while the interop rules are themselves being imported (they import LazyTensor, whose
# module loads this one): the table is then built when the rules are done, on first use
_rules = sys.modules.get("lazytensor.interop.rules")
if not getattr(getattr(_rules, "__spec__", None), "_initializing", False):
    interop._table("torch"), interop._tensor_matmuls()

# dynamo calls these at trace time and keeps their results as constants, rather than
# tracing the binding of the inputs; this is the attribute that
# torch._dynamo.assume_constant_result sets (importing torch._dynamo takes ~1.7 s).
for _fn in (_traced_key, _user_outputs):
    _fn._dynamo_marked_constant = True


def compiling() -> bool:
    """torch is tracing the caller: ``torch.compile`` (dynamo) or ``torch.export``."""
    return torch.compiler.is_compiling()


__all__ = ["OP_NAME", "apply_op", "compiling", "lookup", "reduction_op", "register",
           "route_through_op", "traced_reduce"]
