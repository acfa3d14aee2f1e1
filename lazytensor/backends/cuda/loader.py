"""CUDA kernels: built with nvcc into the kernel cache, loaded with pycuda, once per device.

``get_cuda_kernel(spec, 0)`` returns the kernel of a :class:`~lazytensor.backends.cpu.runtime.KernelSpec`
loaded on GPU 0: from the in-process table, else from the disk cache (the key covers the
device's ``sm_XX``, nvcc's identity and flags), else rendered by
:func:`lazytensor.codegen.cuda.render.render_cuda_kernel`, compiled and stored. Loading
happens in torch's primary context (``module_from_buffer``); the functions are prepared
once (one by-value argument: the packed ``LtArgs``), and the block size is chosen from the
kernel's registers and shared memory for the device's occupancy.

Building or loading a kernel is refused while the current stream captures a CUDA graph
(neither nvcc nor ``cuModuleLoadData`` can run inside a capture): run the reduction
once before capturing.
"""

from __future__ import annotations

from ...codegen import ir, reductions
from ...codegen.cuda.render import args_fields
from ...core.kernels import KernelSpec, Toolchain, kernel_binary, load_once
from . import driver
from .driver import CudaKernelError

KERNEL_NAME = "lt"  # symbols lt_reduce, lt_merge, lt_acc


def describe(spec: KernelSpec) -> str:
    """``the sum kernel of exp(-sum((x - y)**2))`` (for messages)."""
    return f"the {spec.reduction} kernel of {ir.to_text(spec.formula, limit=160)}"


def fast_math(spec: KernelSpec) -> bool:
    return bool(spec.opts_dict.get("use_fast_math", False))


def occupancy_threads(info: driver.DeviceInfo, regs: int, static_smem: int, layout: dict,
                      limit: int) -> int:
    """The block size (a multiple of 32, at most ``limit``) that keeps the most threads
    resident per multiprocessor given the kernel's registers and shared memory; among
    equals, the largest (its j-tiles serve more rows).

    >>> from lazytensor.backends.cuda.driver import DeviceInfo
    >>> h100 = DeviceInfo(0, "", "sm_90", 132, 1024, 49152, 232448, 233472, 65536, 2048, 32)
    >>> occupancy_threads(h100, 64, 0, {"smem_fixed": 0, "smem_per_thread": 0}, 256)
    256
    >>> occupancy_threads(h100, 64, 0, {"smem_fixed": 40000, "smem_per_thread": 0}, 256)
    256
    """
    best, best_resident = 32, -1
    for threads in range(32, limit + 1, 32):
        smem = static_smem + smem_bytes(layout, threads)
        if smem > info.shared_per_block_optin:
            continue
        regs_per_warp = -(-max(regs, 1) * 32 // 256) * 256  # allocated per warp, in 256s
        by_regs = info.registers_per_sm // (regs_per_warp * (threads // 32))
        by_smem = info.shared_per_sm // max(smem + 1024, 1)  # 1 KB reserved per block
        blocks = min(by_regs, by_smem, info.max_threads_per_sm // threads,
                     info.max_blocks_per_sm)
        resident = blocks * threads
        if resident >= best_resident and blocks > 0:
            best, best_resident = threads, resident
    return best


def smem_bytes(layout: dict, threads: int) -> int:
    """Dynamic shared memory of one block of ``threads`` threads."""
    return int(layout["smem_fixed"]) + int(layout["smem_per_thread"]) * threads


class CudaKernel:
    """A kernel loaded on one device: its prepared functions and launch configuration."""

    def __init__(self, spec: KernelSpec, index: int, image: bytes, layout: dict):
        drv = driver.pycuda_driver()
        self.spec, self.device = spec, index
        self.info = info = driver.device_info(index)
        self.n_vars = max([v.index + 1 for v in spec.var_specs] + [1])
        self.n_outs = len(reductions.get(spec.reduction).outputs(spec.formula.dim,
                                                                 spec.opts_dict))
        self.words = sum(n for _, n in args_fields(self.n_vars, self.n_outs))
        self.layout = layout
        self.tile = int(layout["tile"])
        self.sm_count = info.sm_count
        self.description = describe(spec)
        with driver.in_context(index):
            try:
                self.module = drv.module_from_buffer(image)
            except drv.Error as e:
                from ...codegen.cuda.nvcc import nvcc_version

                raise CudaKernelError(
                    f"the CUDA driver refused {self.description} ({e}). It was compiled for "
                    f"{info.arch} by nvcc ({nvcc_version()}); the driver supports CUDA "
                    f"{driver.driver_version()} on {info.name}. A driver older than the "
                    "toolkit cannot load its cubins: update the NVIDIA driver, or use a CUDA "
                    "toolkit no newer than the driver (set $NVCC)") from e
            self.functions = {}
            regs, static_smem, limit = 0, 0, int(layout["threads"])
            a = drv.function_attribute
            for which in ("reduce", "merge"):
                fn = self.module.get_function(f"{KERNEL_NAME}_{which}")
                fn.prepare("Q" * self.words)
                self.functions[which] = fn
                limit = min(limit, fn.get_attribute(a.MAX_THREADS_PER_BLOCK))
                if which == "reduce":
                    regs = fn.get_attribute(a.NUM_REGS)
                    static_smem = fn.get_attribute(a.SHARED_SIZE_BYTES)
            self.acc_bytes = self.module.get_global(f"{KERNEL_NAME}_acc")[1]
            limit = max(32, limit // 32 * 32)
            self.threads = occupancy_threads(info, regs, static_smem, layout, limit)
            self.smem = smem_bytes(layout, self.threads)
            if self.smem + static_smem > info.shared_per_block:
                self.functions["reduce"].set_attribute(
                    a.MAX_DYNAMIC_SHARED_SIZE_BYTES, self.smem)
        self.regs = regs


_table: dict = {}


def get_cuda_kernel(spec: KernelSpec, index: int) -> CudaKernel:
    """The kernel of ``spec`` loaded on GPU ``index`` (built and cached on first use)."""
    kernel = _table.get((spec, index))
    if kernel is not None:
        return kernel
    from . import streams

    if streams.capturing(index):
        raise CudaKernelError(
            f"{describe(spec)} is not built yet, and the current CUDA stream is capturing a "
            "graph: kernels cannot be compiled or loaded during a capture. Run the reduction "
            "once (same formula, options and dtypes) before torch.cuda.graph(...)")
    return load_once(_table, (spec, index), lambda: _load(spec, index))


def _load(spec: KernelSpec, index: int) -> CudaKernel:
    arch = driver.device_info(index).arch
    image, layout = cubin(spec, arch)
    return CudaKernel(spec, index, image, layout)


def render_source(spec: KernelSpec) -> str:
    """The ``.cu`` source of ``spec`` (its block-sparse variant when ``spec.ranged``).

    >>> from lazytensor.codegen import ir, ops
    >>> from lazytensor.codegen.render_c import VarSpec
    >>> f = ops.apply("mul", ir.var(0, 1, "i"), ir.var(1, 1, "j"))
    >>> spec = KernelSpec(f, (VarSpec(0, 1, "i"), VarSpec(1, 1, "j")), "sum", (), "float32",
    ...                   ranged=True)
    >>> "lt_interval(k, si, jb, je)" in render_source(spec)
    True
    """
    from ...codegen.cuda.render import render_cuda_kernel

    return render_cuda_kernel(spec.formula, list(spec.var_specs), spec.reduction,
                              spec.opts_dict, spec.dtype, name=KERNEL_NAME, ranged=spec.ranged)


def cubin(spec: KernelSpec, arch: str) -> tuple[bytes, dict]:
    """(cubin bytes, launch layout) of ``spec`` for ``arch``, through the kernel cache."""
    from ...codegen.compilers import CompilerNotFound
    from ...codegen.cuda import nvcc
    from ...codegen.cuda.render import kernel_layout

    try:
        identity = nvcc.cuda_identity(arch, fast_math(spec))
    except CompilerNotFound as e:
        raise CudaKernelError(f"{e}: the CUDA backend compiles its kernels with nvcc; install "
                              "the CUDA toolkit, or move the inputs to the CPU with .cpu()") from e
    layout = kernel_layout(spec.formula, list(spec.var_specs), spec.reduction, spec.opts_dict,
                           spec.dtype)
    backend = Toolchain(
        "cuda", "kernel.cubin", identity,
        render=render_source,
        compile=lambda source, tmpdir, what: nvcc.compile_cuda(
            source, tmpdir, arch, "kernel", what=describe(spec), fast_math=fast_math(spec)),
        meta={"arch": arch, "layout": layout}, label="CUDA kernel", detail=f" for {arch}")
    return kernel_binary(backend, spec).data, layout  # exactly the bytes the cache verified


__all__ = ["CudaKernel", "CudaKernelError", "cubin", "describe", "get_cuda_kernel",
           "occupancy_threads", "render_source"]
