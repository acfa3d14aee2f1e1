"""Backends: one protocol, found by name.

A backend runs bound reductions (:class:`lazytensor.core.call.ReductionCall`) on arrays of
one kind of device. Each is a subpackage of :mod:`lazytensor.backends` whose ``BACKEND``
is a :class:`BackendRuntime`; the registry finds them by the folders there, so adding a
backend is adding a folder (CONTRIBUTING.md says what goes in it). What a backend gives:

- its names (``name``, ``aliases``), the device type of the arrays it runs on
  (``device``; None: any, copied to the host), whether ``backend="auto"`` may pick it for
  that device (``auto``, lowest first), whether NumPy arrays run on it by being copied to
  its device and back (``copies_numpy``), and why it cannot run here (:meth:`problem`);
- :meth:`~BackendRuntime.executor`: the launcher of one call for one layout of its
  arrays (it allocates the outputs and runs the kernel, which the backend renders,
  compiles and loads through :func:`lazytensor.core.kernels.kernel_binary`);
- ``tuning``: the thresholds its kernels are tuned with
  (:class:`lazytensor.codegen.tuning.Tuning`), with which the shared passes plan the
  sums of its calls' gradients (None: the formulas run as they are);
- a ``doctor`` module beside it: ``NAMES``, ``checks(kernel)`` and ``summary(checks)``,
  what ``python -m lazytensor doctor`` reports of it (:mod:`lazytensor.cli.doctor`).

The batch layout every kernel reads is :func:`lazytensor.core.batch.batch_layout`.

>>> names()
('cpu', 'cuda', 'numpy')
>>> resolve("gpu", "cuda:0"), resolve("numpy", "cuda:0"), resolve("cuda", "cpu", "numpy")
('cuda', 'numpy', 'cuda')
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
import warnings
from typing import Callable

_PACKAGE = importlib.util.resolve_name("..backends", __package__)


class BackendRuntime:
    """One backend (the defaults are those of a backend on CPU arrays that ``"auto"``
    never picks); subclasses set the attributes and write :meth:`executor`."""

    name: str = ""
    aliases: tuple = ()
    device: str | None = "cpu"
    auto: int | None = None
    copies_numpy: bool = False
    needs: str = "CPU arrays"  # what its arrays must be, for messages
    contiguous_inputs: bool = True  # its launcher reads contiguous arrays (copies made first)
    tuning = None  # codegen.tuning.Tuning of its kernels, for the shared planning passes

    def problem(self) -> str | None:
        """Why this backend cannot run on this machine (None: it can)."""
        return None

    def executor(self, call, shapes: tuple, out_specs: list) -> Callable:
        """``run(arrays, ranges) -> outputs`` for ``call`` on contiguous arrays of
        ``shapes``; ``out_specs`` are the outputs' (shape, dtype) in the call's library."""
        raise NotImplementedError


@functools.cache
def _folders() -> tuple:
    package = importlib.import_module("..backends", __package__)
    return tuple(sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.ispkg))


@functools.cache
def _runtime(folder: str) -> BackendRuntime:
    return importlib.import_module(f"{_PACKAGE}.{folder}").BACKEND


def runtimes() -> list[BackendRuntime]:
    """Every backend, in the order of their folders."""
    return [_runtime(f) for f in _folders()]


def names() -> tuple:
    """The backends' names (not their aliases)."""
    return tuple(sorted(r.name for r in runtimes()))


def choices() -> tuple:
    """Every backend name a call takes: ``"auto"``, the names and their aliases
    (``"cuda:k"`` also picks GPU k)."""
    return ("auto", *sorted(n for r in runtimes() for n in (r.name, *r.aliases)))


def get(name: str) -> BackendRuntime:
    """The backend called ``name`` (or one of its aliases); ValueError for another name."""
    for r in runtimes():
        if name == r.name or name in r.aliases:
            return r
    raise ValueError(f"unknown backend {name!r}; expected one of {choices()}")


def split_device(backend):
    """``"cuda:1"`` -> ``("cuda", 1)``; ``"cpu"`` -> ``("cpu", None)``."""
    if isinstance(backend, str) and ":" in backend:
        name, _, index = backend.partition(":")
        if index.isdigit():
            try:
                if get(name).device not in (None, "cpu"):
                    return name, int(index)
            except ValueError:
                pass
    return backend, None


_warned_fallback = False


def resolve(backend: str, device: str, library: str = "torch") -> str:
    """The backend that runs a call on ``device`` ("auto": the first available backend for
    the device, the NumPy reference with a warning when none is; NumPy arrays with a
    backend of another device are copied there and back where the backend says so)."""
    name, _ = split_device(backend)
    if not isinstance(name, str):
        raise ValueError(f"unknown backend {backend!r}; expected one of {choices()}")
    chosen = None if name == "auto" else get(name)
    if device == "meta":  # shapes only (lazytensor.integrations.torch_library): planned for the host
        return chosen.name if chosen is not None and chosen.device is None else _auto("cpu", False)
    kind = device.split(":", 1)[0]
    if chosen is None:
        return _auto(kind, True)
    if chosen.device in (None, kind) or (kind == "cpu" and library == "numpy"
                                         and chosen.copies_numpy):
        return chosen.name
    raise ValueError(f"backend={name!r} needs {chosen.needs}, got arrays on {device}; move "
                     f"them with .{chosen.device}()")


def _auto(kind: str, check: bool) -> str:
    global _warned_fallback
    candidates = sorted((r for r in runtimes() if r.device == kind and r.auto is not None),
                        key=lambda r: r.auto)
    if not candidates:
        kinds = sorted({r.device for r in runtimes() if r.device})
        raise NotImplementedError(f"tensors on {kind}: lazytensor runs on {' and '.join(kinds)}")
    problems = []
    for r in candidates:
        problem = r.problem() if check else None
        if problem is None:
            return r.name
        problems.append(f"{r.name}: {problem}")
    fallback = next(r for r in runtimes() if r.device is None)
    if not _warned_fallback:
        _warned_fallback = True
        warnings.warn(f"no backend can run here ({'; '.join(problems)}): falling back to the "
                      f"(slow) {fallback.name} reference backend", RuntimeWarning, stacklevel=5)
    return fallback.name


def target_device(backend, sig) -> str:
    """The device of a call on a GPU backend (``sig``: the bound arrays' signature): for
    NumPy arrays ``cuda:k`` (k from a ``"cuda:k"`` backend, default 0); for torch tensors
    their own device, which a ``cuda:k`` backend must match."""
    _, index = split_device(backend)
    if sig.library == "numpy":
        return f"cuda:{index or 0}"
    if index is not None and sig.device.startswith("cuda") and sig.device != f"cuda:{index}":
        raise ValueError(f"device_id={index} (backend {backend!r}) but the tensors are on "
                         f"{sig.device}: move them with .to('cuda:{index}')")
    return sig.device


def device_index(device: str) -> int:
    """``"cuda:1"`` -> 1; ``"cuda"`` -> torch's current device."""
    if ":" in device:
        return int(device.split(":", 1)[1])
    import torch

    return torch.cuda.current_device()


__all__ = ["BackendRuntime", "choices", "device_index", "get", "names", "resolve", "runtimes",
           "split_device", "target_device"]
