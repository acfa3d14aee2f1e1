"""lazytensor inside other systems: :mod:`.torch_library` makes reductions the
``torch.library`` op ``lazytensor::reduction`` (torch.compile, torch.export, fake tensors).
The pykeops alias is :mod:`lazytensor.compat`.
"""
