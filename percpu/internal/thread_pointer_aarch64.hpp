// aarch64: the thread pointer is TPIDR_EL0.
#pragma once

#include <cstdint>

namespace percpu {
namespace internal {

constexpr bool kArchHasRseq = true;

inline char* thread_pointer() noexcept {
  char* tp;
  asm("mrs %0, tpidr_el0" : "=r"(tp));
  return tp;
}

// Two instructions: mrs tpidr_el0, then ldr w, [tp, offset]. The mrs is not
// volatile (the thread pointer never changes under a thread); the load is.
inline std::int32_t load_tp_relative_i32(std::intptr_t offset) noexcept {
  std::int32_t value;
  asm volatile("ldr %w0, [%1, %2]" : "=r"(value) : "r"(thread_pointer()), "r"(offset));
  return value;
}

// No RDPID on this architecture; never called.
constexpr bool kArchHasRdpid = false;
inline unsigned rdpid_tsc_aux() noexcept { return 0; }

}  // namespace internal
}  // namespace percpu
