"""The parts of ``torch.cuda`` the runtime calls, over the fake driver (CPU torch in CI).

With a CPU build of torch there are no CUDA tensors and no CUDA streams, so the emulated
GPU works on CPU tensors (host memory is device memory for the fake driver) and this
stand-in gives the runtime torch's stream calls: streams are fake-driver streams, and
``wait_stream`` records an event on one and makes the other wait for it, as torch does.
"""

from __future__ import annotations

import contextlib
import ctypes

_P = ctypes.c_void_p


class Streams:
    """Driver calls on raw handles, in device 0's primary context."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        for name, args in {
            "cuDevicePrimaryCtxRetain": [ctypes.POINTER(_P), ctypes.c_int],
            "cuCtxPushCurrent_v2": [_P], "cuCtxPopCurrent_v2": [ctypes.POINTER(_P)],
            "cuStreamCreate": [ctypes.POINTER(_P), ctypes.c_uint],
            "cuStreamSynchronize": [_P], "cuStreamQuery": [_P], "cuCtxSynchronize": [],
            "cuEventCreate": [ctypes.POINTER(_P), ctypes.c_uint],
            "cuEventRecord": [_P, _P], "cuStreamWaitEvent": [_P, _P, ctypes.c_uint],
        }.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        self.lib.cuInit(0)
        self.ctx = _P()
        self._check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), 0), "retain")

    def _check(self, rc: int, what: str) -> None:
        if rc:
            raise RuntimeError(f"fake driver: {what} failed with CUresult {rc}")

    @contextlib.contextmanager
    def context(self):
        self._check(self.lib.cuCtxPushCurrent_v2(self.ctx), "push")
        try:
            yield
        finally:
            old = _P()
            self.lib.cuCtxPopCurrent_v2(ctypes.byref(old))

    def create(self) -> int:
        h = _P()
        with self.context():
            self._check(self.lib.cuStreamCreate(ctypes.byref(h), 1), "cuStreamCreate")
        return h.value

    def wait(self, waiter: int, waited: int) -> None:
        ev = _P()
        with self.context():
            self._check(self.lib.cuEventCreate(ctypes.byref(ev), 0), "cuEventCreate")
            self._check(self.lib.cuEventRecord(ev, _P(waited)), "cuEventRecord")
            self._check(self.lib.cuStreamWaitEvent(_P(waiter), ev, 0), "cuStreamWaitEvent")

    def synchronize(self, handle: int | None = None) -> None:
        with self.context():
            rc = (self.lib.cuCtxSynchronize() if handle is None
                  else self.lib.cuStreamSynchronize(_P(handle)))
        self._check(rc, "synchronize")

    def hold(self, handle: int) -> None:
        with self.context():
            self.lib.fake_cuda_stream_hold(_P(handle))

    def release(self, handle: int) -> None:
        with self.context():
            self.lib.fake_cuda_stream_release(_P(handle))


class FakeStream:
    def __init__(self, api: FakeTorchCuda, handle: int):
        self.api, self.cuda_stream = api, handle

    def wait_stream(self, other: FakeStream) -> None:
        self.api.streams.wait(self.cuda_stream, other.cuda_stream)
        self.api.log.append(("wait", self.cuda_stream, other.cuda_stream))

    def synchronize(self) -> None:
        self.api.streams.synchronize(self.cuda_stream)

    def __eq__(self, other):
        return isinstance(other, FakeStream) and other.cuda_stream == self.cuda_stream

    def __hash__(self):
        return hash(self.cuda_stream)


class FakeTorchCuda:
    """``torch.cuda``'s stream functions for the emulated GPU (device 0's streams)."""

    def __init__(self, lib: ctypes.CDLL):
        self.streams = Streams(lib)
        self._current = FakeStream(self, 0)
        self.capturing = False
        self.log: list = []  # ("wait", waiter, waited) in order

    def current_stream(self, device=None) -> FakeStream:
        return self._current

    def default_stream(self, device=None) -> FakeStream:
        return FakeStream(self, 0)

    def Stream(self, device=None, priority=0) -> FakeStream:  # noqa: N802 (torch's name)
        return FakeStream(self, self.streams.create())

    def ExternalStream(self, handle, device=None) -> FakeStream:  # noqa: N802
        return FakeStream(self, int(handle))

    @contextlib.contextmanager
    def stream(self, s: FakeStream):
        saved, self._current = self._current, s
        try:
            yield
        finally:
            self._current = saved

    @contextlib.contextmanager
    def device(self, index):
        yield

    def is_current_stream_capturing(self) -> bool:
        return self.capturing

    def current_device(self) -> int:
        return 0

    def device_count(self) -> int:
        return 2

    def synchronize(self, device=None) -> None:
        self.streams.synchronize()
