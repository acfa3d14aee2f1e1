"""pykeops's options, parsed in one place for ``LazyTensor``, ``Genred`` and ``KernelSolve``.

- backend names: ours (``"auto"``, ``"cpu"``, ``"cuda"`` or ``"gpu"``, ``"cuda:k"``,
  ``"numpy"``) and pykeops's (``"CPU"``, ``"GPU"``, ``"GPU_1D"``, ...), with ``device_id``;
- the accuracy options ``dtype_acc`` / ``use_double_acc`` and ``sum_scheme``, with
  pykeops's rules (the sum-type reductions only);
- ``Genred``'s ``reduction_op`` / ``opt_arg`` / ``formula2``, read from the reduction
  registry (pykeops names, K, weights);
- keywords that tune pykeops's CUDA code: ``use_fast_math=True`` (approximate CUDA
  intrinsics), the others (``enable_chunks``, ...) accepted without effect;
- ``grad_mode`` ("auto", "symbolic", "dual": how torch gradients are computed, see
  :mod:`lazytensor.autodiff.dual`) and its process-wide default.

>>> reduction_options("sum", use_double_acc=True, sum_scheme="kahan_scheme")
{'dtype_acc': 'float64', 'sum_scheme': 'kahan_scheme'}
>>> keops_reduction("ArgKMin", 5), keops_backend("GPU_2D")
(('argkmin', {'K': 5}), 'cuda')
"""

from __future__ import annotations

import numbers

from ..codegen import reductions

# pykeops's backend names -> ours. "GPU_1D"/"GPU_2D" (and their "_host"/"_device" forms)
# choose a CUDA scheme in pykeops; here the CUDA backend picks its own scheme.
_KEOPS_BACKENDS = {"CPU": "cpu", "GPU": "cuda"}
_GPU_SCHEMES = ("1D", "2D", "1D_host", "2D_host", "1D_device", "2D_device")

# Genred/reduction keywords of pykeops that tune its CUDA code generation: accepted and
# without effect where nothing reads them (the reductions read device_id and
# use_fast_math, see gpu_options).
IGNORED_OPTIONS = ("enable_chunks", "use_fast_math", "optional_flags", "device_id",
                   "rec_multVar_highdim")

ACCURACY_OPTIONS = ("dtype_acc", "use_double_acc", "sum_scheme")
ACCUMULATORS = ("auto", "float16", "float32", "float64")  # dtype_acc, as pykeops spells it
SUM_SCHEMES = ("auto", "direct_sum", "block_sum", "kahan_scheme")


def integer_option(value, name: str, where: str, low: int | None = None) -> int:
    """``value`` as a Python int, for an option that takes an integer (``K``, ``dim``,
    ``device_id``, ...): ints, NumPy integers and 0-d integer arrays or tensors (torchdr
    passes ``K=torch.tensor(90)``). Floats (even integral ones), booleans and arrays of
    several values are refused, naming the option; ``low`` is the smallest value allowed.

    >>> import numpy as np
    >>> integer_option(np.int64(3), "K", "argKmin"), integer_option(np.array(2), "K", "argKmin")
    (3, 2)
    >>> integer_option(3.0, "K", "argKmin")
    Traceback (most recent call last):
    ...
    ValueError: argKmin: K must be an integer, got 3.0 (float)
    """
    kind = ("a positive integer" if low == 1 else "an integer" if low is None
            else f"an integer >= {low}")
    v = value
    if not isinstance(v, numbers.Integral) and hasattr(v, "dtype") and hasattr(v, "shape"):
        dtype = str(v.dtype).replace("torch.", "")
        if tuple(v.shape) != ():
            raise ValueError(f"{where}: {name} must be {kind}, got an array of shape "
                             f"{tuple(v.shape)} (dtype {dtype})")
        if not dtype.startswith(("int", "uint")):
            raise ValueError(f"{where}: {name} must be {kind}, got a 0-d array of dtype "
                             f"{dtype} ({v.item()!r})")
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError(f"{where}: {name} must be {kind}, got {value!r} "
                         f"({type(value).__name__})")
    v = int(v)
    if low is not None and v < low:
        raise ValueError(f"{where}: {name} must be {kind}, got {v}")
    return v


def keops_backend(backend) -> str:
    """Our backend name for a pykeops one ("CPU", "GPU", "GPU_1D", ...); others unchanged."""
    if isinstance(backend, str):
        head = backend.split("_", 1)[0]
        if head in _KEOPS_BACKENDS and (backend in _KEOPS_BACKENDS or (
                head == "GPU" and backend[4:] in _GPU_SCHEMES)):
            return _KEOPS_BACKENDS[head]
    return backend


def gpu_options(backend, device_id=None, use_fast_math=None) -> tuple:
    """``(backend, opts)`` for pykeops's GPU keywords: ``device_id=k`` with a GPU backend
    picks GPU k (``"cuda:k"``: NumPy arrays are copied there; torch tensors must be
    there); ``use_fast_math=True`` lets CUDA kernels use approximate intrinsics (the
    default is IEEE-accurate functions).

    >>> gpu_options("GPU", device_id=1)
    ('cuda:1', {})
    """
    backend = keops_backend(backend)
    if device_id is not None:
        device_id = integer_option(device_id, "device_id (-1: the default device)", "backend")
        if device_id >= 0 and backend in ("cuda", "gpu"):
            backend = f"cuda:{device_id}"
    return backend, ({"use_fast_math": True} if use_fast_math is True else {})


def integer_value(value) -> int | None:
    """``value`` as a Python int when it is an integer by :func:`integer_option`'s rule
    (an int, a NumPy integer, a 0-d integer NumPy array or torch tensor); None for
    anything else (floats, even 1.0, and booleans).

    >>> import numpy as np
    >>> integer_value(np.int64(1)), integer_value(np.array(0)), integer_value(1.0), integer_value(True)
    (1, 0, None, None)
    """
    try:
        return integer_option(value, "", "")
    except ValueError:
        return None


def check_axis(axis) -> int:
    """``Genred``/``KernelSolve``'s ``axis``: 0 (reduction over i) or 1 (over j), an integer
    by the rule of :func:`integer_value` (``axis=1.0`` is refused, as ``sum(dim=1.0)``)."""
    value = integer_value(axis)
    if value not in (0, 1):
        raise ValueError(f"axis must be the integer 0 (reduction over i) or 1 (over j), got "
                         f"{axis!r}")
    return value


def _sum_type_names() -> str:
    return ", ".join(r.keops_name for r in reductions.all_reductions()
                     if r.sum_type and r.keops_name)


def reduction_options(reduction: str, dtype_acc="auto", use_double_acc=False,
                      sum_scheme="auto") -> dict:
    """Engine options from pykeops's accumulation arguments, with pykeops's rules.

    ``dtype_acc`` / ``use_double_acc`` (one of the two) and ``sum_scheme`` other than
    "auto" / "direct_sum" apply to the sum-type reductions only (Sum and the log-sum-exp
    family): a min or a K-min has nothing to accumulate, and pykeops rejects them there
    too. A ``sum_scheme`` that a reduction's kernel does not implement (the log-sum-exp
    family always accumulates per tile of j) is accepted and has no further effect.
    """
    if dtype_acc == "auto" and sum_scheme == "auto" and not use_double_acc:
        return {}  # nothing asked (the usual call): nothing to check
    opts = {}
    if dtype_acc not in ACCUMULATORS:
        raise ValueError(f"dtype_acc must be 'auto', 'float16', 'float32' or 'float64' (as "
                         f"pykeops), got {dtype_acc!r}")
    if use_double_acc:
        if dtype_acc != "auto":
            raise ValueError(f"set either use_double_acc=True or dtype_acc={dtype_acc!r}, not both")
        dtype_acc = "float64"
    if sum_scheme not in SUM_SCHEMES:
        raise ValueError("sum_scheme must be 'auto', 'direct_sum', 'block_sum' or 'kahan_scheme', "
                         f"got {sum_scheme!r}")
    red = reductions.get(reduction)
    if not red.sum_type:
        if dtype_acc != "auto":
            raise ValueError(f"dtype_acc={dtype_acc!r} (or use_double_acc) only applies to sum-type "
                             f"reductions ({_sum_type_names()}), not {reduction}")
        if sum_scheme not in ("auto", "direct_sum"):
            raise ValueError(f"sum_scheme={sum_scheme!r} only applies to sum-type reductions "
                             f"({_sum_type_names()}), not {reduction}")
        return opts
    if dtype_acc != "auto":
        opts["dtype_acc"] = dtype_acc
    if sum_scheme in red.sum_schemes:
        opts["sum_scheme"] = sum_scheme
    return opts


# the accumulators pykeops allows for each data dtype ("auto": the data's own)
_ACC_FOR_DATA = {"float16": ("float16", "float32"), "float32": ("float32", "float64"),
                 "float64": ("float64",)}


def accumulator_for_data(opts: dict, dtype: str, io_dtype: str = "") -> dict:
    """``opts`` with ``dtype_acc`` checked against the data, as pykeops: float16 data
    accumulates in float16 or float32, float32 data in float32 or float64, float64 data in
    float64. Half data computes in float32 here (:mod:`lazytensor.core.half`), so its
    ``"float16"`` accumulator is a float32 one: at least as accurate as pykeops's half2.
    (bfloat16, which pykeops does not take, is allowed what float16 is.)

    >>> accumulator_for_data({"dtype_acc": "float16"}, "float32", "float16")
    {'dtype_acc': 'float32'}
    """
    acc = opts.get("dtype_acc")
    if acc is None:
        return opts
    data = "float16" if io_dtype in ("float16", "bfloat16") else dtype
    allowed = _ACC_FOR_DATA.get(data, ())
    if acc not in allowed:
        rules = "; ".join(f"{d} data: {' or '.join(a)}" for d, a in _ACC_FOR_DATA.items())
        raise ValueError(f"dtype_acc={acc!r} does not apply to {io_dtype or dtype} data (as in "
                         f"pykeops, the accumulator is the data's dtype or wider: {rules})")
    if acc == "float16":
        return {**opts, "dtype_acc": "float32"}
    return opts


def keops_reduction(reduction_op: str, opt_arg=None, formula2=None) -> tuple[str, dict]:
    """``(our reduction name, options)`` for a pykeops reduction name (any case,
    ``_Reduction`` suffix allowed: "Sum", "ArgKMin" with ``opt_arg`` K, "LogSumExp" with
    weights ``formula2`` ...), read from the reduction registry.

    >>> keops_reduction("ArgKMin", 3)
    ('argkmin', {'K': 3})
    """
    if not isinstance(reduction_op, str):
        raise TypeError(f"reduction_op must be a string, got {type(reduction_op).__name__}")
    key = reduction_op.lower().removesuffix("_reduction")
    named = [r for r in reductions.all_reductions() if r.keops_name]
    red = next((r for r in named if r.keops_name.lower() == key), None)
    if red is None:
        raise ValueError(f"unknown reduction {reduction_op!r}; expected one of "
                         f"{', '.join(r.keops_name for r in named)}")
    name, opts = red.name, {}
    if red.needs_k:
        if opt_arg is None:
            raise ValueError(f"{reduction_op} needs opt_arg=K, a positive integer; got None")
        opts["K"] = integer_option(opt_arg, "opt_arg (K)", reduction_op, low=1)
    if formula2 is not None and not (red.weighted or red.weighted_variant):
        takers = [r.keops_name for r in named if r.weighted or r.weighted_variant]
        raise ValueError(f"formula2 is only used by {' and '.join(takers)}, not {reduction_op}")
    if red.weighted and formula2 is None:
        raise ValueError(f"{red.keops_name} needs formula2 (the weights)")
    if red.weighted_variant and formula2 is not None:
        name = red.weighted_variant
    return name, opts


def split_reduction_keywords(reduction: str, backend, kw: dict, opts: dict | None = None):
    """``(backend, opts, other keywords)`` from the keywords a LazyTensor reduction takes.

    pykeops's backend names map to ours; the accuracy options go through
    :func:`reduction_options`; ``device_id`` and ``use_fast_math`` through
    :func:`gpu_options`; the other options of pykeops's CUDA code are dropped. The rest
    (``call``, ``out``, ``ranges`` ...) is returned for the caller, which rejects unknown
    ones by name.
    """
    kw = dict(kw)
    acc = {k: kw.pop(k) for k in ACCURACY_OPTIONS if k in kw}
    backend, gpu = gpu_options(backend, kw.pop("device_id", None), kw.pop("use_fast_math", None))
    for k in IGNORED_OPTIONS:
        kw.pop(k, None)
    opts = dict(opts or {})
    if "K" in opts:  # argKmin(K=torch.tensor(90)): a 0-d integer tensor is an integer
        opts["K"] = integer_option(opts["K"], "K", reduction, low=1)
    opts = {**opts, **reduction_options(reduction, **acc), **gpu}
    return backend, opts, kw


GRAD_MODES = ("auto", "symbolic", "dual")

_default = {"grad_mode": "auto"}


def set_default_grad_mode(mode: str) -> None:
    """Set the process-wide default ``grad_mode`` ("auto", "symbolic" or "dual").

    >>> set_default_grad_mode("symbolic"); default_grad_mode()
    'symbolic'
    >>> set_default_grad_mode("auto")
    """
    check_grad_mode(mode)
    _default["grad_mode"] = mode


def default_grad_mode() -> str:
    """The process-wide default ``grad_mode``."""
    return _default["grad_mode"]


def check_grad_mode(mode: str) -> str:
    """``mode``, or ValueError if it is not one of :data:`GRAD_MODES`."""
    if mode not in GRAD_MODES:
        raise ValueError(f"grad_mode must be one of {GRAD_MODES}, got {mode!r}")
    return mode
