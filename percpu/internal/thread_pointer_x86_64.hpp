// x86-64: the thread pointer is the %fs base; glibc and musl keep a pointer
// to it at %fs:0, so a segment-relative load reaches any static-TLS offset.
#pragma once

#include <cstdint>

namespace percpu {
namespace internal {

constexpr bool kArchHasRseq = true;

inline char* thread_pointer() noexcept {
  char* tp;
  asm("movq %%fs:0, %0" : "=r"(tp));
  return tp;
}

// One instruction: movl %fs:(offset), reg. volatile keeps one load per call.
inline std::int32_t load_tp_relative_i32(std::intptr_t offset) noexcept {
  std::int32_t value;
  asm volatile("movl %%fs:(%1), %0" : "=r"(value) : "r"(offset));
  return value;
}

}  // namespace internal
}  // namespace percpu
