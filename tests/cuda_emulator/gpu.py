"""The ``gpu`` test fixture's two faces: a real GPU (torch CUDA tensors), or the emulator.

Tests written against :class:`Gpu` run unchanged on both. On the emulator (CI: no GPU,
torch built for the CPU), "device" tensors are CPU tensors: the fake driver treats host
memory as device memory. Everything from the engine's CUDA branch down is the code a GPU
run uses -- the kernel cache and nvcc, pycuda's module load, prepared calls and streams,
the stream rule -- except three stand-ins: the engine sends these CPU tensors to the CUDA
backend, ``torch.cuda``'s stream calls are :class:`torch_side.FakeTorchCuda`'s, and each
cubin nvcc builds gets its emulated twin registered for the fake driver to run.
"""

from __future__ import annotations

import contextlib


class Gpu:
    """What a test needs from a GPU, on hardware."""

    emulated = False
    name = "hardware"

    def __init__(self):
        import torch

        self.torch = torch

    def to(self, t):
        return t.cuda()

    def is_device(self, t) -> bool:
        return t.is_cuda

    def Stream(self):  # noqa: N802
        return self.torch.cuda.Stream()

    def stream(self, s):
        return self.torch.cuda.stream(s)

    def current_stream(self):
        return self.torch.cuda.current_stream()

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    def check(self) -> None:
        """Fail the test if the device saw a race or a divergent barrier (emulator only)."""


class EmulatedGpu(Gpu):
    """The emulator's GPU; ``install(monkeypatch)`` routes the runtime to it for one test."""

    emulated = True
    name = "emulator"

    def __init__(self):
        super().__init__()
        from . import emulator

        self.emu = emulator()
        from .torch_side import FakeTorchCuda

        self.api = FakeTorchCuda(self.emu.lib)

    def install(self, monkeypatch) -> None:
        from lazytensor.backends.cuda import loader as kernels
        from lazytensor.backends.cuda import streams
        from lazytensor.core import backend

        from .torch_side import FakeTorchCuda

        self.api = FakeTorchCuda(self.emu.lib)
        monkeypatch.setattr(streams, "api", self.api)
        monkeypatch.setattr(streams, "_devices", {})
        resolve = backend.resolve

        def resolve_on_emulator(name, device, library="torch"):
            base, _ = backend.split_device(name)
            if device == "cpu" and library == "torch" and base in ("auto", "cuda", "gpu"):
                return "cuda"
            return resolve(name, device, library)

        monkeypatch.setattr(backend, "resolve", resolve_on_emulator)
        index = backend.device_index
        monkeypatch.setattr(backend, "device_index",
                            lambda device: 0 if device == "cpu" else index(device))
        cubin = kernels.cubin
        emu = self.emu

        def cubin_with_twin(spec, arch):
            image, layout = cubin(spec, arch)
            emu.register(image, lambda: kernels.render_source(spec))
            return image, layout

        monkeypatch.setattr(kernels, "cubin", cubin_with_twin)
        self.emu.clear_failures()
        self.emu.clear_launch_log()

    def to(self, t):
        return t.clone()

    def is_device(self, t) -> bool:
        return t.device.type == "cpu"

    def Stream(self):  # noqa: N802
        return self.api.Stream()

    def stream(self, s):
        return self.api.stream(s)

    def current_stream(self):
        return self.api.current_stream()

    def synchronize(self) -> None:
        self.api.synchronize()

    @contextlib.contextmanager
    def held(self, s):
        """Work queued on ``s`` inside waits until the block ends (the GPU is 'busy')."""
        self.api.streams.hold(s.cuda_stream)
        try:
            yield
        finally:
            self.api.streams.release(s.cuda_stream)

    def check(self) -> None:
        failures = self.emu.failures()
        self.emu.clear_failures()
        self.emu.lib.fake_cuda_reset()
        assert not failures, f"the emulator saw:\n{failures}"
