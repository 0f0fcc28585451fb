// Do not include directly; not a stable API (internal to percpu).
//
// Other architectures: percpu does not know their rseq signature, so it never
// registers rseq there and every query takes the fallback (vDSO or syscall).
// The fast path reads a per-thread word that always holds -1.
#pragma once

#if !defined(PERCPU_INTERNAL_THREAD_POINTER_DISPATCH)
#error "include percpu/internal/thread_pointer.hpp, not this arch file"
#endif

#include <cstdint>

namespace percpu {
namespace internal {

inline char* thread_pointer() noexcept { return static_cast<char*>(__builtin_thread_pointer()); }

inline std::int32_t load_tp_relative_i32(std::intptr_t offset) noexcept {
  return *reinterpret_cast<volatile const std::int32_t*>(thread_pointer() + offset);
}

// No RDPID on this architecture; never called.
inline unsigned rdpid_tsc_aux() noexcept { return 0; }

}  // namespace internal
}  // namespace percpu
