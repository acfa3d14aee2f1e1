// A fake libcuda.so.1: the CUDA driver API that pycuda and lazytensor's runtime call,
// over host memory, with kernels run by the emulator (runtime.cpp).
//
// - Devices: FAKE_CUDA_DEVICES (default 2) devices of compute capability 9.0 with
//   FAKE_CUDA_SMS (default 132) multiprocessors; one primary context each; a context
//   stack per OS thread. Calls that need a current context fail without one, as the
//   real driver does.
// - Memory: device memory is host memory (malloc), so pointers from torch CPU tensors
//   work as device pointers too.
// - Modules: a cubin is identified by the FNV-1a hash of its bytes (the ELF's size comes
//   from its header); FAKE_CUDA_MODULES/<hash>.so is the same kernel source compiled for
//   the emulator. Functions are that library's lt_emu_kernel_<name> entries.
// - Streams: each stream is a queue run in order on the calling thread. A stream is held
//   by fake_cuda_stream_hold (tests) or by waiting for an event not yet reached. The
//   legacy null stream waits for, and is waited for by, the blocking streams.
// - Faults: FAKE_CUDA_FAULT=<kernel name> makes that kernel fail when it runs with
//   CUDA_ERROR_ILLEGAL_ADDRESS, sticky for the context; FAKE_CUDA_REFUSE_MODULES=<code>
//   makes module loads fail with that code; emulator failures (races, divergence) are
//   collected for fake_cuda_failures().
#include <cuda.h>
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime.h"

namespace {

int env_int(const char* name, int dflt) {
  const char* e = getenv(name);
  return e && *e ? atoi(e) : dflt;
}

struct Ctx;
struct Event {
  Ctx* ctx;
  uint64_t recorded = 0;  // records asked for
  uint64_t reached = 0;   // records the stream has passed
};

struct Op {
  enum Kind { LAUNCH, RECORD, WAIT, HOLD, HOSTFN, COPY } kind;
  std::string name;
  void (*entry)(const char*) = nullptr;
  std::vector<char> params;
  unsigned grid[3], block[3];
  size_t smem = 0;
  uintptr_t tls_lo = 0;
  size_t tls_size = 0;
  Event* event = nullptr;
  uint64_t generation = 0;
  int hold = 0;
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

struct Stream {
  Ctx* ctx;
  unsigned flags;
  std::deque<Op> queue;
  int held = 0;  // fake_cuda_stream_hold count still in force at the queue's head
};

struct Module {
  void* handle;
  std::string path;
  uintptr_t tls_lo = 0;
  size_t tls_size = 0;
};

struct Func {
  Module* module;
  std::string name;
  void (*entry)(const char*);
  size_t param_bytes;
  int max_dynamic_smem = 48 * 1024;
};

struct Ctx {
  int device;
  int retained = 0;
  CUresult sticky = CUDA_SUCCESS;
  CUresult pending = CUDA_SUCCESS;  // a fault the host has not observed yet
  Stream null_stream{nullptr, 0, {}, 0};
  std::vector<Stream*> streams;
  int64_t launches = 0;
};

std::vector<std::unique_ptr<Ctx>> g_ctx;
thread_local std::vector<Ctx*> t_stack;
bool g_init = false;
std::string g_launch_log;

int device_count() { return env_int("FAKE_CUDA_DEVICES", 2); }

Ctx* primary(int dev) {
  while ((int)g_ctx.size() <= dev) {
    g_ctx.emplace_back(new Ctx());
    g_ctx.back()->device = (int)g_ctx.size() - 1;
    g_ctx.back()->null_stream.ctx = g_ctx.back().get();
  }
  return g_ctx[dev].get();
}

Ctx* current() { return t_stack.empty() ? nullptr : t_stack.back(); }

#define NEED_INIT() \
  if (!g_init) return CUDA_ERROR_NOT_INITIALIZED
#define NEED_CTX()                                  \
  NEED_INIT();                                      \
  Ctx* ctx = current();                             \
  if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;      \
  if (ctx->sticky) return ctx->sticky

Stream* stream_of(Ctx* ctx, CUstream h) {
  if (h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
    return &ctx->null_stream;
  return (Stream*)h;
}

// ------------------------------------------------------------------ stream execution

bool runnable(Stream* s) {
  if (s->queue.empty()) return false;
  const Op& op = s->queue.front();
  if (op.kind == Op::HOLD) return op.hold == 0;
  if (op.kind == Op::WAIT) return op.event->reached >= op.generation;
  return true;
}

void execute(Ctx* ctx, Op& op) {
  switch (op.kind) {
    case Op::LAUNCH: {
      ++ctx->launches;
      const char* fault = getenv("FAKE_CUDA_FAULT");
      if (ctx->sticky || ctx->pending) return;
      if (fault && *fault && op.name == fault) {
        // as on a GPU, the host learns of it at its next look at the device's progress
        ctx->pending = CUDA_ERROR_ILLEGAL_ADDRESS;
        return;
      }
      int rc = lt_emu_launch(op.entry, op.params.data(), op.name.c_str(), op.grid, op.block,
                             op.smem, op.tls_lo, op.tls_size);
      if (rc) ctx->sticky = CUDA_ERROR_LAUNCH_FAILED;
      return;
    }
    case Op::RECORD:
      if (op.event->reached < op.generation) op.event->reached = op.generation;
      return;
    case Op::COPY:
      if (!ctx->sticky) memcpy(op.dst, op.src, op.bytes);
      return;
    default:
      return;
  }
}

// Run every stream of the context as far as it can go.
void pump(Ctx* ctx) {
  bool progress = true;
  while (progress) {
    progress = false;
    std::vector<Stream*> all{&ctx->null_stream};
    all.insert(all.end(), ctx->streams.begin(), ctx->streams.end());
    for (Stream* s : all) {
      while (runnable(s)) {
        Op op = std::move(s->queue.front());
        s->queue.pop_front();
        execute(ctx, op);
        progress = true;
      }
    }
  }
}

Event* new_event(Ctx* ctx) {
  Event* e = new Event();
  e->ctx = ctx;
  return e;
}

void enqueue_record(Stream* s, Event* e) {
  Op op;
  op.kind = Op::RECORD;
  op.event = e;
  op.generation = ++e->recorded;
  s->queue.push_back(std::move(op));
}

void enqueue_wait(Stream* s, Event* e) {
  Op op;
  op.kind = Op::WAIT;
  op.event = e;
  op.generation = e->recorded;
  s->queue.push_back(std::move(op));
}

// Legacy null-stream semantics: work on the null stream waits for the blocking streams'
// earlier work, and their later work waits for it.
void order_with_null_stream(Ctx* ctx, Stream* s) {
  if (s == &ctx->null_stream) {
    for (Stream* o : ctx->streams) {
      if (o->flags & CU_STREAM_NON_BLOCKING) continue;
      Event* e = new_event(ctx);  // leaked: tiny, tests only
      enqueue_record(o, e);
      enqueue_wait(s, e);
    }
  } else if (!(s->flags & CU_STREAM_NON_BLOCKING)) {
    Event* e = new_event(ctx);
    enqueue_record(&ctx->null_stream, e);
    enqueue_wait(s, e);
  }
}

// The host looks at the device's progress (a query, a synchronization, a blocking copy):
// a fault that happened meanwhile becomes the context's sticky error.
CUresult observe(Ctx* ctx) {
  pump(ctx);
  if (ctx->pending) ctx->sticky = ctx->pending;
  return ctx->sticky;
}

bool drained(Ctx* ctx) {
  if (!ctx->null_stream.queue.empty()) return false;
  for (Stream* s : ctx->streams)
    if (!s->queue.empty()) return false;
  return true;
}

// FNV-1a over the image; an ELF's length comes from its header, other images are text.
uint64_t image_hash(const void* image, size_t* size) {
  const unsigned char* p = (const unsigned char*)image;
  size_t n;
  if (memcmp(p, "\x7f" "ELF", 4) == 0 && p[4] == 2) {
    uint64_t shoff;
    uint16_t shentsize, shnum;
    memcpy(&shoff, p + 0x28, 8);
    memcpy(&shentsize, p + 0x3A, 2);
    memcpy(&shnum, p + 0x3C, 2);
    n = shoff + (size_t)shentsize * shnum;
  } else {
    n = strlen((const char*)p);
  }
  uint64_t h = 1469598103934665603ull;
  for (size_t k = 0; k < n; ++k) h = (h ^ p[k]) * 1099511628211ull;
  *size = n;
  return h;
}

struct ErrorName {
  int code;
  const char *name, *text;
};
const ErrorName ERRORS[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
    {218, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain."},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

}  // namespace

extern "C" {

// ------------------------------------------------------------------ init, errors, devices

CUresult cuInit(unsigned int) {
  int e = env_int("FAKE_CUDA_INIT_ERROR", 0);
  if (e) return (CUresult)e;
  g_init = true;
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* v) {
  *v = env_int("FAKE_CUDA_DRIVER_VERSION", 13000);
  return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult code, const char** s) {
  for (const ErrorName& e : ERRORS)
    if (e.code == (int)code) return *s = e.name, CUDA_SUCCESS;
  *s = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult code, const char** s) {
  for (const ErrorName& e : ERRORS)
    if (e.code == (int)code) return *s = e.text, CUDA_SUCCESS;
  *s = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDeviceGetCount(int* n) {
  NEED_INIT();
  *n = device_count();
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  NEED_INIT();
  if (ordinal < 0 || ordinal >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  NEED_INIT();
  if (d < 0 || d >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, (size_t)len, "Fake CUDA device %d (emulator)", d);
  return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t* bytes, CUdevice d) {
  NEED_INIT();
  if (d < 0 || d >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = (size_t)16 << 30;
  return CUDA_SUCCESS;
}

CUresult cuDeviceComputeCapability(int* major, int* minor, CUdevice) {
  *major = 9;
  *minor = 0;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int* out, CUdevice_attribute attr, CUdevice d) {
  NEED_INIT();
  if (d < 0 || d >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  switch (attr) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *out = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *out = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *out = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *out = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *out = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *out = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *out = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *out = 49152; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: *out = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *out = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *out = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *out = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *out = env_int("FAKE_CUDA_SMS", 132); break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *out = 50 << 20; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *out = 2048; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *out = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *out = 0; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *out = 233472; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: *out = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *out = LT_EMU_MAX_SMEM; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: *out = 32; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *out = 1; break;
    default: *out = 0; break;
  }
  return CUDA_SUCCESS;
}

// ------------------------------------------------------------------ contexts

CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  NEED_INIT();
  if (d < 0 || d >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  Ctx* ctx = primary(d);
  ++ctx->retained;
  *c = (CUcontext)ctx;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice d) {
  NEED_INIT();
  if (d < 0 || d >= device_count()) return CUDA_ERROR_INVALID_DEVICE;
  --primary(d)->retained;
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext c) {
  NEED_INIT();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  t_stack.push_back((Ctx*)c);
  return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext* c) {
  NEED_INIT();
  if (t_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (c) *c = (CUcontext)t_stack.back();
  t_stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext* c) {
  NEED_INIT();
  *c = (CUcontext)current();
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext c) {
  NEED_INIT();
  if (!t_stack.empty()) t_stack.pop_back();
  if (c) t_stack.push_back((Ctx*)c);
  return CUDA_SUCCESS;
}

CUresult cuCtxDetach(CUcontext) { return CUDA_SUCCESS; }
CUresult cuCtxDestroy(CUcontext) { return CUDA_SUCCESS; }

CUresult cuCtxGetDevice(CUdevice* d) {
  NEED_CTX();
  *d = ctx->device;
  return CUDA_SUCCESS;
}

CUresult cuCtxGetApiVersion(CUcontext, unsigned int* v) {
  *v = 13000;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) {
  NEED_CTX();
  if (observe(ctx)) return ctx->sticky;
  return drained(ctx) ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;  // a held stream: would hang
}

// ------------------------------------------------------------------ memory

CUresult cuMemAlloc(CUdeviceptr* p, size_t bytes) {
  NEED_CTX();
  void* m = nullptr;
  if (posix_memalign(&m, 256, bytes ? bytes : 1) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *p = (CUdeviceptr)m;
  return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr p) {
  NEED_INIT();
  free((void*)p);
  return CUDA_SUCCESS;
}

CUresult cuMemAllocHost(void** p, size_t bytes) {
  NEED_CTX();
  return posix_memalign(p, 256, bytes ? bytes : 1) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned int) { return cuMemAllocHost(p, bytes); }

CUresult cuMemFreeHost(void* p) {
  free(p);
  return CUDA_SUCCESS;
}

CUresult cuMemGetInfo(size_t* free_bytes, size_t* total) {
  NEED_CTX();
  *free_bytes = (size_t)15 << 30;
  *total = (size_t)16 << 30;
  return CUDA_SUCCESS;
}

// Synchronous copies run after the null stream's work (and so the blocking streams').
static CUresult copy_sync(void* dst, const void* src, size_t n) {
  NEED_CTX();
  Stream* s = &ctx->null_stream;
  order_with_null_stream(ctx, s);
  Op op;
  op.kind = Op::COPY;
  op.dst = dst;
  op.src = src;
  op.bytes = n;
  s->queue.push_back(std::move(op));
  if (observe(ctx)) return ctx->sticky;
  return s->queue.empty() ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
}

CUresult cuMemcpyHtoD(CUdeviceptr d, const void* h, size_t n) { return copy_sync((void*)d, h, n); }
CUresult cuMemcpyDtoH(void* h, CUdeviceptr d, size_t n) { return copy_sync(h, (void*)d, n); }
CUresult cuMemcpyDtoD(CUdeviceptr a, CUdeviceptr b, size_t n) {
  return copy_sync((void*)a, (void*)b, n);
}

static CUresult copy_async(void* dst, const void* src, size_t n, CUstream h) {
  NEED_CTX();
  Stream* s = stream_of(ctx, h);
  order_with_null_stream(ctx, s);
  Op op;
  op.kind = Op::COPY;
  op.dst = dst;
  op.src = src;
  op.bytes = n;
  s->queue.push_back(std::move(op));
  pump(ctx);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr d, const void* h, size_t n, CUstream s) {
  return copy_async((void*)d, h, n, s);
}
CUresult cuMemcpyDtoHAsync(void* h, CUdeviceptr d, size_t n, CUstream s) {
  return copy_async(h, (void*)d, n, s);
}
CUresult cuMemcpyDtoDAsync(CUdeviceptr a, CUdeviceptr b, size_t n, CUstream s) {
  return copy_async((void*)a, (void*)b, n, s);
}

CUresult cuMemsetD8(CUdeviceptr d, unsigned char v, size_t n) {
  NEED_CTX();
  pump(ctx);
  memset((void*)d, v, n);
  return CUDA_SUCCESS;
}

CUresult cuMemsetD32(CUdeviceptr d, unsigned int v, size_t n) {
  NEED_CTX();
  pump(ctx);
  for (size_t k = 0; k < n; ++k) ((unsigned int*)d)[k] = v;
  return CUDA_SUCCESS;
}

// ------------------------------------------------------------------ modules, functions

static CUresult load_module(CUmodule* m, const void* image, unsigned n_opts, CUjit_option* opts,
                            void** vals) {
  NEED_CTX();
  int refuse = env_int("FAKE_CUDA_REFUSE_MODULES", 0);
  std::string log;
  CUresult rc = CUDA_SUCCESS;
  Module* mod = nullptr;
  if (refuse) {
    rc = (CUresult)refuse;
    log = "fake driver: refusing the module image (FAKE_CUDA_REFUSE_MODULES)";
  } else {
    size_t size;
    uint64_t h = image_hash(image, &size);
    const char* dir = getenv("FAKE_CUDA_MODULES");
    char path[4096];
    snprintf(path, sizeof path, "%s/%016llx.so", dir ? dir : ".", (unsigned long long)h);
    void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      rc = CUDA_ERROR_INVALID_IMAGE;
      log = std::string("fake driver: no emulator build of this image: ") + dlerror();
    } else {
      mod = new Module{handle, path};
      void* (*probe)(void) = (void* (*)(void))dlsym(handle, "lt_emu_tls_probe");
      if (lt_emu_module_tls(handle, path, probe, &mod->tls_lo, &mod->tls_size) != 0) {
        rc = CUDA_ERROR_INVALID_IMAGE;
        log = "fake driver: could not find the module's shared memory";
      }
    }
  }
  for (unsigned k = 0; k < n_opts; ++k) {  // the JIT's error log, as the real driver fills it
    if (opts[k] == CU_JIT_ERROR_LOG_BUFFER && rc != CUDA_SUCCESS) {
      size_t cap = 0;
      for (unsigned q = 0; q < n_opts; ++q)
        if (opts[q] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) cap = (size_t)(uintptr_t)vals[q];
      if (cap) snprintf((char*)vals[k], cap, "%s", log.c_str());
    }
  }
  if (rc != CUDA_SUCCESS) {
    if (getenv("FAKE_CUDA_VERBOSE")) fprintf(stderr, "%s\n", log.c_str());
    return rc;
  }
  *m = (CUmodule)mod;
  return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule* m, const void* image) {
  return load_module(m, image, 0, nullptr, nullptr);
}

CUresult cuModuleLoadDataEx(CUmodule* m, const void* image, unsigned n, CUjit_option* o,
                            void** v) {
  return load_module(m, image, n, o, v);
}

CUresult cuModuleUnload(CUmodule m) {
  NEED_INIT();
  delete (Module*)m;  // the library stays loaded: kernels may still sit in a queue
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
  NEED_CTX();
  Module* mod = (Module*)m;
  std::string sym = std::string("lt_emu_kernel_") + name;
  void* entry = dlsym(mod->handle, sym.c_str());
  void* size = dlsym(mod->handle, (sym + "_params").c_str());
  if (!entry || !size) return CUDA_ERROR_NOT_FOUND;
  *f = (CUfunction) new Func{mod, name, (void (*)(const char*))entry,
                             ((size_t(*)(void))size)()};
  return CUDA_SUCCESS;
}

CUresult cuModuleGetGlobal(CUdeviceptr* p, size_t* bytes, CUmodule m, const char* name) {
  NEED_CTX();
  Module* mod = (Module*)m;
  void* addr = dlsym(mod->handle, name);
  if (!addr) return CUDA_ERROR_NOT_FOUND;
  Dl_info info;
  const ElfW(Sym)* sym = nullptr;
  if (!dladdr1(addr, &info, (void**)&sym, RTLD_DL_SYMENT) || !sym) return CUDA_ERROR_NOT_FOUND;
  if (p) *p = (CUdeviceptr)addr;
  if (bytes) *bytes = sym->st_size;
  return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int* out, CUfunction_attribute attr, CUfunction f) {
  NEED_CTX();
  Func* fn = (Func*)f;
  switch (attr) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *out = env_int("FAKE_CUDA_MAX_THREADS", 1024); break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *out = (int)fn->module->tls_size; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *out = env_int("FAKE_CUDA_NUM_REGS", 40); break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: *out = 90; break;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *out = 90; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *out = fn->max_dynamic_smem; break;
    default: *out = 0; break;
  }
  return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute attr, int value) {
  NEED_CTX();
  Func* fn = (Func*)f;
  if (attr == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
    if (value < 0 || value + fn->module->tls_size > LT_EMU_MAX_SMEM) return CUDA_ERROR_INVALID_VALUE;
    fn->max_dynamic_smem = value;
  }
  return CUDA_SUCCESS;
}

CUresult cuFuncSetCacheConfig(CUfunction, CUfunc_cache) { return CUDA_SUCCESS; }
// Deprecated, and still what pycuda's prepared calls make before cuLaunchKernel.
CUresult cuFuncSetBlockShape(CUfunction, int, int, int) { return CUDA_SUCCESS; }
CUresult cuFuncSetSharedSize(CUfunction, unsigned int) { return CUDA_SUCCESS; }

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned smem, CUstream h, void** params,
                        void** extra) {
  NEED_CTX();
  Func* fn = (Func*)f;
  const unsigned threads = bx * by * bz;
  if (!gx || !gy || !gz || !threads || threads > (unsigned)env_int("FAKE_CUDA_MAX_THREADS", 1024))
    return CUDA_ERROR_INVALID_VALUE;
  if (smem > (unsigned)fn->max_dynamic_smem) return CUDA_ERROR_INVALID_VALUE;
  Op op;
  op.kind = Op::LAUNCH;
  op.name = fn->name;
  op.entry = fn->entry;
  op.grid[0] = gx, op.grid[1] = gy, op.grid[2] = gz;
  op.block[0] = bx, op.block[1] = by, op.block[2] = bz;
  op.smem = smem;
  op.tls_lo = fn->module->tls_lo;
  op.tls_size = fn->module->tls_size;
  if (extra) {
    void* buf = nullptr;
    size_t size = 0;
    for (int k = 0; extra[k] != CU_LAUNCH_PARAM_END; k += 2) {
      if (extra[k] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = extra[k + 1];
      else if (extra[k] == CU_LAUNCH_PARAM_BUFFER_SIZE) size = *(size_t*)extra[k + 1];
      else return CUDA_ERROR_INVALID_VALUE;
    }
    if (!buf || size != fn->param_bytes) return CUDA_ERROR_INVALID_VALUE;
    op.params.assign((char*)buf, (char*)buf + size);
  } else if (params) {
    // kernelParams: one pointer per parameter; the emulator's entries take one buffer,
    // so only single-parameter kernels are accepted this way.
    op.params.assign((char*)params[0], (char*)params[0] + fn->param_bytes);
  } else if (fn->param_bytes) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Stream* s = stream_of(ctx, h);
  order_with_null_stream(ctx, s);
  char line[256];
  snprintf(line, sizeof line, "%s device=%d stream=%s grid=%u block=%u smem=%u\n",
           fn->name.c_str(), ctx->device,
           s == &ctx->null_stream ? "null" : std::to_string((uintptr_t)s).c_str(), gx * gy * gz,
           threads, smem);
  g_launch_log += line;
  s->queue.push_back(std::move(op));
  pump(ctx);
  return CUDA_SUCCESS;
}

// ------------------------------------------------------------------ streams, events

CUresult cuStreamCreate(CUstream* h, unsigned int flags) {
  NEED_CTX();
  Stream* s = new Stream{ctx, flags, {}, 0};
  ctx->streams.push_back(s);
  *h = (CUstream)s;
  return CUDA_SUCCESS;
}

CUresult cuStreamCreateWithPriority(CUstream* h, unsigned int flags, int) {
  return cuStreamCreate(h, flags);
}

CUresult cuStreamDestroy(CUstream h) {
  NEED_INIT();
  Stream* s = (Stream*)h;
  Ctx* ctx = s->ctx;
  pump(ctx);
  for (size_t k = 0; k < ctx->streams.size(); ++k)
    if (ctx->streams[k] == s) ctx->streams.erase(ctx->streams.begin() + k);
  delete s;
  return CUDA_SUCCESS;
}

CUresult cuStreamGetFlags(CUstream h, unsigned int* flags) {
  NEED_CTX();
  *flags = stream_of(ctx, h)->flags;
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream h) {
  NEED_CTX();
  if (observe(ctx)) return ctx->sticky;
  return stream_of(ctx, h)->queue.empty() ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
}

CUresult cuStreamQuery(CUstream h) {
  NEED_CTX();
  if (observe(ctx)) return ctx->sticky;
  return stream_of(ctx, h)->queue.empty() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuStreamWaitEvent(CUstream h, CUevent e, unsigned int) {
  NEED_CTX();
  enqueue_wait(stream_of(ctx, h), (Event*)e);
  pump(ctx);
  return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream, CUstreamCaptureStatus* status) {
  NEED_CTX();
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent* e, unsigned int) {
  NEED_CTX();
  *e = (CUevent)new_event(ctx);
  return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent) {
  NEED_INIT();  // kept: a queued wait may still name it (tests only)
  return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent e, CUstream h) {
  NEED_CTX();
  Stream* s = stream_of(ctx, h);
  order_with_null_stream(ctx, s);
  enqueue_record(s, (Event*)e);
  pump(ctx);
  return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent e) {
  NEED_INIT();
  Event* ev = (Event*)e;
  if (observe(ev->ctx)) return ev->ctx->sticky;
  return ev->reached >= ev->recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent e) {
  NEED_INIT();
  Event* ev = (Event*)e;
  if (observe(ev->ctx)) return ev->ctx->sticky;
  return ev->reached >= ev->recorded ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
}

CUresult cuEventElapsedTime(float* ms, CUevent, CUevent) {
  *ms = 0.0f;
  return CUDA_SUCCESS;
}

// ------------------------------------------------------------------ for the tests

// Holds stream h at this point of its queue until fake_cuda_stream_release: the work
// queued after it waits, as if the GPU were still busy with what came before.
int fake_cuda_stream_hold(CUstream h) {
  Ctx* ctx = current();
  if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
  Stream* s = stream_of(ctx, h);
  Op op;
  op.kind = Op::HOLD;
  op.hold = 1;
  s->queue.push_back(std::move(op));
  return 0;
}

int fake_cuda_stream_release(CUstream h) {
  Ctx* ctx = current();
  if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
  Stream* s = stream_of(ctx, h);
  for (Op& op : s->queue)
    if (op.kind == Op::HOLD && op.hold) {
      op.hold = 0;
      break;
    }
  pump(ctx);
  return 0;
}

int64_t fake_cuda_launch_count(int device) {
  return device < (int)g_ctx.size() ? g_ctx[device]->launches : 0;
}

int64_t fake_cuda_launch_log(char* out, int64_t size) {
  if (out && size > 0) snprintf(out, (size_t)size, "%s", g_launch_log.c_str());
  return (int64_t)g_launch_log.size();
}

void fake_cuda_clear_launch_log(void) { g_launch_log.clear(); }

int64_t fake_cuda_context_depth(void) { return (int64_t)t_stack.size(); }

int64_t fake_cuda_failures(char* out, int64_t size) { return lt_emu_failures(out, size); }
int64_t fake_cuda_failure_count(void) { return lt_emu_failure_count(); }
void fake_cuda_clear_failures(void) { lt_emu_clear_failures(); }

// Forget a fault: a fresh process in the real world.
void fake_cuda_reset(void) {
  for (auto& c : g_ctx) {
    c->sticky = CUDA_SUCCESS;
    c->pending = CUDA_SUCCESS;
    c->null_stream.queue.clear();
    for (Stream* s : c->streams) s->queue.clear();
  }
}

}  // extern "C"
