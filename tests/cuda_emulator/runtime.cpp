// The CUDA execution model on the host: one fiber per CUDA thread, a block at a time.
//
// A launch runs each block of the grid with blockDim fibers (ucontext). A fiber runs
// until it reaches __syncthreads() (or a warp rendezvous) and then yields; when every
// live fiber of the block waits at the same barrier, they all continue. Threads waiting
// at different barriers, or exiting while others wait, are barrier divergence.
//
// Race detection: the kernel is compiled with -fsanitize=thread, which turns every load
// and store into a call to __tsan_readN / __tsan_writeN (defined here, no sanitizer
// runtime). Shared memory (the dynamic buffer lt_smem and the kernel module's
// thread-local storage, where block-scope __shared__ arrays live) has a shadow word per
// 4 bytes: a write and another access by a different thread between the same two
// barriers is a race. Global memory written in a launch is remembered: a read or write
// of it by another block, or by another thread of the block between the same barriers,
// is a race too. Accesses to a fiber's own stack are private and not tracked.
#include <dlfcn.h>
#include <link.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "runtime.h"

struct lt_emu_dim3 {
  unsigned int x, y, z;
};
thread_local lt_emu_dim3 threadIdx, blockIdx, blockDim, gridDim;
// The dynamic shared memory of the block running on this OS thread.
thread_local unsigned char lt_smem[LT_EMU_MAX_SMEM] __attribute__((aligned(128)));

namespace {

const size_t STACK_BYTES = 1 << 20;  // per fiber; touched pages only
enum State { READY, AT_BARRIER, AT_WARP, DONE };

struct Fiber {
  ucontext_t ctx;
  char* stack = nullptr;
  State state = READY;
  const char* file = "";
  int line = 0;
  lt_emu_dim3 idx;
  uint64_t value = 0;  // warp exchange: this lane's value, then the result
  int src = 0;
};

struct Shadow {  // one 4-byte word of shared memory
  uint32_t epoch;
  int32_t writer;
  int32_t reader;  // first reader this epoch; -2: several
};

struct GlobalWrite {
  int64_t block;
  int32_t thread;
  uint32_t epoch;
};

struct Block {
  std::vector<Fiber> fibers;
  ucontext_t sched;
  int current = -1;
  int nthreads = 0;
  bool checking = false;
  bool aborted = false;
  int64_t linear = 0;
  void (*entry)(const char*) = nullptr;
  const char* params = nullptr;
  // shared memory ranges and their shadow
  uintptr_t dyn_lo = 0, dyn_hi = 0, tls_lo = 0, tls_hi = 0;
  std::vector<Shadow> dyn_shadow, tls_shadow;
  uint32_t epoch = 1;
};

thread_local Block* g_block = nullptr;
std::unordered_map<uintptr_t, GlobalWrite> g_writes;  // word address -> last writer
uint32_t g_epoch = 1;  // grows at every barrier of every block
std::vector<std::string> g_failures;
int64_t g_failure_count = 0;
const char* g_kernel = "";
int g_check_all = -1;

void failure(const char* fmt, ...) {
  ++g_failure_count;
  if (g_failures.size() >= 20) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  g_failures.push_back(std::string("kernel ") + g_kernel + ": " + buf);
}

void fiber_main(unsigned lo, unsigned hi) {
  Block* b = g_block;
  (void)lo;
  (void)hi;
  b->entry(b->params);
  Fiber& f = b->fibers[b->current];
  f.state = DONE;
  swapcontext(&f.ctx, &b->sched);
}

void yield_to_scheduler() {
  Block* b = g_block;
  Fiber& f = b->fibers[b->current];
  swapcontext(&f.ctx, &b->sched);
}

void run_fiber(Block* b, int t) {
  b->current = t;
  threadIdx = b->fibers[t].idx;
  swapcontext(&b->sched, &b->fibers[t].ctx);
  b->current = -1;
}

std::string thread_list(const std::vector<int>& ts) {
  std::string s;
  for (size_t k = 0; k < ts.size() && k < 6; ++k) s += (k ? "," : "") + std::to_string(ts[k]);
  if (ts.size() > 6) s += ",... (" + std::to_string(ts.size()) + " threads)";
  return s;
}

// Resolve a round where no fiber can run: release a barrier, finish the warps' exchanges,
// or report divergence. Returns false when the block must stop.
bool settle(Block* b) {
  std::vector<int> waiting, done, warp;
  for (int t = 0; t < b->nthreads; ++t) {
    State s = b->fibers[t].state;
    if (s == AT_BARRIER) waiting.push_back(t);
    else if (s == DONE) done.push_back(t);
    else if (s == AT_WARP) warp.push_back(t);
  }
  if (!warp.empty()) {
    // every live lane of each warp must be at the same rendezvous
    for (int w0 = 0; w0 < b->nthreads; w0 += 32) {
      int w1 = std::min(b->nthreads, w0 + 32);
      std::vector<int> in, out;
      for (int t = w0; t < w1; ++t) (b->fibers[t].state == AT_WARP ? in : out).push_back(t);
      if (in.empty()) continue;
      for (int t : in) {
        Fiber& f = b->fibers[t];
        if (f.line != b->fibers[in[0]].line || f.file != b->fibers[in[0]].file) {
          failure("block %lld: warp divergence: lanes wait at %s:%d and %s:%d",
                  (long long)b->linear, f.file, f.line, b->fibers[in[0]].file,
                  b->fibers[in[0]].line);
          return false;
        }
      }
      if (!out.empty()) {
        failure("block %lld: warp divergence: threads %s are not at the warp operation at "
                "%s:%d", (long long)b->linear, thread_list(out).c_str(),
                b->fibers[in[0]].file, b->fibers[in[0]].line);
        return false;
      }
      std::vector<uint64_t> vals(w1 - w0);
      for (int t = w0; t < w1; ++t) vals[t - w0] = b->fibers[t].value;
      for (int t = w0; t < w1; ++t) {
        Fiber& f = b->fibers[t];
        if (f.src == -1) {  // ballot
          uint64_t bits = 0;
          for (int k = 0; k < w1 - w0; ++k) bits |= (uint64_t)(vals[k] != 0) << k;
          f.value = bits;
        } else if (f.src >= 0 && f.src < w1 - w0) {
          f.value = vals[f.src];
        }  // else: out of range, the lane keeps its own value
        f.state = READY;
      }
    }
    ++g_epoch;
    b->epoch = g_epoch;
    return true;
  }
  if (waiting.empty()) return true;
  const Fiber& first = b->fibers[waiting[0]];
  for (int t : waiting) {
    const Fiber& f = b->fibers[t];
    if (f.line != first.line || strcmp(f.file, first.file) != 0) {
      failure("block %lld: barrier divergence: thread %d waits at __syncthreads() %s:%d, "
              "thread %d at %s:%d", (long long)b->linear, waiting[0], first.file, first.line,
              t, f.file, f.line);
      return false;
    }
  }
  if (!done.empty()) {
    failure("block %lld: barrier divergence: threads %s exited while threads %s wait at "
            "__syncthreads() %s:%d", (long long)b->linear, thread_list(done).c_str(),
            thread_list(waiting).c_str(), first.file, first.line);
    return false;
  }
  for (int t : waiting) b->fibers[t].state = READY;
  ++g_epoch;
  b->epoch = g_epoch;
  return true;
}

bool checking_block(int64_t linear, int64_t grid) {
  if (g_check_all < 0) {
    const char* e = getenv("FAKE_CUDA_CHECK_ALL");
    g_check_all = e && *e && *e != '0';
  }
  return g_check_all || linear < 4 || linear >= grid - 2;
}

// ---------------------------------------------------------------- access tracking

inline bool on_own_stack(Block* b, uintptr_t a) {
  const Fiber& f = b->fibers[b->current];
  return a >= (uintptr_t)f.stack && a < (uintptr_t)f.stack + STACK_BYTES;
}

void shared_access(Block* b, Shadow* sh, uintptr_t base, uintptr_t a, size_t n, bool write,
                   const char* where) {
  const int t = b->current;
  for (uintptr_t w = (a - base) >> 2; w <= (a + n - 1 - base) >> 2; ++w) {
    Shadow& s = sh[w];
    if (s.epoch != b->epoch) s = Shadow{b->epoch, -1, -1};
    bool race = false;
    char other[64] = "";
    if (s.writer >= 0 && s.writer != t) {
      race = true;
      snprintf(other, sizeof other, "thread %d wrote it", s.writer);
    } else if (write && (s.reader == -2 || (s.reader >= 0 && s.reader != t))) {
      race = true;
      if (s.reader >= 0) snprintf(other, sizeof other, "thread %d read it", s.reader);
      else snprintf(other, sizeof other, "other threads read it");
    }
    if (race) {
      failure("block %lld: shared-memory race on %s+%zu: thread %d %s it and %s, between "
              "the same two barriers", (long long)b->linear, where, (size_t)(w * 4), t,
              write ? "writes" : "reads", other);
      s.writer = -3;  // report a word once per epoch
      s.reader = -2;
      continue;
    }
    if (write) {
      if (s.writer != -3) s.writer = t;
    } else if (s.reader == -1) {
      s.reader = t;
    } else if (s.reader != t) {
      s.reader = -2;
    }
  }
}

void global_access(Block* b, uintptr_t a, size_t n, bool write) {
  const int t = b->current;
  for (uintptr_t w = a & ~(uintptr_t)3; w < a + n; w += 4) {
    auto it = g_writes.find(w);
    if (it == g_writes.end()) {
      if (write) g_writes.emplace(w, GlobalWrite{b->linear, t, b->epoch});
      continue;
    }
    GlobalWrite& gw = it->second;
    if (gw.block != b->linear) {
      failure("global-memory race at %p: block %lld thread %d %s what block %lld thread %d "
              "wrote in the same launch", (void*)w, (long long)b->linear, t,
              write ? "writes" : "reads", (long long)gw.block, gw.thread);
      gw = GlobalWrite{b->linear, t, b->epoch};
    } else if (gw.thread != t && gw.epoch == b->epoch) {
      failure("global-memory race at %p in block %lld: thread %d %s what thread %d wrote "
              "between the same two barriers", (void*)w, (long long)b->linear, t,
              write ? "writes" : "reads", gw.thread);
      gw = GlobalWrite{b->linear, t, b->epoch};
    } else if (write) {
      gw = GlobalWrite{b->linear, t, b->epoch};
    }
  }
}

inline void access(void* p, size_t n, bool write) {
  Block* b = g_block;
  if (!b || !b->checking || b->current < 0) return;
  const uintptr_t a = (uintptr_t)p;
  if (on_own_stack(b, a)) return;
  if (a >= b->dyn_lo && a < b->dyn_hi) {
    shared_access(b, b->dyn_shadow.data(), b->dyn_lo, a, n, write, "lt_smem");
  } else if (a >= b->tls_lo && a < b->tls_hi) {
    shared_access(b, b->tls_shadow.data(), b->tls_lo, a, n, write, "__shared__");
  } else {
    global_access(b, a, n, write);
  }
}

}  // namespace

// ---------------------------------------------------------------- the kernel's calls

extern "C" void lt_emu_syncthreads(const char* file, int line) {
  Block* b = g_block;
  Fiber& f = b->fibers[b->current];
  f.state = AT_BARRIER;
  f.file = file;
  f.line = line;
  yield_to_scheduler();
}

extern "C" void lt_emu_syncwarp(unsigned, const char* file, int line) {
  Block* b = g_block;
  Fiber& f = b->fibers[b->current];
  f.state = AT_WARP;
  f.file = file;
  f.line = line;
  f.src = -2;  // no data
  yield_to_scheduler();
}

extern "C" uint64_t lt_emu_warp_exchange(uint64_t value, int src, const char* file, int line) {
  Block* b = g_block;
  Fiber& f = b->fibers[b->current];
  f.state = AT_WARP;
  f.file = file;
  f.line = line;
  f.value = value;
  f.src = src < 0 || src > 31 ? -3 : src;
  yield_to_scheduler();
  return f.value;
}

extern "C" unsigned lt_emu_warp_ballot(int pred, const char* file, int line) {
  Block* b = g_block;
  Fiber& f = b->fibers[b->current];
  f.state = AT_WARP;
  f.file = file;
  f.line = line;
  f.value = pred != 0;
  f.src = -1;
  yield_to_scheduler();
  return (unsigned)f.value;
}

extern "C" void lt_emu_trap(const char* file, int line) {
  failure("__trap() at %s:%d (thread %d of block %lld)", file, line, g_block->current,
          (long long)g_block->linear);
  g_block->aborted = true;
  Fiber& f = g_block->fibers[g_block->current];
  f.state = DONE;
  yield_to_scheduler();
}

#define LT_TSAN_RW(N)                                                             \
  extern "C" void __tsan_read##N(void* p) { access(p, N, false); }              \
  extern "C" void __tsan_write##N(void* p) { access(p, N, true); }              \
  extern "C" void __tsan_unaligned_read##N(void* p) { access(p, N, false); }    \
  extern "C" void __tsan_unaligned_write##N(void* p) { access(p, N, true); }    \
  extern "C" void __tsan_volatile_read##N(void* p) { access(p, N, false); }     \
  extern "C" void __tsan_volatile_write##N(void* p) { access(p, N, true); }
LT_TSAN_RW(1)
LT_TSAN_RW(2)
LT_TSAN_RW(4)
LT_TSAN_RW(8)
LT_TSAN_RW(16)
extern "C" void __tsan_read_range(void* p, size_t n) { access(p, n, false); }
extern "C" void __tsan_write_range(void* p, size_t n) { access(p, n, true); }
extern "C" void __tsan_init(void) {}
extern "C" void __tsan_func_entry(void*) {}
extern "C" void __tsan_func_exit(void) {}
extern "C" void __tsan_vptr_update(void**, void*) {}
extern "C" void __tsan_vptr_read(void**) {}
extern "C" void* __tsan_memcpy(void* d, const void* s, size_t n) {
  access((void*)s, n, false);
  access(d, n, true);
  return memcpy(d, s, n);
}
extern "C" void* __tsan_memmove(void* d, const void* s, size_t n) {
  access((void*)s, n, false);
  access(d, n, true);
  return memmove(d, s, n);
}
extern "C" void* __tsan_memset(void* d, int c, size_t n) {
  access(d, n, true);
  return memset(d, c, n);
}

// ---------------------------------------------------------------- launches

extern "C" int lt_emu_launch(void (*entry)(const char*), const char* params, const char* name,
                             const unsigned grid[3], const unsigned block[3], size_t smem,
                             uintptr_t tls_lo, size_t tls_size) {
  g_kernel = name;
  const int n = (int)(block[0] * block[1] * block[2]);
  if (n <= 0 || n > 1024 || smem > LT_EMU_MAX_SMEM) return 1;
  Block b;
  b.nthreads = n;
  b.entry = entry;
  b.params = params;
  b.fibers.resize(n);
  for (Fiber& f : b.fibers) {
    void* s = mmap(nullptr, STACK_BYTES, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (s == MAP_FAILED) return 2;
    f.stack = (char*)s;
  }
  b.dyn_lo = (uintptr_t)lt_smem;
  b.dyn_hi = b.dyn_lo + smem;
  b.tls_lo = tls_lo;
  b.tls_hi = tls_lo + tls_size;
  b.dyn_shadow.resize((smem + 3) / 4 + 1);
  b.tls_shadow.resize((tls_size + 3) / 4 + 1);
  g_writes.clear();
  Block* saved = g_block;
  g_block = &b;
  gridDim = {grid[0], grid[1], grid[2]};
  blockDim = {block[0], block[1], block[2]};
  const int64_t nblocks = (int64_t)grid[0] * grid[1] * grid[2];
  for (int64_t lin = 0; lin < nblocks && !b.aborted; ++lin) {
    blockIdx = {(unsigned)(lin % grid[0]), (unsigned)(lin / grid[0] % grid[1]),
                (unsigned)(lin / ((int64_t)grid[0] * grid[1]))};
    b.linear = lin;
    b.checking = checking_block(lin, nblocks);
    ++g_epoch;
    b.epoch = g_epoch;
    for (int t = 0; t < n; ++t) {
      Fiber& f = b.fibers[t];
      f.state = READY;
      f.idx = {(unsigned)(t % block[0]), (unsigned)(t / block[0] % block[1]),
               (unsigned)(t / (block[0] * block[1]))};
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack;
      f.ctx.uc_stack.ss_size = STACK_BYTES;
      f.ctx.uc_link = nullptr;
      makecontext(&f.ctx, (void (*)())fiber_main, 2, 0u, 0u);
    }
    for (;;) {
      bool ran = false, live = false;
      for (int t = 0; t < n; ++t) {
        if (b.fibers[t].state == READY) {
          run_fiber(&b, t);
          ran = true;
        }
        if (b.aborted) break;
      }
      if (b.aborted) break;
      for (int t = 0; t < n; ++t) live |= b.fibers[t].state != DONE;
      if (!live) break;
      if (!settle(&b)) {
        b.aborted = true;
        break;
      }
      (void)ran;
    }
  }
  g_block = saved;
  for (Fiber& f : b.fibers) munmap(f.stack, STACK_BYTES);
  g_writes.clear();
  return b.aborted ? 3 : 0;
}

extern "C" int64_t lt_emu_failure_count(void) { return g_failure_count; }

extern "C" int64_t lt_emu_failures(char* out, int64_t size) {
  std::string all;
  for (const std::string& s : g_failures) all += s + "\n";
  if (g_failure_count > (int64_t)g_failures.size())
    all += "... and " + std::to_string(g_failure_count - g_failures.size()) + " more\n";
  if (out && size > 0) snprintf(out, (size_t)size, "%s", all.c_str());
  return (int64_t)all.size();
}

extern "C" void lt_emu_clear_failures(void) {
  g_failures.clear();
  g_failure_count = 0;
}

// The thread-local storage block of a loaded module on this OS thread: where its
// block-scope __shared__ arrays live. `probe` is a function of the module that touches
// its TLS (so that the block exists).
struct TlsQuery {
  const char* path;
  size_t size;
};

static int find_tls(struct dl_phdr_info* info, size_t, void* data) {
  TlsQuery* q = (TlsQuery*)data;
  if (!info->dlpi_name || strcmp(info->dlpi_name, q->path) != 0) return 0;
  for (int k = 0; k < info->dlpi_phnum; ++k)
    if (info->dlpi_phdr[k].p_type == PT_TLS) q->size = info->dlpi_phdr[k].p_memsz;
  return 1;
}

extern "C" int lt_emu_module_tls(void* handle, const char* path, void* (*probe)(void),
                                 uintptr_t* lo, size_t* size) {
  *lo = 0;
  *size = 0;
  TlsQuery q{path, 0};
  dl_iterate_phdr(find_tls, &q);
  if (q.size == 0) return 0;
  if (probe) probe();
  void* data = nullptr;
  if (dlinfo(handle, RTLD_DI_TLS_DATA, &data) != 0 || !data) return 1;
  *lo = (uintptr_t)data;
  *size = q.size;
  return 0;
}
