// Do not include directly; not a stable API (internal to percpu).
//
// aarch64: the thread pointer is TPIDR_EL0.
#pragma once

#if !defined(PERCPU_INTERNAL_THREAD_POINTER_DISPATCH)
#error "include percpu/internal/thread_pointer.hpp, not this arch file"
#endif

#if defined(__AARCH64EB__)
// The kernel reads the 4 bytes before an abort handler as a data word in the
// CPU's byte order, while instructions are always stored little-endian: a
// big-endian build would need a byte-swapped signature. Refused rather than
// built untested.
#error "percpu: big-endian aarch64 is not supported"
#endif

#include <cstdint>

namespace percpu {
namespace internal {

// volatile: a thread pointer read is never merged with an earlier one. The
// compiler sees no change of thread inside a function, but a coroutine that
// suspends and is resumed elsewhere, or a fiber switch, continues the same
// function on another thread; a reused value would aim that thread's
// critical sections at the first thread's rseq area.
inline char* thread_pointer() noexcept {
  char* tp;
  asm volatile("mrs %0, tpidr_el0" : "=r"(tp));
  return tp;
}

// Two instructions: mrs tpidr_el0, then ldr w, [tp, offset], both volatile.
inline std::int32_t load_tp_relative_i32(std::intptr_t offset) noexcept {
  std::int32_t value;
  asm volatile("ldr %w0, [%1, %2]" : "=r"(value) : "r"(thread_pointer()), "r"(offset));
  return value;
}

// No RDPID on this architecture; never called.
inline unsigned rdpid_tsc_aux() noexcept { return 0; }

}  // namespace internal
}  // namespace percpu
