// Do not include directly; not a stable API (internal to percpu).
//
// x86-64: the thread pointer is the %fs base; glibc and musl keep a pointer
// to it at %fs:0, so a segment-relative load reaches any static-TLS offset.
#pragma once

#if !defined(PERCPU_INTERNAL_THREAD_POINTER_DISPATCH)
#error "include percpu/internal/thread_pointer.hpp, not this arch file"
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
  asm volatile("movq %%fs:0, %0" : "=r"(tp));
  return tp;
}

// One instruction: movl %fs:(offset), reg. volatile keeps one load per call.
inline std::int32_t load_tp_relative_i32(std::intptr_t offset) noexcept {
  std::int32_t value;
  asm volatile("movl %%fs:(%1), %0" : "=r"(value) : "r"(offset));
  return value;
}

// RDPID: IA32_TSC_AUX, which Linux sets to (node << 12) | cpu on each CPU.
// Only valid where percpu checked that the CPU has it and that it agrees with
// the kernel. Spelled in bytes for assemblers that predate the mnemonic.
inline unsigned rdpid_tsc_aux() noexcept {
  unsigned long value;
  asm volatile(".byte 0xf3, 0x0f, 0xc7, 0xf8" : "=a"(value));  // rdpid %rax
  return static_cast<unsigned>(value);
}

}  // namespace internal
}  // namespace percpu
