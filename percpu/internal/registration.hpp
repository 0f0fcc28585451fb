// Process-wide rseq state behind percpu/cpu.hpp, and the seams tests use.
//
// Thread-safe and async-signal-safe throughout, except force_backend(), which
// is a test seam: call it while no other thread uses percpu.
#pragma once

#include <atomic>

#include "percpu/cpu.hpp"
#include "percpu/internal/rseq_abi.hpp"

namespace percpu {
namespace internal {

// Runs percpu's start-up if its constructor has not run yet (code that runs
// before it: other libraries' constructors, an allocator called during
// start-up). False only while another caller is in the middle of it; the
// caller then answers from the system call. The inline fast paths do not
// check this: before start-up they must not be used.
constexpr int kInitNotStarted = 0, kInitRunning = 1, kInitDone = 2;
extern std::atomic<int> g_init_state;
bool initialize_now() noexcept;
inline bool ensure_initialized() noexcept {
  if (__builtin_expect(g_init_state.load(std::memory_order_acquire) == kInitDone, 1)) return true;
  return initialize_now();
}

// The calling thread's serving rseq area if the kernel keeps it current (the
// thread is registered, by glibc or by percpu), registering it first if due;
// nullptr when this thread runs on a fallback. Critical sections use it.
rseq_area* registered_rseq_area() noexcept;

// The area the fast path of the calling thread reads, registered or not.
inline rseq_area* serving_rseq_area() noexcept {
  return reinterpret_cast<rseq_area*>(thread_pointer() + g_fast_path.area);
}

// Test seam: serve every thread from `backend` from now on. For rseq this
// restores the natural registration; for a fallback, the fast path is sent to
// a never-registered area. Returns false (and changes nothing) when
// `backend` is unavailable in this process.
bool force_backend(cpu_backend backend) noexcept;

// The fallback query behind cpu_id() when rseq is unavailable: the chosen
// fallback, then the system call. 0 or an errno value.
int query_fallback(unsigned* cpu, unsigned* node) noexcept;

// Why rseq is unavailable to the calling thread (an errno value), or 0.
int rseq_registration_error() noexcept;

}  // namespace internal
}  // namespace percpu
