"""Gradients: every gradient is itself a reduction.

- :mod:`.autograd`: the ``torch.autograd.Function`` whose backward runs the VJP reductions;
- :mod:`.dual`: forward-mode tangents fused into the forward kernel (``grad_mode="dual"``);
- :mod:`.transforms`: the torch.func rules (``vmap`` as one more batch dimension, ``jvp``).
"""
