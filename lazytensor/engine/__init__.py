"""Plans: :func:`~.plans.prepare` does a call's symbolic work once (binding, the i/j swap,
the backend, the route through autograd and its gradient formulas), :func:`~.plans.reduce`
finds the plan in a bounded LRU and runs it.
"""
