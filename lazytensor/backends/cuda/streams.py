"""Which stream a kernel runs on, and how a kernel fault finds its way to the user.

pycuda launches on a ``pycuda.driver.Stream`` or on the null stream; it cannot launch on a
raw ``CUstream`` such as torch's. So:

- when torch's current stream is the default (legacy null) stream, kernels launch on it
  directly, ordered with everything torch queues there;
- otherwise (torch on a stream of its own, created non-blocking: the null stream would
  *not* be ordered with it), kernels launch on a pycuda stream of ours, wrapped as
  ``torch.cuda.ExternalStream``: it waits for torch's stream before the launches, and
  torch's stream waits for it after, so the caller sees stream-ordered semantics and the
  caching allocator may reuse the buffers on its stream.

Faults: a kernel that faults (an illegal address, say) is reported by the driver at some
later synchronization, often inside torch. So each call records an event after its
launches; the next reduction on the device (or :func:`synchronize`) queries the events of
earlier calls and, on an error, raises naming the first lazytensor kernel not known to
have finished, with its formula. ``LAZYTENSOR_CUDA_SYNC=1`` waits for each call's event
at once, so the error names the kernel that faulted. Nothing is recorded or queried while
a CUDA graph is being captured.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading

from . import driver

api = None  # torch.cuda, or a stand-in with the same functions (the emulator's tests)
_MAX_IN_FLIGHT = 256


def torch_cuda():
    """``torch.cuda`` (or the stand-in set in :data:`api`)."""
    if api is not None:
        return api
    import torch

    return torch.cuda


def capturing(index: int) -> bool:
    """Whether torch's current stream on device ``index`` is capturing a CUDA graph."""
    tc = torch_cuda()
    try:
        with tc.device(index):
            return bool(tc.is_current_stream_capturing())
    except (RuntimeError, AttributeError, AssertionError):
        return False


def sync_mode() -> bool:
    return os.environ.get("LAZYTENSOR_CUDA_SYNC", "") not in ("", "0")


class _Device:
    """Per device: our pycuda stream, its torch wrapper, and the calls in flight."""

    def __init__(self, index: int):
        drv = driver.pycuda_driver()
        self.index = index
        with driver.in_context(index):
            self.stream = drv.Stream(1)  # CU_STREAM_NON_BLOCKING
        self._external = None
        self.in_flight: collections.deque = collections.deque()
        self.lock = threading.Lock()

    @property
    def external(self):
        """Our stream as a ``torch.cuda.ExternalStream`` (made on first use: NumPy calls
        never need it)."""
        if self._external is None:
            self._external = torch_cuda().ExternalStream(self.stream.handle, device=self.index)
        return self._external


_devices: dict = {}


def _device(index: int) -> _Device:
    d = _devices.get(index)
    if d is None:
        d = _devices.setdefault(index, _Device(index))
    return d


@contextlib.contextmanager
def launch_scope(index: int, description: str, torch_stream: bool = True):
    """``with launch_scope(k, what) as stream:`` launch on ``stream`` (None: the null stream).

    Inside, device k's primary context is current. ``torch_stream=False`` (NumPy arrays,
    no torch stream involved) launches on the null stream.
    """
    drv = driver.pycuda_driver()
    dev = _device(index)
    capture = torch_stream and capturing(index)
    if not capture:
        check(index)
    current = torch_cuda().current_stream(index) if torch_stream else None
    own = current is not None and current.cuda_stream != 0
    if own:
        dev.external.wait_stream(current)
    with driver.in_context(index):
        stream = dev.stream if own else None
        try:
            yield stream
            if not capture:
                event = drv.Event()
                event.record(stream)
        except drv.Error as e:  # the context holds an earlier kernel's fault
            raise _fault(dev, e, description) from e
        if not capture:
            with dev.lock:
                dev.in_flight.append((event, description))
                while len(dev.in_flight) > _MAX_IN_FLIGHT:
                    dev.in_flight.popleft()
    if own:
        current.wait_stream(dev.external)
    if not capture and sync_mode():
        check(index, wait=True)


def check(index: int, wait: bool = False) -> None:
    """Raise if a kernel launched earlier on device ``index`` failed (``wait``: wait for
    all of them first)."""
    dev = _devices.get(index)
    if dev is None or not dev.in_flight:
        return
    drv = driver.pycuda_driver()
    with dev.lock, driver.in_context(index):
        while dev.in_flight:
            event, description = dev.in_flight[0]
            try:
                if wait:
                    event.synchronize()
                elif not event.query():
                    return
            except drv.Error as e:
                raise _fault(dev, e, description) from e
            dev.in_flight.popleft()


def _fault(dev: _Device, error, description: str):
    """The error that names the first of our kernels not known to have finished."""
    from .driver import CudaKernelError

    if dev.in_flight:
        description = dev.in_flight[0][1]
    exact = sync_mode() and len(dev.in_flight) <= 1
    dev.in_flight.clear()
    if exact:
        return CudaKernelError(
            f"{description} failed: {error}. The CUDA context is unusable after such an "
            "error: restart the process")
    return CudaKernelError(
        f"a CUDA kernel failed ({error}); the first of lazytensor's kernels not known to "
        f"have finished is {description}. The fault may also come from other work on the "
        "device; with LAZYTENSOR_CUDA_SYNC=1 each reduction waits for its kernels and the "
        "error names the one that faulted. The CUDA context is unusable after such an "
        "error: restart the process")


def synchronize(device=None) -> None:
    """Wait for lazytensor's kernels on ``device`` (default: every device used) and raise
    :class:`~lazytensor.backends.cuda.loader.CudaKernelError` naming the kernel if one failed."""
    indices = list(_devices) if device is None else [_index(device)]
    for index in indices:
        check(index, wait=True)


def _index(device) -> int:
    if isinstance(device, int):
        return device
    text = str(device)
    return int(text.split(":", 1)[1]) if ":" in text else 0


__all__ = ["api", "capturing", "check", "launch_scope", "synchronize", "torch_cuda"]
