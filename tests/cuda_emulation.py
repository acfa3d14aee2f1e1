"""Running the CUDA backend without a GPU: a fake ``libcuda`` over host-compiled kernels.

The CUDA source of a kernel, plus :func:`codegen.render_cuda.render_cuda_emulator`, is
compiled with the C++ compiler into a shared library whose ``lt_emulate_*`` functions run
the kernel's phases block by block, thread by thread. A fake ``libcuda`` (below) takes the
path of that library as the "cubin": ``cuModuleLoadData`` dlopens it,
``cuModuleGetFunction("lt_reduce")`` finds ``lt_emulate_reduce``, ``cuLaunchKernel`` calls
it with ``kernelParams[0]`` (the packed ``LtArgs``) and the grid. So the real
:mod:`lazytensor.cuda_driver` and :mod:`lazytensor.cuda_runtime` code runs, on CPU
tensors; only the GPU itself and the stream handle are stand-ins.
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

FAKE_LIBCUDA = r"""
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
extern "C" {
typedef int CUresult;
static int depth = 0;
static int64_t launches = 0;
static void* const CTX = (void*)0x5ca1ab1e;
static int env_int(const char* name, int dflt) { const char* e = getenv(name); return e && *e ? atoi(e) : dflt; }
CUresult cuInit(unsigned flags) { return env_int("FAKE_CUDA_INIT_ERROR", 0); }
CUresult cuDriverGetVersion(int* v) { *v = 13000; return 0; }
CUresult cuDeviceGet(int* d, int i) { if (i != 0) return 101; *d = i; return 0; }
CUresult cuDeviceGetAttribute(int* out, int attr, int dev) {
  if (dev != 0) return 101;
  if (attr == 16) { *out = env_int("FAKE_CUDA_SMS", 2); return 0; }
  if (attr == 75) { *out = 9; return 0; }
  if (attr == 76) { *out = 0; return 0; }
  return 1;
}
CUresult cuDevicePrimaryCtxRetain(void** ctx, int dev) { *ctx = CTX; return 0; }
CUresult cuCtxPushCurrent_v2(void* ctx) { if (ctx != CTX) return 201; ++depth; return 0; }
CUresult cuCtxPopCurrent_v2(void** ctx) { if (depth == 0) return 201; --depth; *ctx = CTX; return 0; }
CUresult cuModuleLoadData(void** mod, const void* image) {
  if (depth == 0) return 201;
  void* h = dlopen((const char*)image, RTLD_NOW | RTLD_LOCAL);
  if (!h) { fprintf(stderr, "%s\n", dlerror()); return 200; }
  *mod = h; return 0;
}
static void* emulated(void* mod, const char* name, const char* infix) {
  char buf[256]; const char* us = strrchr(name, '_');
  if (!us || strlen(name) > 200) return 0;
  snprintf(buf, sizeof buf, "%.*s_%s%s", (int)(us - name), name, infix, us + 1);
  return dlsym(mod, buf);
}
CUresult cuModuleGetFunction(void** fn, void* mod, const char* name) {
  if (depth == 0) return 201;
  *fn = emulated(mod, name, "emulate_"); return *fn ? 0 : 500;
}
CUresult cuModuleGetGlobal_v2(uint64_t* ptr, size_t* bytes, void* mod, const char* name) {
  if (depth == 0) return 201;
  char buf[256]; snprintf(buf, sizeof buf, "%.200s_bytes", name);  /* lt_acc -> lt_acc_bytes */
  void* f = dlsym(mod, buf);
  if (!f) return 500;
  *ptr = 0; *bytes = (size_t)((int64_t (*)(void))f)(); return 0;
}
CUresult cuFuncGetAttribute(int* out, int attr, void* fn) {
  if (attr != 0 || !fn) return 1;
  *out = env_int("FAKE_CUDA_MAX_THREADS", 64); return 0;
}
CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned smem, void* stream, void** params, void** extra) {
  if (depth == 0) return 201;
  if (gy != 1 || gz != 1 || by != 1 || bz != 1 || extra != 0 || gx == 0 || bx == 0) return 1;
  ++launches;
  return ((int (*)(const void*, int64_t, int))f)(params[0], (int64_t)gx, (int)bx) ? 719 : 0;
}
CUresult cuStreamSynchronize(void* stream) { return 0; }
CUresult cuGetErrorName(CUresult code, const char** s) {
  *s = code == 100 ? "CUDA_ERROR_NO_DEVICE" : code == 201 ? "CUDA_ERROR_INVALID_CONTEXT" : "CUDA_ERROR_FAKE";
  return 0;
}
CUresult cuGetErrorString(CUresult code, const char** s) { *s = "fake driver error"; return 0; }
int fake_context_depth(void) { return depth; }
int64_t fake_launches(void) { return launches; }
}  // extern "C"
"""

_dir = Path(tempfile.mkdtemp(prefix="lazytensor-cuda-emulation-"))


def cxx() -> list[str] | None:
    """The C++ compiler's command (``$CXX`` may be a command with arguments)."""
    from lazytensor.codegen.compilers import cpu_compiler

    return cpu_compiler().argv


def _build(source: str, stem: str, extra=()) -> Path:
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    out = _dir / f"{stem}-{digest}.so"
    if not out.exists():
        src = _dir / f"{stem}-{digest}.cpp"
        src.write_text(source)
        cmd = [*cxx(), "-O1", "-std=c++14", "-fPIC", "-shared", "-w", str(src), "-o",
               str(out), *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)}\n{proc.stderr[-6000:]}")
    return out


def fake_libcuda() -> Path:
    return _build(FAKE_LIBCUDA, "fake-libcuda", ["-ldl"])


def emulated_kernel_library(spec) -> Path:
    """The host library standing for the cubin of a ``KernelSpec``."""
    from lazytensor.codegen.render_cuda import render_cuda_emulator, render_cuda_kernel

    source = render_cuda_kernel(spec.formula, list(spec.var_specs), spec.reduction,
                                spec.opts_dict, spec.dtype, name="lt")
    return _build(source + render_cuda_emulator("lt"), "kernel")


@atexit.register
def cleanup() -> None:
    shutil.rmtree(_dir, ignore_errors=True)
