// The emulator's interface to the fake driver (driver.cpp).
#pragma once
#include <stddef.h>
#include <stdint.h>

#define LT_EMU_MAX_SMEM 232448  // bytes of dynamic shared memory a block may ask for (sm_90)

extern "C" {
// Run a kernel over the grid; entry(params) is the kernel called with its parameter
// buffer. Returns 0, or non-zero when the launch was stopped (divergence, __trap).
int lt_emu_launch(void (*entry)(const char*), const char* params, const char* name,
                  const unsigned grid[3], const unsigned block[3], size_t smem,
                  uintptr_t tls_lo, size_t tls_size);
int lt_emu_module_tls(void* handle, const char* path, void* (*probe)(void), uintptr_t* lo,
                      size_t* size);
int64_t lt_emu_failure_count(void);
int64_t lt_emu_failures(char* out, int64_t size);
void lt_emu_clear_failures(void);
}
