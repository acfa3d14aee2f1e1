// Entry points of an emulated module: lt_emu_kernel_<name>(params) calls the kernel with
// its arguments read from a CUDA parameter buffer (each argument at the next offset
// aligned for its type, as cuLaunchKernel lays them out); lt_emu_kernel_<name>_params()
// is that buffer's size.
#pragma once
#include <stddef.h>

#include <type_traits>
#include <utility>

template <class T>
using lt_emu_plain = typename std::decay<T>::type;

template <class... A>
struct LtEmuLayout {
  size_t offs[sizeof...(A) + 1];
  size_t total;
  LtEmuLayout() {
    const size_t align[] = {alignof(lt_emu_plain<A>)..., 1};
    const size_t size[] = {sizeof(lt_emu_plain<A>)..., 0};
    size_t o = 0;
    for (size_t k = 0; k < sizeof...(A); ++k) {
      o = (o + align[k] - 1) / align[k] * align[k];
      offs[k] = o;
      o += size[k];
    }
    total = o;
  }
};

template <class... A, size_t... I>
static void lt_emu_call(void (*f)(A...), const char* buf, std::index_sequence<I...>) {
  const LtEmuLayout<A...> layout;  // on the fiber's stack: a static would be shared data
  f(*reinterpret_cast<const lt_emu_plain<A>*>(buf + layout.offs[I])...);
}

template <class... A>
static void lt_emu_invoke(void (*f)(A...), const char* buf) {
  lt_emu_call(f, buf, std::index_sequence_for<A...>{});
}

template <class... A>
static size_t lt_emu_param_bytes(void (*)(A...)) {
  return LtEmuLayout<A...>().total;
}

#define LT_EMU_KERNEL(name)                                                              \
  extern "C" void lt_emu_kernel_##name(const char* buf) { lt_emu_invoke(&name, buf); } \
  extern "C" size_t lt_emu_kernel_##name##_params(void) { return lt_emu_param_bytes(&name); }

// Touches the module's thread-local storage, so that its block (where block-scope
// __shared__ arrays live) exists on the calling thread.
extern "C" void* lt_emu_tls_probe(void) {
  static thread_local char probe;
  return &probe;
}
