"""Plans: :func:`~.plans.prepare` does a call's symbolic work once (binding, the i/j swap,
the backend, the route through autograd and its gradient formulas), :func:`~.plans.reduce`
finds the plan in a bounded LRU and runs it.
"""

from ..lazy_exports import lazy_exports

# the names ``lazytensor.engine`` exported when it was one module, loaded on first use
__all__ = ["Plan", "ReductionCall", "bound_call", "clear_plans", "prepare", "reduce",
           "torch_compiling", "torch_library"]
__getattr__, __dir__ = lazy_exports(globals(), dict.fromkeys(__all__, "plans"))
